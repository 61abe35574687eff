package pgryw

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/pgryw/pgryw/internal/lsn"
	"github.com/pgryw/pgryw/internal/wire"
)

// The capture statements, pgryw's own: none carries caller text.
const (
	// pg_current_wal_insert_lsn, not _flush_ or _lsn: read after the commit it
	// is at or past the end of the commit record whatever synchronous_commit
	// is; the flush position can trail an asynchronous commit.
	//
	// wal_block_size comes along for adjustInsertLSN, and the name of the
	// WAL file, whose first eight hex digits are the writer's timeline: a
	// new writer (a promoted standby) starts a new one, so every position
	// says which history it belongs to (see sawPrimary).
	//
	// And the OID of pg_current_wal_insert_lsn (NULL where there is none by
	// that name), which later captures call with a FunctionCall message
	// (backend.injectCapture).
	//
	// Every name is pg_catalog's: the capture runs in the application's
	// session, whose search_path may put a schema of its own, with a
	// function of the same name, in front of pg_catalog.
	sqlCapture = "SELECT pg_catalog.pg_current_wal_insert_lsn(), pg_catalog.current_setting('wal_block_size'), pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_insert_lsn()), pg_catalog.to_regprocedure('pg_catalog.pg_current_wal_insert_lsn()')::pg_catalog.oid"
	// sqlCaptureLSN is sqlCapture's position alone, for a node where the
	// fast-path call of the function was not yet seen to work, or failed
	// (backend.injectCapture).
	sqlCaptureLSN = "SELECT pg_catalog.pg_current_wal_insert_lsn()"
)

// Write capture and watermarks: what running a statement on the primary does
// to the session's position.
//
// The rule: every statement that leaves the primary connection outside a
// transaction block carries, riding behind it in the same flush, a read of
// pg_current_wal_insert_lsn() (but a write that goes without, by
// capture=auto or on_read: see captureLater; behind a transaction pooler
// the read comes as a round trip of its own). If the statement may have committed a write
// (it succeeded, or it failed in a way that may have come after a commit),
// the position advances the connection's and the pool's watermarks;
// otherwise it raises the connection's alone, as an upper bound of what the
// statement saw (monotonic reads). Nothing rides along where it would run
// inside a transaction block: there it would take the block's snapshot or
// break a SET TRANSACTION that follows. When a possible commit's position
// cannot be read (the connection broke, the caller's context ended, the
// block is still open), the position is marked lost and the next replica
// read captures one first.

// settleCapture reads the answer to a ride-along capture, within the
// caller's context. If the answer cannot be read the connection is out of
// step with the server and is closed (database/sql then discards it).
func (cn *Conn) settleCapture(ctx context.Context, b *backend, inj *wire.Injection) (primaryPos, bool) {
	if inj == nil {
		return primaryPos{}, false
	}
	b.wire.Disarm()
	if !cn.await(ctx, b, inj) {
		return primaryPos{}, false
	}
	p, ok, err := cn.c.captured(b, inj)
	if err != nil {
		b.injectionFailed(b.slotName(inj), err)
	}
	return p, ok
}

// captured reads the answer to a capture that has arrived and counts it:
// the position, or the server's error for it (nil when the answer just did
// not parse).
func (c *Connector) captured(b *backend, inj *wire.Injection) (primaryPos, bool, error) {
	if err := inj.Err(); err != nil {
		c.stats.captureFailures.Add(1)
		b.captureAnswered(inj, true)
		return primaryPos{}, false, err
	}
	b.captureAnswered(inj, false)
	row, null := inj.Row()
	if len(row) == 0 || null[0] {
		return primaryPos{}, false, nil
	}
	p, err := b.parseCapture(row)
	if err != nil {
		return primaryPos{}, false, nil
	}
	c.stats.captures.Add(1)
	return p, true, nil
}

// await waits, within ctx, for the rest of a ride-along statement's answer
// and reports whether it arrived. An answer that cannot be read leaves the
// connection out of step with the server, so it is closed.
func (cn *Conn) await(ctx context.Context, b *backend, inj *wire.Injection) bool {
	if !inj.Sent() || b.closed() {
		return false
	}
	if inj.Done() {
		return true
	}
	if err := b.wire.Await(ctx, inj); err != nil {
		if ctx.Err() == nil {
			b.captureUnanswered(inj)
		}
		b.close()
		return false
	}
	return inj.Done()
}

// captureLater reports whether a possible commit about to be sent on the
// primary goes without its ride-along capture: when nothing has asked for
// a watermark (a read, a token) since this connection's last possible
// commit returned, whose capture therefore went unused, as in a run of
// writes, a bulk load or a write-only worker. The position is then marked
// lost once the statement returns, and the first read (or token) that
// needs it reads one afresh, which covers every write that returned before
// it was sent: one capture for the run instead of one per write, none at
// all for writes no read follows. A read that needs it sends one
// (captureOwed on the writing connection, overlapping the replica's poll
// before PostgreSQL 19; elsewhere, and for WAIT FOR, a round trip to the
// primary before the read), and asks for a watermark, so the connection's
// next write captures again. It is a guess about the next statements, never
// about correctness: a skipped capture is a lost position, which every
// read already knows how to cover. capture=always turns it off;
// capture=on_read makes every write go without.
func (cn *Conn) captureLater() bool {
	switch cn.c.cfg.Capture {
	case CaptureAlways:
		return false
	case CaptureOnRead:
		return true
	}
	return cn.lastWrite != 0 && cn.lastWrite-1 == cn.c.uses.Load() && !cn.c.missedLately()
}

// autoMissPause is how long capture=auto keeps every write's capture after
// a read had to read a position afresh for another connection's write.
const autoMissPause = time.Second

// missedLately reports whether, within autoMissPause, a read had to read a
// position afresh because a write of another connection (or of its
// Session's, elsewhere) went without its position: capture=auto's guess
// that nobody would ask was wrong. Under concurrency that guess fails
// whenever a writer's next statement is again a write (database/sql hands
// the goroutine the connection it just freed), and the miss costs a round
// trip to the primary in some other read's path, more than the capture it
// saved; so, for a while, every write keeps its capture. A run of writes
// with no reader anywhere misses nothing and keeps going without.
func (s *clusterScope) missedLately() bool {
	at := s.autoMiss.Load()
	return at != 0 && time.Now().UnixNano()-at < int64(autoMissPause)
}

// captureOwed sends, on its own, the capture this connection's last write
// went without (captureLater; cn.owed, which the caller checks, so that a
// steady read runs nothing here), as a replica read that needs it starts. It
// is then the connection's pending capture (deferred.go): where the check
// is a replay poll (before PostgreSQL 19) it goes to the replica while the
// capture is on its way to the primary (speculate), so the read pays the
// longer of two round trips, not both; WAIT FOR needs the position first.
// Where it cannot be sent so (another capture pending, the primary
// connection busy, behind a transaction pooler, a Session whose
// generation is still to be read), the read captures first, as for any
// lost position.
func (cn *Conn) captureOwed(ctx context.Context) {
	cn.owed = false
	if _, lost := cn.sess.pending(); !lost {
		return // covered meanwhile (captureNow, a capture of its own)
	}
	w := cn.primary
	if (cn.checkDue || w.quiet()) && w.gone() {
		return // ended while idle: checkPrimary replaces it, and the read captures
	}
	if cn.pending != nil || w.wire == nil || w.closed() || !w.idle() || w.peer.TxPooled || cn.open.ctx != nil || w.pg.IsBusy() {
		return
	}
	cs := SessionFrom(ctx)
	if cs != nil && !cn.c.sysAnswered() {
		return
	}
	seen := cn.lostSeen(ctx)
	inj := w.injectCapture(&w.post)
	if err := w.wire.Send(inj); err != nil {
		if inj.Sent() {
			w.close() // a write error: the read captures elsewhere or fails
		}
		return
	}
	cn.pending = cn.c.registerPending(&pendingCapture{cn: cn, b: w, inj: inj, wrote: true, seen: seen}, cs)
}

// captureNow reads the primary's position after a commit with a round trip of
// its own, within the caller's context, and advances the watermarks. If it
// cannot, the position is marked lost.
func (cn *Conn) captureNow(ctx context.Context) {
	seen := cn.lostSeen(ctx)
	p, err := capture(ctx, cn.primary)
	if err != nil {
		cn.c.stats.captureFailures.Add(1)
		cn.markLost(ctx, true)
		return
	}
	cn.c.stats.captures.Add(1)
	cn.advance(ctx, p, seen)
}

// freshPosition reads the primary's position on a connection of its own:
// for a Session's token, when a commit's position was lost (it covers
// every commit that returned before it). One runs at a time per
// connector, and a position read after a call began serves it: a burst of
// tokens during a stall costs one connection at a time, not one each.
func (c *Connector) freshPosition(ctx context.Context) (generation, lsn.LSN, error) {
	start := time.Now()
	select {
	case c.fresh.turn <- struct{}{}:
	case <-ctx.Done():
		return generation{}, 0, ctx.Err()
	}
	defer func() { <-c.fresh.turn }()
	if c.fresh.sent.After(start) {
		return c.fresh.gen, c.fresh.lsn, nil
	}
	dc, err := c.dial(ctx, c.topo.primary, forPosition)
	if err != nil {
		return generation{}, 0, err
	}
	b := newBackend(dc, c.topo.primary)
	defer b.close()
	sent := time.Now()
	p, err := capture(ctx, b)
	if err != nil {
		c.stats.captureFailures.Add(1)
		return generation{}, 0, err
	}
	c.stats.captures.Add(1)
	gen := c.genAt(ctx, b, p.tli)
	c.fresh.sent, c.fresh.gen, c.fresh.lsn = sent, gen, p.lsn
	return gen, p.lsn, nil
}

// freshState is freshPosition's: turn admits one at a time and guards the
// rest, the last position it read and when it was sent.
type freshState struct {
	turn chan struct{}
	sent time.Time
	gen  generation
	lsn  lsn.LSN
}

// primaryPos is a position read on the primary, with the timeline it is on.
type primaryPos struct {
	lsn lsn.LSN
	tli uint32
}

// capture reads the primary's WAL insert position with a round trip of its
// own. Call it only after a commit has returned. A connection that knows
// the primary's block size and timeline asks for the position alone
// (sqlCaptureLSN), as its ride-along captures do: the timeline of one
// server connection's writer does not change under it. Behind a
// transaction pooler, where the next statement may reach another server
// (after a repoint, a promoted one on a new timeline), it asks for all.
func capture(ctx context.Context, b *backend) (primaryPos, error) {
	q := sqlCapture
	if b.walBlock.Load() != 0 && !b.peer.TxPooled {
		q = sqlCaptureLSN
	}
	row, _, err := b.control(ctx, q)
	if err != nil {
		return primaryPos{}, err
	}
	return b.parseCapture(row)
}

// parseCapture reads a capture's row on b: sqlCapture's, whose block size,
// timeline and function OID b keeps, or the position alone (sqlCaptureLSN's
// or the fast-path call's), which needs them kept.
func (b *backend) parseCapture(row []string) (primaryPos, error) {
	if len(row) == 1 {
		bs, tli := b.walBlock.Load(), b.walTLI.Load()
		if bs == 0 {
			return primaryPos{}, errors.New("pgryw: a position without the primary's wal_block_size")
		}
		l, err := parseInsertLSN(row[0])
		if err != nil {
			return primaryPos{}, err
		}
		return primaryPos{lsn: adjustInsertLSN(l, bs), tli: tli}, nil
	}
	p, bs, fn, err := parseCapture(row)
	if err == nil {
		b.walTLI.Store(p.tli)
		b.captureFn.Store(fn)
		b.walBlock.Store(bs)
	}
	return p, err
}

// parseCapture reads sqlCapture's row, and the block size and function OID
// it carries (a NULL OID reads as "" here, and as 0).
func parseCapture(row []string) (primaryPos, uint64, uint32, error) {
	if len(row) != 4 {
		return primaryPos{}, 0, 0, fmt.Errorf("pgryw: primary position query returned %d columns", len(row))
	}
	l, err := parseInsertLSN(row[0])
	if err != nil {
		return primaryPos{}, 0, 0, err
	}
	bs, err := strconv.ParseUint(row[1], 10, 32)
	if err != nil || bs == 0 {
		return primaryPos{}, 0, 0, fmt.Errorf("pgryw: primary returned an unreadable wal_block_size %q", clip(row[1]))
	}
	tli, ok := walFileTimeline(row[2])
	if !ok {
		return primaryPos{}, 0, 0, fmt.Errorf("pgryw: primary returned an unreadable WAL file name %q", clip(row[2]))
	}
	var fn uint64
	if row[3] != "" {
		if fn, err = strconv.ParseUint(row[3], 10, 32); err != nil {
			return primaryPos{}, 0, 0, fmt.Errorf("pgryw: primary returned an unreadable function OID %q", clip(row[3]))
		}
	}
	return primaryPos{lsn: adjustInsertLSN(l, bs), tli: tli}, bs, uint32(fn), nil
}

// parseInsertLSN reads a capture's pg_current_wal_insert_lsn().
func parseInsertLSN(s string) (lsn.LSN, error) {
	l, err := lsn.Parse(s)
	if err != nil {
		return 0, fmt.Errorf("pgryw: primary returned an unreadable WAL position: %w", err)
	}
	return l, nil
}

// walFileTimeline reads the timeline from a WAL file name: its first eight
// of 24 hex digits. Timeline 0 does not exist.
func walFileTimeline(name string) (uint32, bool) {
	if len(name) != 24 {
		return 0, false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !(c >= '0' && c <= '9' || c >= 'A' && c <= 'F') {
			return 0, false
		}
	}
	tli, err := strconv.ParseUint(name[:8], 16, 32)
	return uint32(tli), err == nil && tli != 0
}

// adjustInsertLSN: see lsn.ReplayTarget.
func adjustInsertLSN(l lsn.LSN, blockSize uint64) lsn.LSN { return lsn.ReplayTarget(l, blockSize) }

// injectCapture readies in s the capture to ride behind a statement on this
// primary connection: the full sqlCapture until the connection knows the
// primary's wal_block_size and timeline, then the position alone. That is a
// fast-path FunctionCall of pg_current_wal_insert_lsn, which the server
// answers without a parse, plan, portal or executor (7 µs less server time
// per capture than the prepared statement, measured on PostgreSQL 19), or,
// until a probe saw the fast path work on this node (Conn.probeFastPath),
// and for a while after it failed (node.fastFails), the prepared
// sqlCaptureLSN.
func (b *backend) injectCapture(s *slot) *wire.Injection {
	if b.walBlock.Load() == 0 {
		return b.injectPrepared(s, stmtCapture, sqlCapture)
	}
	if fn := b.captureFn.Load(); fn != 0 && b.node.fastState.Load() == fastOK && b.node.fastPathOn() {
		b.reuse(s)
		return injectFastCapture(s, fn)
	}
	return b.injectPrepared(s, stmtCaptureLSN, sqlCaptureLSN)
}

// injectFastCapture readies in s a fast-path FunctionCall of function fn
// (pg_current_wal_insert_lsn's OID), with a text result.
func injectFastCapture(s *slot, fn uint32) *wire.Injection {
	s.msgs, _ = (&pgproto3.FunctionCall{Function: fn}).Encode(s.msgs[:0])
	s.name = stmtCaptureFast
	s.inj.ResetMessages(s.msgs)
	return &s.inj
}

// captureAnswered notes how a capture's answer came, for fastFails: an
// error answer to a fast-path call turns the node's fast path off.
func (b *backend) captureAnswered(inj *wire.Injection, failed bool) {
	switch {
	case !inj.FunctionCall():
	case failed:
		b.node.fastPathOff()
	case b.node.fastFails.Load() != 0:
		b.node.fastFails.Store(0)
	}
}

// captureUnanswered notes a capture that was sent and whose connection
// broke before its answer came.
func (b *backend) captureUnanswered(inj *wire.Injection) {
	if inj.FunctionCall() && b.node.fastFails.Add(1) >= fastCaptureTries {
		b.node.fastPathOff()
	}
}

// Names of pgryw's capture statements prepared on server connections.
const (
	stmtCapture = "pgryw_capture"
	// stmtCaptureLSN is the capture once the connection knows the
	// primary's block size and timeline, where the fast path is not taken
	// (backend.injectCapture).
	stmtCaptureLSN = "pgryw_lsn"
	// stmtCaptureFast names no prepared statement: it marks a slot holding
	// the fast-path call of pg_current_wal_insert_lsn.
	stmtCaptureFast = "pgryw_fastpath"
)
