package pgryw

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgryw/pgryw/internal/wire"
)

// A write's position, read after the write has returned.
//
// The capture riding behind a statement on the primary is answered after
// the statement's own ReadyForQuery, which the server flushes first: waiting
// for it would add the capture's execution and a second packet to every
// write. So when a statement succeeded and the capture's answer is not in
// yet, the statement returns at once and the capture stays pending until
// something needs it, which settles it first:
//
//   - the connection's own next statement: pgx's read of its answer takes
//     the capture's answer off the socket first (the wire layer strips
//     it), and it is applied then, at no cost; a replica read, which needs
//     the position before it is sent, waits for it; Close waits a moment;
//   - a read on any connection of the pool that answers to the pool's
//     watermark (session_scope=db), and a read or a Token of the Session the
//     write was made with: they settle every capture of a possible commit
//     pending for them, reading the writing connection's socket if need be
//     (wire.Await runs beside pgx's use of it).
//
// A capture that cannot be settled (the connection broke) counts as a lost
// position, as before: the next read that needs it captures a fresh one.
// Only a statement that succeeded is deferred, and only when no other
// answer of pgryw's rides behind it; everything else settles at once.

// pendingCapture is a capture whose answer had not arrived when its
// statement returned, or one sent on its own ahead of a read
// (Conn.captureOwed).
type pendingCapture struct {
	mu      sync.Mutex
	cn      *Conn
	b       *backend
	inj     *wire.Injection
	wrote   bool     // a possible commit: it advances the shared watermarks
	seen    lostSeen // lost counts before it was sent
	at      int64    // when the possible commit's answer was in, unix ns (pace.go); 0 for a statement that wrote nothing
	cs      *Session // the statement's context's Session, if any
	db      bool     // registered with the connector (session_scope=db)
	settled bool
	// One goroutine at a time reads the answer (awaiting); the others wait
	// for done (closed once settled) or for turn (closed, and replaced,
	// when the one reading gave up at its deadline), each within its own
	// context.
	awaiting bool
	done     chan struct{}
	turn     chan struct{}
}

// pendingSet is the captures of possible commits that reads elsewhere may
// need: the connector's (for the pool's watermark) and a Session's.
type pendingSet struct {
	mu   sync.Mutex
	list []*pendingCapture
	n    atomic.Int32 // len(list), read without the lock by every replica read
}

func (s *pendingSet) add(p *pendingCapture) {
	s.mu.Lock()
	s.list = append(s.list, p)
	s.n.Store(int32(len(s.list)))
	s.mu.Unlock()
}

func (s *pendingSet) remove(p *pendingCapture) {
	s.mu.Lock()
	for i, q := range s.list {
		if q == p {
			s.list = append(s.list[:i], s.list[i+1:]...)
			break
		}
	}
	s.n.Store(int32(len(s.list)))
	s.mu.Unlock()
}

// settle settles every capture in the set, within ctx.
func (s *pendingSet) settle(ctx context.Context) error { return s.settleBut(ctx, nil) }

// othersWait bounds how long a read waits for the answers to captures
// pending on other connections (the pool's, a Session's). They normally
// come within microseconds of their statements' ReadyForQuery; one that
// has not come by then (its bytes stalled, or its connection is dying
// unseen) is not waited for beyond it: the write it belongs to had
// returned, so a position read now on the reader's own connection covers
// it (settleOthers).
const othersWait = 50 * time.Millisecond

// settleOthers settles the set's captures but skip, each within ctx and
// othersWait. It returns those still on their way then: the caller reads a
// fresh position instead, which covers them, and retires them. An error
// is ctx's own.
func (s *pendingSet) settleOthers(ctx context.Context, skip *pendingCapture) (late []*pendingCapture, err error) {
	if s.n.Load() == 0 {
		return nil, nil
	}
	wctx, cancel := context.WithTimeout(ctx, othersWait)
	defer cancel()
	if err := s.settleBut(wctx, skip); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		s.mu.Lock()
		for _, p := range s.list {
			if p != skip {
				late = append(late, p)
			}
		}
		s.mu.Unlock()
		return late, nil
	}
	return nil, nil
}

// retire takes p, whose write a fresh position has covered in the pool's
// watermark (db) and in Session cs (nil: none), out of those sets that
// readers wait on; its connection still settles it for its own watermark.
func (p *pendingCapture) retire(db bool, cs *Session) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.settled {
		return
	}
	if p.db && db {
		p.cn.c.inflight.remove(p)
		p.db = false
	}
	if p.cs != nil && p.cs == cs {
		p.cs.inflight.remove(p)
		p.cs = nil
	}
	if !p.db && p.cs == nil {
		p.wrote = false // nothing else waits for it
	}
}

// settleBut settles every capture in the set but skip, within ctx.
func (s *pendingSet) settleBut(ctx context.Context, skip *pendingCapture) error {
	if s.n.Load() == 0 {
		return nil // the common case, without taking the pool-wide lock
	}
	s.mu.Lock()
	if len(s.list) == 0 {
		s.mu.Unlock()
		return nil
	}
	list := append([]*pendingCapture(nil), s.list...)
	s.mu.Unlock()
	for _, p := range list {
		if p == skip {
			continue
		}
		if err := p.settle(ctx); err != nil {
			return err
		}
	}
	return nil
}

// deferCapture reports whether the capture behind a statement that has
// just returned can be left pending, and if so leaves it pending.
func (cn *Conn) deferCapture(ctx context.Context, ws *primaryStmt, err error, wrote bool) bool {
	inj := ws.inj
	w := cn.primary
	if !cn.mayDefer(ws, err) {
		return false
	}
	cs := SessionFrom(ctx)
	if cs != nil && wrote && !cn.c.sysAnswered() {
		return false // the Session's generation needs a query on this connection first
	}
	w.wire.Disarm()
	p := &pendingCapture{cn: cn, b: w, inj: inj, wrote: wrote, seen: ws.seen}
	if wrote {
		p.at = time.Now().UnixNano()
	}
	cn.pending = cn.c.registerPending(p, cs)
	return true
}

// registerPending makes p, a possible commit's capture (p.wrote), one that
// reads of the pool's watermark (session_scope=db) and of the Session cs
// (nil: none) settle before they trust their own.
func (c *Connector) registerPending(p *pendingCapture, cs *Session) *pendingCapture {
	if !p.wrote {
		return p
	}
	p.cs = cs
	if c.cfg.SessionScope == ScopeDB {
		p.db = true
		c.inflight.add(p)
	}
	if cs != nil {
		cs.by.Store(c)
		cs.inflight.add(p)
	}
	return p
}

// mayDefer reports whether the statement's capture is the only thing still
// on its way, on an idle connection with no other capture pending.
func (cn *Conn) mayDefer(ws *primaryStmt, err error) bool {
	inj, w := ws.inj, cn.primary
	switch {
	case inj == nil || err != nil || ws.state != nil || ws.reset != nil || cn.pending != nil:
		return false
	case !inj.Sent() || inj.Done():
		return false
	}
	return !w.closed() && w.idle()
}

// settlePending settles this connection's pending capture, if any, before
// the connection is used again: waiting for its answer when need is set
// (the position is needed now), else only if the answer is in. An answer
// still on its way is read by pgx's next read on the connection (the wire
// layer takes it off), and applied after that statement (afterPrimary
// calls settlePending without need).
func (cn *Conn) settlePending(ctx context.Context, need bool) error {
	p := cn.pending
	if p == nil {
		return nil
	}
	if cn.primary.closed() && !p.ready() {
		// pgx closes a broken connection's socket in the background (it
		// may wait seconds for a stalled server): nothing more will come.
		p.abandon()
		cn.pending = nil
		return nil
	}
	if !need && !p.ready() {
		return nil
	}
	if err := p.settle(ctx); err != nil {
		return err
	}
	cn.pending = nil
	return nil
}

// inFlight returns the connection's pending capture while its answer is
// still on its way (nil otherwise): a replica read may then send its check
// before the position is known (see Conn.onReplica).
func (cn *Conn) inFlight() *pendingCapture {
	p := cn.pending
	if p == nil || p.ready() || cn.primary.closed() {
		return nil
	}
	return p
}

// abandon gives p up: its answer will not come (the connection broke), so
// its position counts as lost.
func (p *pendingCapture) abandon() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.settled {
		return
	}
	// Lost first, then out of the sets: a reader that no longer finds p
	// there must find its loss.
	p.b.captureUnanswered(p.inj)
	p.cn.markLostFor(p.cs, p.wrote)
	p.markSettled()
	p.wake()
}

// markSettled takes p out of the sets that wait for it, once its position
// is in the watermarks it advances, or its loss is marked: a reader that
// finds it gone from a set must find its effect. Call it with p.mu held.
func (p *pendingCapture) markSettled() {
	p.settled = true
	if p.db {
		p.cn.c.inflight.remove(p)
	}
	if p.cs != nil {
		p.cs.inflight.remove(p)
	}
}

// ready reports that p's answer is in, so settling it does not wait.
func (p *pendingCapture) ready() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.settled || p.inj.Done()
}

// settle reads p's answer, within ctx, and applies it. When ctx ends first
// p stays pending (whoever needs it next settles it) and ctx's error is
// returned.
//
// One goroutine reads the answer while the others wait for it, each within
// its own context: a reader with a short deadline does not queue behind one
// with a long one (the monitor's), and the injection is not read by one
// while its connection, settled by another, reuses it.
func (p *pendingCapture) settle(ctx context.Context) error {
	for {
		p.mu.Lock()
		if p.settled {
			p.mu.Unlock()
			return nil
		}
		if p.done == nil {
			p.done, p.turn = make(chan struct{}), make(chan struct{})
		}
		if !p.awaiting {
			break // with p.mu held
		}
		done, turn := p.done, p.turn
		p.mu.Unlock()
		select {
		case <-done:
			return nil
		case <-turn: // the one reading gave up: read it here
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	p.awaiting = true
	p.mu.Unlock()
	// Only the wire layer's view of the connection (the injection's
	// accessors take its lock): this may run on another goroutine than
	// the one using it.
	var err error
	if !p.inj.Done() {
		err = p.b.wire.Await(ctx, p.inj)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.awaiting = false
	if err != nil && (ctx.Err() != nil || wire.IsTimeout(err)) {
		// Not settled: the answer is still due on the connection, whose
		// slot must not be armed again before it has come (it would be
		// taken for the next capture's answer). A wait that ran out of
		// time a moment before its context said so is the context's end.
		close(p.turn)
		p.turn = make(chan struct{})
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		return context.DeadlineExceeded
	}
	if !p.settled {
		p.cn.applyPending(p) // before markSettled: see there
		p.markSettled()
		p.wake()
	}
	return nil
}

// wake lets the goroutines waiting for p's answer go on, once it has been
// applied (so the injection is no longer read here when its connection,
// back from waiting, reuses it). Call it with p.mu held.
func (p *pendingCapture) wake() {
	if p.done != nil {
		close(p.done)
	}
}

// applyPending does with a settled capture what afterPrimary does with one
// it waited for.
func (cn *Conn) applyPending(p *pendingCapture) {
	var (
		pos primaryPos
		ok  bool
	)
	if p.inj.Done() {
		// A server error is not passed to injectionFailed: a prepared
		// capture dropped behind pgryw's back is prepared again by
		// forgetPrepared before DEALLOCATE and DISCARD ALL, and nothing
		// here touches the connection, which another goroutine may be
		// using.
		pos, ok, _ = cn.c.captured(p.b, p.inj)
	}
	switch {
	case ok && p.wrote:
		cn.advanceFor(p.cs, pos, p.seen)
	case ok:
		cn.raiseConn(pos, p.seen)
	default:
		cn.markLostFor(p.cs, p.wrote)
	}
}

// closePending settles the connection's pending capture before it closes,
// giving the answer a moment to arrive.
func (cn *Conn) closePending() {
	if cn.pending == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if cn.settlePending(ctx, true) != nil {
		cn.pending.abandon()
		cn.pending = nil
	}
}

// coverage is what losses a capture still on its way will cover once it
// arrives: those up to seen of its connection (wrote: a possible
// commit's), of the pool's watermark (db) and of Session cs.
type coverage struct {
	wrote, db bool
	cs        *Session
	seen      lostSeen
}

// covering returns p's coverage, read under its lock: a reader elsewhere
// may retire p meanwhile.
func (p *pendingCapture) covering() coverage {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.wrote {
		return coverage{}
	}
	return coverage{wrote: true, db: p.db, cs: p.cs, seen: p.seen}
}
