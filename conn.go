package pgryw

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgryw/pgryw/internal/lsn"
	"github.com/pgryw/pgryw/internal/sqlclass"
	"github.com/pgryw/pgryw/internal/wire"
)

// ErrReplicaHint is returned for a statement carrying a /* pgryw:replica */
// hint that the classifier says writes or changes the session: obeying the
// hint would fail on the replica or change the wrong session.
var ErrReplicaHint = errors.New("pgryw: /* pgryw:replica */ hint on a statement that must run on the writer")

// Conn is one database/sql connection: a writer connection opened at once,
// and a connection to each replica opened when a read first needs it.
// Statements are routed one by one; see the package documentation.
type Conn struct {
	c        *Connector
	writer   *backend
	replicas []*backend // by replica index; nil until used

	sess session // this connection's own watermark

	// pinned: a statement changed session state (SET, PREPARE, LISTEN, a
	// temporary table, an advisory lock...) on the writer connection; every
	// later statement runs there so it keeps seeing that state.
	pinned bool

	// blockWrote: a transaction block opened with an Exec'd BEGIN has run a
	// statement that may write, so its COMMIT moves the watermark.
	blockWrote bool

	tx *tx // the open database/sql transaction, if any
}

// Writer returns the writer's *pgx.Conn, for use through sql.Conn.Raw. Do not
// start or end transactions on it behind pgryw's back.
func (cn *Conn) Writer() *pgx.Conn {
	if sc, ok := cn.writer.conn.(interface{ Conn() *pgx.Conn }); ok {
		return sc.Conn()
	}
	return nil
}

// Close implements driver.Conn.
func (cn *Conn) Close() error {
	err := cn.writer.close()
	for i, b := range cn.replicas {
		if b != nil {
			b.close()
			cn.replicas[i] = nil
		}
	}
	return err
}

// Prepare implements driver.Conn.
func (cn *Conn) Prepare(query string) (driver.Stmt, error) {
	return cn.PrepareContext(context.Background(), query)
}

// PrepareContext implements driver.ConnPrepareContext. Nothing is sent to a
// server: which node runs the statement is decided at each execution, and pgx
// caches the server-side prepared statement on whichever node that is.
func (cn *Conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return &Stmt{cn: cn, query: query}, nil
}

// Begin implements driver.Conn.
func (cn *Conn) Begin() (driver.Tx, error) {
	return cn.BeginTx(context.Background(), driver.TxOptions{})
}

// CheckNamedValue implements driver.NamedValueChecker: every argument goes to
// pgx untouched (pgx encodes arrays, Scanner/Valuer types and more itself).
func (cn *Conn) CheckNamedValue(*driver.NamedValue) error { return nil }

// Ping implements driver.Pinger against the writer.
func (cn *Conn) Ping(ctx context.Context) error {
	if p, ok := cn.writer.conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

// ResetSession implements driver.SessionResetter. It checks the writer
// connection (replica connections are checked when a read uses them) and
// drops replica connections that have failed.
func (cn *Conn) ResetSession(ctx context.Context) error {
	for i, b := range cn.replicas {
		if b != nil && b.closed() {
			b.close()
			cn.replicas[i] = nil
		}
	}
	if r, ok := cn.writer.conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

// IsValid implements driver.Validator.
func (cn *Conn) IsValid() bool {
	if v, ok := cn.writer.conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return !cn.writer.closed()
}

// ExecContext implements driver.ExecerContext.
func (cn *Conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if cn.tx != nil {
		return cn.tx.exec(ctx, query, args)
	}
	if cn.c.plain {
		return cn.writer.exec(ctx, query, args)
	}
	cls := cn.c.classes.get(query)
	toReplica, err := cn.routeReplica(ctx, &cls)
	if err != nil {
		return nil, err
	}
	if toReplica {
		var res driver.Result
		onWriter, err := cn.onReplica(ctx, query, &cls, func(b *backend) (func(), error) {
			var err error
			res, err = b.exec(ctx, query, args)
			return nil, err
		})
		if !onWriter {
			return res, err
		}
	}
	inj := cn.armCapture(&cls)
	res, err := cn.writer.exec(ctx, query, args)
	cn.afterWriter(ctx, &cls, err, inj)
	return res, err
}

// QueryContext implements driver.QueryerContext.
func (cn *Conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if cn.tx != nil {
		return cn.tx.query(ctx, query, args)
	}
	if cn.c.plain {
		return cn.writer.query(ctx, query, args)
	}
	cls := cn.c.classes.get(query)
	toReplica, err := cn.routeReplica(ctx, &cls)
	if err != nil {
		return nil, err
	}
	if toReplica {
		var rows driver.Rows
		onWriter, err := cn.onReplica(ctx, query, &cls, func(b *backend) (func(), error) {
			var err error
			rows, err = b.query(ctx, query, args)
			if err != nil {
				return nil, err
			}
			return func() { rows.Close() }, nil
		})
		if !onWriter {
			return rows, err
		}
	}
	inj := cn.armCapture(&cls)
	rows, err := cn.writer.query(ctx, query, args)
	if err != nil || inj == nil && !(cn.c.cfg.ReadYourWrites && cn.commits(&cls)) {
		cn.afterWriter(ctx, &cls, err, inj)
		return rows, err
	}
	// An autocommit write that returns rows (INSERT … RETURNING) has
	// committed only when its result is complete: finish after Close.
	return &afterRows{Rows: rows, done: func(err error) { cn.afterWriter(ctx, &cls, err, inj) }}, nil
}

// routeReplica decides, outside any transaction, whether a statement goes to
// a replica.
func (cn *Conn) routeReplica(ctx context.Context, cls *sqlclass.Result) (bool, error) {
	read := cn.c.readOnly(cls)
	replicaHint := cls.Hint == sqlclass.HintReplica || wantsReplica(ctx)
	if replicaHint && !read {
		return false, fmt.Errorf("%w (%s)", ErrReplicaHint, cls.Reason)
	}
	if !read || cls.Hint == sqlclass.HintPrimary || wantsPrimary(ctx) || !cn.writer.idle() {
		return false, nil
	}
	// A replica hint overrides pinning: the caller says the statement does
	// not depend on this connection's session state.
	return !cn.pinned || replicaHint, nil
}

// commits reports whether a statement about to run on the writer, outside
// any database/sql transaction, may commit a write: an autocommit statement
// that may write (a multi-statement string with its own BEGIN and COMMIT
// included), or a COMMIT ending a transaction block in which such a
// statement ran. A read-only block's COMMIT moves nothing.
func (cn *Conn) commits(cls *sqlclass.Result) bool {
	if cls.Tx == sqlclass.TxCommit && !cls.Write {
		return cn.blockWrote
	}
	return cn.c.mayWrite(cls)
}

// armCapture arranges for the writer's WAL position to be read in the same
// flush as a statement that may commit a write: pgconn's Sync ends the
// statement's implicit transaction, and the position query that follows it
// on the wire runs after the commit. It returns nil when no capture is due or
// it cannot ride along (then afterWriter captures with a round trip of its own).
func (cn *Conn) armCapture(cls *sqlclass.Result) *wire.Injection {
	w := cn.writer
	if w.wire == nil || !cn.c.cfg.ReadYourWrites || !cn.commits(cls) {
		return nil
	}
	// Inside a transaction block only COMMIT ends it; anything else would
	// capture a position from before the commit.
	if !w.idle() && cls.Tx != sqlclass.TxCommit {
		return nil
	}
	inj := w.injectPrepared(stmtCapture, sqlCapture)
	w.wire.AppendAfterExec(inj)
	return inj
}

// afterWriter updates the connection after a statement ran on the writer:
// pins it when the statement changed session state, and advances the
// watermark when the statement may have committed a write. inj is the
// ride-along capture from armCapture, if any.
func (cn *Conn) afterWriter(ctx context.Context, cls *sqlclass.Result, err error, inj *wire.Injection) {
	w := cn.writer
	commits := cn.commits(cls)
	if w.pg == nil {
		switch cls.Tx {
		case sqlclass.TxBegin:
			w.txOpen = err == nil || w.txOpen
		case sqlclass.TxCommit, sqlclass.TxRollback:
			w.txOpen = false
		}
	}
	if inj != nil {
		w.wire.Disarm()
		if !cn.awaitInjection(ctx, w, inj) {
			inj = nil
		}
	}
	if err != nil {
		// Failed writes commit nothing; a failed statement in a transaction
		// block leaves it aborted, to be rolled back.
		return
	}
	if cls.Pin {
		cn.pinned = true
	}
	if !w.idle() && cls.Tx != sqlclass.TxCommit {
		// Inside a transaction block (an Exec'd BEGIN): remember whether it
		// wrote, for its COMMIT.
		if cls.Tx == sqlclass.TxBegin && !cls.Write {
			cn.blockWrote = false
		} else if commits {
			cn.blockWrote = true
		}
		return
	}
	if cls.Tx != sqlclass.TxNone {
		cn.blockWrote = false
	}
	// COMMIT AND CHAIN leaves a new block open, but the commit happened and
	// a position read after it covers it.
	if !cn.c.cfg.ReadYourWrites || !commits {
		return
	}
	if inj != nil && inj.Err() != nil {
		w.injectionFailed(stmtCapture, inj.Err())
	}
	if inj != nil && inj.Sent() && inj.Err() == nil {
		if row, null := inj.Row(); len(row) == 2 && !null[0] {
			if l, perr := parseCapture(row); perr == nil {
				cn.c.stats.captures.Add(1)
				cn.advance(l)
				return
			}
		}
	}
	cn.captureCommit(ctx)
}

// awaitInjection reads the rest of a ride-along statement's answer. The
// statement has run whatever the caller's context says now, so a cancelled
// context gets a short one of ours. If the answer cannot be read the
// connection is out of step with the server and is closed; database/sql then
// discards it. It reports whether the answer is usable.
func (cn *Conn) awaitInjection(ctx context.Context, b *backend, inj *wire.Injection) bool {
	if !inj.Sent() {
		return false
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := b.wire.Await(actx, inj); err != nil {
		b.close()
		return false
	}
	return true
}

// captureCommit reads the writer's position after a commit with a round trip
// of its own and advances the watermarks. The commit has happened whatever
// the caller's context says now, so a cancelled context gets a short one of
// our own. If the position cannot be read at all, the session is marked so
// the next replica read captures one first (any later position covers this
// commit).
func (cn *Conn) captureCommit(ctx context.Context) {
	l, err := capture(ctx, cn.writer)
	if err != nil && ctx.Err() != nil && !cn.writer.closed() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		l, err = capture(cctx, cn.writer)
		cancel()
	}
	if err != nil {
		cn.c.stats.captureFailures.Add(1)
		cn.setLost(true)
		return
	}
	cn.c.stats.captures.Add(1)
	cn.advance(l)
}

// setLost marks (or clears) a commit whose position is unknown, on this
// connection and with session_scope=db on the pool.
func (cn *Conn) setLost(lost bool) {
	cn.sess.lost.Store(lost)
	if cn.c.cfg.SessionScope == ScopeDB {
		cn.c.db.lost.Store(lost)
	}
}

// advance raises the watermarks this connection answers to, and records the
// writer's position for lag estimates.
func (cn *Conn) advance(l lsn.LSN) {
	cn.c.topo.hist.add(l, time.Now().UnixNano())
	cn.raise(l)
}

// raise lifts the watermarks to l without recording it as a writer position
// (monotonic reads: a replica read raises them to what it saw).
func (cn *Conn) raise(l lsn.LSN) {
	cn.sess.wm.Advance(l)
	if cn.c.cfg.SessionScope == ScopeDB {
		cn.c.db.wm.Advance(l)
	}
}

// watermark returns the position a replica read must see: this connection's
// and, with session_scope=db, the pool's. If a commit's position was lost it
// captures a fresh one first.
func (cn *Conn) watermark(ctx context.Context) (lsn.LSN, error) {
	if !cn.c.cfg.ReadYourWrites {
		return 0, nil
	}
	db := cn.c.cfg.SessionScope == ScopeDB
	if cn.sess.lost.Load() || db && cn.c.db.lost.Load() {
		cn.setLost(false)
		l, err := capture(ctx, cn.writer)
		if err != nil {
			cn.setLost(true)
			return 0, err
		}
		cn.c.stats.captures.Add(1)
		cn.advance(l)
	}
	wm := cn.sess.wm.Load()
	if db {
		wm = max(wm, cn.c.db.wm.Load())
	}
	return wm, nil
}

// replica returns this connection's backend for replica n, connecting on
// first use.
func (cn *Conn) replica(ctx context.Context, n *node) (*backend, error) {
	if b := cn.replicas[n.index]; b != nil {
		if !b.closed() {
			return b, nil
		}
		b.close()
		cn.replicas[n.index] = nil
	}
	dc, err := cn.c.dial(ctx, n)
	if err != nil {
		return nil, err
	}
	b := newBackend(dc, n)
	cn.replicas[n.index] = b
	return b, nil
}

func (cn *Conn) dropReplica(b *backend) {
	if cn.replicas[b.node.index] == b {
		cn.replicas[b.node.index] = nil
	}
	b.close()
}

// errUseWriter tells callers that a read belongs on the writer after all; it
// never reaches the application.
var errUseWriter = errors.New("pgryw: use the writer")

// nextReplica picks and connects a replica for a read that needs wm. check
// reports that the replica is not known to have replayed wm: the caller must
// check (or wait) on it before using its answer. It returns errUseWriter when
// no replica is usable, and applies on_timeout at once when every usable
// replica is known to be too far behind to catch up within the budget (so a
// lag event does not hold a replica connection per read for the whole
// budget): errUseWriter, a *ReplicaBehindError, or (stale) the least behind
// replica with check false.
func (cn *Conn) nextReplica(ctx context.Context, wm lsn.LSN, tried *uint64) (b *backend, check bool, err error) {
	for {
		n, hopeless := cn.c.topo.pick(wm, *tried, cn.c.cfg.WaitTimeout)
		if n == nil {
			return nil, false, errUseWriter
		}
		if hopeless {
			if err := cn.behind(n, wm); err != nil {
				return nil, false, err
			}
		}
		*tried |= 1 << uint(n.index%64)
		b, err := cn.replica(ctx, n)
		if err != nil {
			if ctx.Err() != nil {
				return nil, false, ctx.Err()
			}
			n.markDown()
			continue
		}
		if n.notStandby.Load() {
			continue
		}
		return b, !hopeless && wm > 0 && n.knownReplay() < wm, nil
	}
}

// behind decides what a read does when replica n did not (or, by its
// measured lag, will not) replay wm in time: errUseWriter
// (on_timeout=primary), a *ReplicaBehindError (on_timeout=error), or nil to
// serve the replica's rows anyway (on_timeout=stale).
func (cn *Conn) behind(n *node, wm lsn.LSN) error {
	switch cn.c.cfg.OnTimeout {
	case OnTimeoutError:
		cn.c.stats.behindErrors.Add(1)
		replayed := "unknown"
		if r := n.knownReplay(); r > 0 {
			replayed = r.String()
		}
		return &ReplicaBehindError{Replica: n.addr, Watermark: wm.String(), Replayed: replayed, Waited: cn.c.cfg.WaitTimeout}
	case OnTimeoutStale:
		cn.c.stats.staleReads.Add(1)
		return nil
	}
	return errUseWriter
}

// attempt is one read on one replica: its answer, until used or discarded.
type attempt struct {
	b       *backend
	run     func(*backend) (func(), error)
	discard func()
	ran     bool
	err     error
}

func (a *attempt) read() {
	a.discard, a.err = a.run(a.b)
	a.ran = true
}

// drop discards the answer, whatever it was.
func (a *attempt) drop() {
	if a.discard != nil {
		a.discard()
	}
	a.discard, a.err, a.ran = nil, nil, false
}

// pipelinedAttempts bounds how many times a read is sent along with a check
// that then fails: each failure wastes one execution of the read, so after
// these, pgryw polls alone and sends the read once the replica is there.
const pipelinedAttempts = 4

// onReplica runs a read on a replica that has replayed the session's
// watermark. When a replica is not known to have, its check (a replay
// position poll, or WAIT FOR on PostgreSQL 19) rides in the same flush as
// the read, and the read's answer is used only if the check passed; a failed
// check means discarding the answer (whatever it was, even an error: a table
// created a moment ago may not exist there yet), waiting, and reading again.
// run performs the read on a backend and returns how to discard its answer.
// A read-only transaction's BEGIN goes this way too, with query "".
//
// onReplica reports onWriter when the statement must run on the writer
// instead: no replica is ready in time (on_timeout=primary), or a replica
// refused it as a write (SQLSTATE 25006, which means nothing ran; cls is
// updated). A replica whose connection fails is dropped and the next one
// tried: a read is safe to send again.
func (cn *Conn) onReplica(ctx context.Context, query string, cls *sqlclass.Result, run func(*backend) (func(), error)) (onWriter bool, err error) {
	wm, err := cn.watermark(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		return cn.toWriter(), nil
	}
	var tried uint64
	for {
		b, check, err := cn.nextReplica(ctx, wm, &tried)
		if errors.Is(err, errUseWriter) {
			return cn.toWriter(), nil
		}
		if err != nil {
			return false, err
		}
		a := attempt{b: b, run: run}
		res, chkErr := waitOK, error(nil)
		switch {
		case check && b.wire != nil:
			res, chkErr = cn.pipelined(ctx, &a, wm)
		case check:
			if res, chkErr = cn.c.waitReplica(ctx, b, wm); chkErr == nil && res == waitOK {
				a.read()
			}
		default:
			a.read()
		}
		if chkErr != nil {
			a.drop()
			if ctx.Err() != nil {
				return false, ctx.Err()
			}
			if cerr := cn.c.configError(b, chkErr); cerr != nil {
				return false, cerr
			}
			if b.closed() {
				cn.dropReplica(b)
			}
			b.node.markDown()
			continue
		}
		switch res {
		case waitNotStandby:
			a.drop()
			continue
		case waitTimeout, waitBehind:
			if perr := cn.behind(b.node, wm); perr != nil {
				a.drop()
				if perr == errUseWriter {
					return cn.toWriter(), nil
				}
				return false, perr
			}
			if !a.ran {
				a.read() // on_timeout=stale
			}
		}
		if a.err == nil {
			if !b.stillStandby() {
				// Promoted after this read was answered: the answer stands
				// (it has everything the node replayed), the node does not.
				b.node.notStandby.Store(true)
			}
			cn.c.stats.replicaReads.Add(1)
			if res == waitOK {
				// Monotonic reads: a later read must not see an older
				// snapshot on another replica.
				cn.raise(b.node.knownReplay())
			}
			return false, nil
		}
		if ctx.Err() != nil {
			return false, a.err
		}
		var pgErr *pgconn.PgError
		if errors.As(a.err, &pgErr) {
			if pgErr.Code == "25006" && query != "" {
				cn.c.classes.learnWrite(query)
				*cls = cn.c.classes.get(query)
				return true, nil
			}
			return false, a.err
		}
		if b.closed() || errors.Is(a.err, driver.ErrBadConn) || pgconn.SafeToRetry(a.err) {
			cn.dropReplica(b)
			b.node.markDown()
			continue
		}
		return false, a.err
	}
}

// pipelined sends the read with its check in one flush and, while a polled
// replica is merely behind, tries again within the budget: with the check
// for the first few tries (so the answer costs no extra round trip when the
// replica gets there), then polling alone and reading once it is there. With
// WAIT FOR the server does the waiting, so one try says it all.
func (cn *Conn) pipelined(ctx context.Context, a *attempt, wm lsn.LSN) (waitResult, error) {
	b := a.b
	deadline := time.Now().Add(cn.c.cfg.WaitTimeout)
	for i := 0; ; i++ {
		if i < pipelinedAttempts || cn.c.useWaitFor(b) {
			inj := cn.c.armCheck(b, wm)
			a.read()
			b.wire.Disarm()
			res, err := cn.c.checked(b, inj, wm)
			if err != nil || res != waitBehind {
				return res, err
			}
		} else {
			res, err := cn.c.pollOnce(ctx, b, wm)
			if err != nil || res != waitBehind {
				if err == nil && res == waitOK {
					a.read()
				}
				return res, err
			}
		}
		a.drop()
		left := time.Until(deadline)
		if left <= 0 {
			cn.c.stats.waitTimeouts.Add(1)
			return waitTimeout, nil
		}
		if i == 0 {
			cn.c.stats.waits.Add(1)
		}
		if err := sleepCtx(ctx, min(cn.c.pollDelay(b.node, wm, i), left)); err != nil {
			return waitTimeout, err
		}
	}
}

// toWriter counts a read sent to the writer instead of a replica.
func (cn *Conn) toWriter() bool {
	cn.c.stats.writerReads.Add(1)
	cn.c.stats.fallbacks.Add(1)
	return true
}

var (
	_ driver.Conn               = (*Conn)(nil)
	_ driver.ConnBeginTx        = (*Conn)(nil)
	_ driver.ConnPrepareContext = (*Conn)(nil)
	_ driver.ExecerContext      = (*Conn)(nil)
	_ driver.QueryerContext     = (*Conn)(nil)
	_ driver.NamedValueChecker  = (*Conn)(nil)
	_ driver.Pinger             = (*Conn)(nil)
	_ driver.SessionResetter    = (*Conn)(nil)
	_ driver.Validator          = (*Conn)(nil)
)

// Connector returns the connector this connection belongs to.
func (cn *Conn) Connector() *Connector { return cn.c }
