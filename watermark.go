package pgryw

import (
	"context"
	"log/slog"
	"time"

	"github.com/pgryw/pgryw/internal/lsn"
)

// lostSeen holds the sessions' lost counts read before a capture was sent:
// the connection's, the pool's and the context's Session's.
type lostSeen struct{ conn, db, ctx uint64 }

func (cn *Conn) lostSeen(ctx context.Context) lostSeen {
	s := lostSeen{conn: cn.sess.lost.Load()}
	if cn.c.cfg.SessionScope == ScopeDB {
		s.db = cn.c.db.lost.Load()
	}
	if cs := SessionFrom(ctx); cs != nil {
		s.ctx = cs.lost.Load()
	}
	return s
}

// markLost records a position that could not be read: a possible commit's
// (on this connection and, with session_scope=db, on the pool), or only
// this connection's read floor.
func (cn *Conn) markLost(ctx context.Context, commit bool) {
	cn.markLostFor(SessionFrom(ctx), commit)
}

// markLostFor is markLost for the statement's Session cs (nil: none).
func (cn *Conn) markLostFor(cs *Session, commit bool) {
	cn.sess.markLost()
	if commit && cn.c.cfg.SessionScope == ScopeDB {
		cn.c.db.markLost()
	}
	if commit && cs != nil {
		cs.by.Store(cn.c)
		cs.markLost()
	}
}

// advance raises the watermarks this connection answers to after a possible
// commit, records the primary's position for lag estimates, and marks the
// losses seen before the capture was sent as covered. A position read on a
// writer that has since been replaced raises this connection's watermark
// alone (see sawPrimary).
func (cn *Conn) advance(ctx context.Context, p primaryPos, seen lostSeen) bool {
	if cs := SessionFrom(ctx); cs != nil {
		cn.c.generationOf(ctx, cn.primary) // read once per connector, on this idle connection
		return cn.advanceFor(cs, p, seen)
	}
	return cn.advanceFor(nil, p, seen)
}

// advanceFor is advance for the statement's Session cs (nil: none), once
// the primary's system identifier is known (or known to be unreadable): it
// sends nothing, so it may run on another connection's goroutine.
func (cn *Conn) advanceFor(cs *Session, p primaryPos, seen lostSeen) bool {
	if !cn.raiseConn(p, seen) {
		return false
	}
	if cn.c.cfg.SessionScope == ScopeDB {
		cn.c.db.wm.Advance(p.lsn)
		cn.c.db.cover(seen.db)
	}
	if cs != nil {
		cs.advanceAt(cn.c.genAt(context.Background(), cn.primary, p.tli), p.lsn)
		cs.cover(seen.ctx)
		cs.by.Store(cn.c)
	}
	return true
}

// raiseConn raises this connection's watermark alone to a primary position
// read after a statement that committed nothing, and reports whether the
// position is of the current writer's history.
func (cn *Conn) raiseConn(p primaryPos, seen lostSeen) bool {
	current := cn.c.sawPrimary(p)
	cn.sess.wm.Advance(p.lsn)
	cn.sess.cover(seen.conn)
	return current
}

// watermark returns the position a replica read must see: this
// connection's, with session_scope=db the pool's, and the context's
// Session's. If a position was lost it captures a fresh one first (the
// primary connection is idle here); so it does for a Session whose position
// belongs to another primary generation (a token from before a failover:
// the current position covers every write of it that survived) or lies
// beyond anything the primary is known to have written (a forged or stale
// unsigned token: clamped, so that no read waits for a position that will
// not come).
func (cn *Conn) watermark(ctx context.Context) (lsn.LSN, error) {
	return cn.watermarkBut(ctx, nil)
}

// watermarkBut is watermark leaving the connection's own pending capture
// skip, when not nil, in flight: the position it returns is then a lower
// bound of the watermark, which watermark gives once skip has arrived.
func (cn *Conn) watermarkBut(ctx context.Context, skip *pendingCapture) (lsn.LSN, error) {
	if !cn.c.cfg.ReadYourWrites {
		return 0, nil
	}
	cn.c.uses.Add(1)
	if cn.poll.b != nil {
		cn.settlePoll(ctx) // the floor of this connection's last replica read
	}
	// Writes that returned before their positions arrived (deferred.go).
	if skip == nil && cn.pending != nil {
		if err := cn.settlePending(ctx, true); err != nil {
			return 0, err
		}
	}
	w := wmSources{db: cn.c.cfg.SessionScope == ScopeDB, cs: SessionFrom(ctx)}
	if err := cn.collect(ctx, skip, &w); err != nil {
		return 0, err
	}
	if w.connLost || w.dbLost || w.csLost || w.foreign || w.beyond {
		if err := cn.recapture(ctx, skip, &w); err != nil {
			return 0, err
		}
	}
	wm := cn.sess.wm.Load()
	if w.db {
		wm = max(wm, cn.c.db.wm.Load())
	}
	if w.cs != nil {
		wm = max(wm, w.cs.wm.Load())
	}
	return wm, nil
}

// wmSources is what a read's watermark is made of, and what is wrong with
// it: positions lost (or late) on the way, and a session position from
// another history (foreign) or beyond anything the primary wrote (beyond).
type wmSources struct {
	db bool     // session_scope=db: the pool's watermark counts
	cs *Session // WithSession's, or nil
	// late: other connections' captures still not in after othersWait;
	// they count as lost until a fresh capture covers them.
	late                     []*pendingCapture
	connLost, dbLost, csLost bool
	csGen, gen               generation
	csPos                    lsn.LSN
	foreign, beyond          bool
}

// collect settles (or gives up on) other connections' captures, and finds
// what of the watermark was lost and whether the session's position
// belongs to the writer's history.
func (cn *Conn) collect(ctx context.Context, skip *pendingCapture, w *wmSources) error {
	// Other connections' captures: one that is late counts as lost here.
	if w.db && cn.c.inflight.n.Load() > 0 {
		l, err := cn.c.inflight.settleOthers(ctx, skip)
		if err != nil {
			return err
		}
		w.late, w.dbLost = l, len(l) > 0
	}
	if w.cs != nil {
		l, err := w.cs.inflight.settleOthers(ctx, skip)
		if err != nil {
			return err
		}
		w.late, w.csLost = append(w.late, l...), len(l) > 0
	}
	// Losses that skip, a possible commit's capture sent after them, will
	// cover once it arrives are not lost to this read: it waits for skip.
	var cov coverage
	if skip != nil {
		cov = skip.covering()
	}
	w.connLost = cn.sess.lostBeyond(cov.wrote, cov.seen.conn)
	if w.db && !w.dbLost {
		w.dbLost = cn.c.db.lostBeyond(cov.db, cov.seen.db)
	}
	if w.cs == nil {
		return nil
	}
	if !w.csLost {
		w.csLost = w.cs.lostBeyond(cov.cs != nil && cov.cs == w.cs, cov.seen.ctx)
	}
	if w.csGen, w.csPos = w.cs.position(); w.csPos == 0 {
		return nil
	}
	if err := cn.checkPrimary(ctx); err != nil {
		return err
	}
	w.gen = cn.c.generationOf(ctx, cn.primary)
	w.foreign = w.csGen != w.gen
	// Only an unsigned position can be forged; a signed one was issued
	// after a real commit.
	w.beyond = !w.foreign && !w.cs.signed() && w.csPos > cn.c.topo.hist.latest()
	return nil
}

// recapture reads a fresh primary position, which covers every write that
// returned before it was sent: it stands in for what was lost or late, and
// rebases or clamps a session position that cannot be waited for.
func (cn *Conn) recapture(ctx context.Context, skip *pendingCapture, w *wmSources) error {
	if skip != nil {
		// The capture below goes on the primary connection, behind the
		// answer still on its way: take that first.
		if err := cn.settlePending(ctx, true); err != nil {
			return err
		}
	}
	if err := cn.checkPrimary(ctx); err != nil {
		return err
	}
	if w.dbLost || w.csLost {
		cn.c.autoMiss.Store(time.Now().UnixNano())
	}
	seen := cn.lostSeen(ctx)
	p, err := capture(ctx, cn.primary)
	if err != nil {
		cn.c.stats.captureFailures.Add(1)
		return err
	}
	cn.c.stats.captures.Add(1)
	if w.csPos > 0 {
		cn.rebaseSession(ctx, w, p)
	}
	if !w.dbLost && !w.csLost {
		cn.raiseConn(p, seen)
		return nil
	}
	if cn.advance(ctx, p, seen) {
		for _, lp := range w.late {
			lp.retire(w.db, w.cs) // covered: no reader waits for it again
		}
	} else if len(w.late) > 0 {
		// Read on a writer since replaced: it does not cover the late
		// writes, made on the current one.
		return errPositionLost
	}
	return nil
}

// rebaseSession moves the session's position onto the writer's history at
// p when it is foreign to it, or down to p when it lies beyond anything the
// primary wrote.
func (cn *Conn) rebaseSession(ctx context.Context, w *wmSources, p primaryPos) {
	// The capture may be the first position of a new writer.
	gen := cn.c.genAt(ctx, cn.primary, p.tli)
	// A later timeline of this system than the writer's own is kept from a
	// signed token (issued after a real commit, by a writer this one has
	// not caught up with), or when this connector has seen a writer on it
	// (this connection reaches one since replaced); an unsigned one beyond
	// both may be forged, and would make every read wait.
	cs, csGen := w.cs, w.csGen
	switch {
	case csGen != gen && (!newer(csGen, gen) || !cs.signed() && csGen.timeline > cn.c.tli.Load()):
		cn.c.stats.tokensRebased.Add(1)
		cs.rebase(gen, p.lsn)
	case w.beyond && w.csPos > p.lsn:
		cn.c.stats.tokensClamped.Add(1)
		cs.rebase(gen, p.lsn)
	}
}

// Writer generations. Every position pgryw reads on the writer (the
// capture riding behind a write, a capture of its own) carries the writer's
// timeline, from the name of the WAL file it falls in, at no extra round
// trip. A promoted standby writes on a new, higher timeline, so the first
// position read on a new writer after a failover tells the connector, before
// that position moves any shared watermark:
//
//   - the pool's watermark (session_scope=db), whose old-history position
//     the new history may not reach for a long time, moves to the new
//     writer's position, which is at or past every write of the old history
//     that the new writer has (a standby replays everything it received
//     before it is promoted), so a replica of the new history that reached
//     it has them all; writes that never reached the new writer are gone;
//   - the primary-position history used for lag estimates starts afresh;
//   - a Session holding a position of the old history is moved the same way
//     when it is next used (see Conn.watermark);
//   - an answer read on the old writer after the change (a straggler, or a
//     writer that was not quite dead) moves only its own connection's
//     watermark.
//
// A connection's own watermark needs no rebasing: its primary connection is
// to one writer for life, and connections to a dead writer are discarded
// (see Conn.ResetSession).

// sawPrimary records a position read on the writer: its timeline (a new one
// is a new writer; see switchTimeline) and, for lag estimates, its WAL
// position. It reports false for a position of an earlier timeline than the
// current writer's, which must not move shared watermarks.
func (c *Connector) sawPrimary(p primaryPos) bool {
	if p.tli != c.tli.Load() && !c.switchTimeline(p) {
		return false
	}
	if p.tli != c.seenTLI.Load() {
		c.noteTimeline(p.tli)
	}
	c.topo.hist.add(p.lsn, time.Now().UnixNano(), p.tli)
	return true
}

// switchTimeline makes p's timeline the current writer's unless it is an
// earlier one (it then reports false). A change of writer (not the first
// timeline seen) moves the pool's watermark to p: see the comment at the
// top of this file. Positions of the new timeline wait here until the move
// is done, so none is overwritten by it.
func (c *Connector) switchTimeline(p primaryPos) bool {
	c.genMu.Lock()
	defer c.genMu.Unlock()
	cur := c.tli.Load()
	switch {
	case p.tli == cur:
		return true
	case p.tli < cur:
		return false
	}
	if cur != 0 {
		c.db.wm.Set(p.lsn)
	}
	c.tli.Store(p.tli)
	return true
}

// noteTimeline records, for this connector's stats and log, the writer's
// timeline as its connections see it: the timeline itself is the cluster
// scope's, shared with the process's other connectors to the same writer,
// and whichever saw the new one first moved the shared watermark.
func (c *Connector) noteTimeline(tli uint32) {
	for {
		old := c.seenTLI.Load()
		if tli <= old {
			return
		}
		if c.seenTLI.CompareAndSwap(old, tli) {
			if old != 0 {
				c.stats.writerChanges.Add(1)
				c.logAt(slog.LevelWarn, "pgryw: the writer changed (a new timeline): watermarks of the old history move to the new writer's position",
					slog.Uint64("old_timeline", uint64(old)), slog.Uint64("new_timeline", uint64(tli)))
			}
			return
		}
	}
}

// genAt returns the generation of a position read on b's writer on
// timeline tli: no generation while the system identifier is not known
// (see generationOf).
func (c *Connector) genAt(ctx context.Context, b *backend, tli uint32) generation {
	g := c.generationOf(ctx, b)
	if g == (generation{}) {
		return g
	}
	g.timeline = tli
	return g
}

// newer reports that a is a later timeline of b's system: a position from a
// writer newer than the one this connection reaches, which must not be
// moved back onto the older history.
func newer(a, b generation) bool {
	return a.system == b.system && a.timeline > b.timeline
}

// markLost records a commit or read whose position is unknown.
func (s *Session) markLost() { s.lost.Add(1) }

// pending returns the lost count to pass to cover once a capture sent after
// this call has returned, and whether any loss is still uncovered.
func (s *Session) pending() (uint64, bool) {
	l := s.lost.Load()
	return l, l > s.covered.Load()
}

// lostBeyond reports whether a loss is still uncovered, not counting those
// up to seen when covering (a capture sent when lost was at seen is on its
// way).
func (s *Session) lostBeyond(covering bool, seen uint64) bool {
	l, lost := s.pending()
	return lost && !(covering && l <= seen)
}

// cover records that a capture sent when lost was at seen has been applied
// to the watermark.
func (s *Session) cover(seen uint64) {
	for {
		cur := s.covered.Load()
		if seen <= cur || s.covered.CompareAndSwap(cur, seen) {
			return
		}
	}
}

// advanceAt raises the position to l of generation g. A position of
// another generation replaces it: the new history is where the session's
// writes are now (a write lost with the old primary is gone); but one of an
// earlier timeline of the same system (an answer from a writer since
// replaced) changes nothing.
func (s *Session) advanceAt(g generation, l lsn.LSN) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.gen == g || g == (generation{}) || s.gen == (generation{}):
		if g != (generation{}) {
			s.gen = g
		}
		s.wm.Advance(l)
	case g.system == s.gen.system && g.timeline < s.gen.timeline:
	default:
		s.gen = g
		s.wm.Set(l) // readers load wm without the lock: never show them zero
	}
}

// rebase sets the position to l of generation g, even lower: a token's
// position from another history, or beyond anything the primary has.
func (s *Session) rebase(g generation, l lsn.LSN) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen = g
	s.wm.Set(l) // readers load wm without the lock: never show them zero
}

// position returns the generation and position.
func (s *Session) position() (generation, lsn.LSN) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen, s.wm.Load()
}
