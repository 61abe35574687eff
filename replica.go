package pgryw

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgryw/pgryw/internal/ctxsleep"
	"github.com/pgryw/pgryw/internal/lsn"
	"github.com/pgryw/pgryw/internal/sqlclass"
	"github.com/pgryw/pgryw/internal/wire"
)

// The replica read: pick a replica, make sure it has replayed the session's
// watermark (a check riding in front of the read, or a wait), run the read,
// and learn from a replay-position poll riding behind it an upper bound of
// what the read saw, which becomes the connection's floor for its next
// read (monotonic reads).

// replica returns this connection's backend for replica n, connecting on
// first use, and anew when n was down since the connection was opened.
func (cn *Conn) replica(ctx context.Context, n *node) (*backend, error) {
	if b := cn.replicas[n.index]; b != nil {
		if !b.closed() && b.ups == n.ups.Load() {
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

// errPositionLost: the watermark a read needs could not be read (see
// pipelined); the read goes to the primary, as when watermark fails.
var errPositionLost = errors.New("pgryw: the session's position could not be read")

// errUsePrimary tells callers that a read belongs on the primary after all; it
// never reaches the application.
var errUsePrimary = errors.New("pgryw: use the primary")

// nextReplica picks and connects a replica for a read that needs wm. check
// reports that the replica is not known to have replayed wm: the caller must
// check (or wait) on it before using its answer; stale, that the read is
// to be served by it unchecked (an overload bound or on_timeout said so). It returns errUsePrimary when
// no replica is usable, and applies on_timeout at once when every usable
// replica is known to be too far behind to catch up within the budget (so a
// lag event does not hold a replica connection per read for the whole
// budget): errUsePrimary, a *ReplicaBehindError, or (stale) the least behind
// replica with check false. So it does, with *busy, when every replica left
// was passed over for max_waits (and clears *busy).
func (cn *Conn) nextReplica(ctx context.Context, wm lsn.LSN, tried *uint64, busy **node) (b *backend, check, stale bool, err error) {
	for {
		var budget time.Duration // only a replica behind wm needs it
		if wm > 0 {
			budget = cn.c.budget(ctx)
		}
		n, hopeless := cn.c.topo.pick(wm, *tried, budget)
		limit := ""
		switch {
		case n == nil && *busy != nil:
			n, hopeless, limit = *busy, true, fmt.Sprintf("max_waits=%d", cn.c.cfg.MaxWaits)
			*busy = nil
		case n == nil:
			return nil, false, false, errUsePrimary
		case hopeless:
			limit = cn.c.hopelessLimit(n)
		}
		if hopeless {
			if err := cn.behind(ctx, n, wm, limit); err != nil {
				return nil, false, false, err
			}
		}
		*tried |= 1 << uint(n.index%64)
		b, err := cn.replica(ctx, n)
		if err != nil {
			if ctx.Err() != nil {
				return nil, false, false, ctx.Err()
			}
			if errors.Is(err, errForeign) {
				cn.skip(n, FallbackForeign)
				continue
			}
			n.markDown()
			cn.skip(n, FallbackUnreachable)
			continue
		}
		if n.notStandby.Load() {
			cn.skip(n, FallbackPromoted)
			continue
		}
		return b, !hopeless && wm > 0 && n.knownReplayOn(b) < wm, hopeless, nil
	}
}

// behind decides what a read does when replica n did not (or, by its
// measured lag, will not) replay wm in time, or an overload bound (limit, as
// in ReplicaBehindError) rules it out: errUsePrimary (on_timeout=primary,
// within max_fallback), a *ReplicaBehindError (on_timeout=error), or nil to
// serve the replica's rows anyway (on_timeout=stale).
func (cn *Conn) behind(ctx context.Context, n *node, wm lsn.LSN, limit string) error {
	cn.skip(n, FallbackBehind)
	switch cn.c.cfg.OnTimeout {
	case OnTimeoutError:
		cn.c.stats.behindErrors.Add(1)
		waited := cn.c.cfg.WaitTimeout
		if limit != "" {
			waited = 0
		}
		return behindError(n, wm, waited, limit)
	case OnTimeoutStale:
		cn.c.stats.staleReads.Add(1)
		return nil
	}
	return cn.fallback(ctx, n, wm)
}

// attempt is one read on one replica: its answer, until used or discarded.
type attempt struct {
	ctx   context.Context
	cn    *Conn
	b     *backend
	op    *replicaOp
	trail bool            // a replay poll rides behind the read
	post  *wire.Injection // that poll, once armed
	ran   bool
	err   error
	// unset: the replica refused the connection's settings, which rode in
	// front of the read; its answer must not be used.
	unset bool
}

// opKind is what a replicaOp runs.
type opKind uint8

const (
	opQuery opKind = iota // QueryContext: rows
	opExec                // ExecContext: a result
	opBegin               // BeginTx: a read-only transaction
	opEnd                 // the end (COMMIT or ROLLBACK) of one
)

// replicaOp is the application's statement as an attempt runs it on the
// replica it chose, and its answer. A struct kept in the Conn
// (Conn.startOp) rather than closures over the caller's variables: a
// replica read allocates nothing of pgryw's own.
type replicaOp struct {
	kind  opKind
	ctx   context.Context
	query string
	args  []driver.NamedValue
	opts  driver.TxOptions // opBegin
	end   func() error     // opEnd

	ok      bool    // run succeeded: there is an answer to discard
	checked lsn.LSN // the watermark the replica was known or checked to have replayed
	rows    driver.Rows
	res     driver.Result
	tx      driver.Tx
	on      *backend // opBegin: where tx is open
}

// run sends the statement on b.
func (o *replicaOp) run(b *backend) error {
	var err error
	switch o.kind {
	case opQuery:
		o.rows, err = b.query(o.ctx, o.query, o.args)
	case opExec:
		o.res, err = b.exec(o.ctx, o.query, o.args)
	case opBegin:
		var t driver.Tx
		if t, err = b.conn.(driver.ConnBeginTx).BeginTx(o.ctx, o.opts); err == nil {
			o.tx, o.on = t, b
		}
	case opEnd:
		err = o.end()
	}
	o.ok = err == nil
	return err
}

// discard throws away an answer that will not be used.
func (o *replicaOp) discard() {
	if !o.ok {
		return
	}
	o.ok = false
	switch o.kind {
	case opQuery:
		o.rows.Close()
	case opBegin:
		o.tx.Rollback()
		o.tx = nil
	}
}

func (a *attempt) read() {
	if a.cn.poll.b == a.b {
		a.cn.settlePoll(a.ctx) // its slot is about to be reused
	}
	set := a.cn.armSettings(a.b)
	if w := a.b.wire; w != nil {
		if a.trail && a.cn.c.cfg.ReadYourWrites && a.cn.c.trailPolls() && !a.b.peer.TxPooled {
			a.post = a.b.injectPrepared(&a.b.post, stmtPoll, sqlPoll)
			w.AppendAfterExec(a.post)
		}
	}
	a.err = a.op.run(a.b)
	a.ran = true
	if w := a.b.wire; w != nil {
		w.Disarm()
	}
	a.unset = a.cn.settledSettings(a.b, set)
}

// drop discards the answer, whatever it was. A discarded read may leave a
// statement description in pgx's cache taken while the replica was behind
// (say, before the session's own ALTER TABLE … ADD COLUMN); its next
// execution then fails with "cached plan must not change result type"
// before running, and onReplica reads again.
func (a *attempt) drop() {
	a.op.discard()
	if a.post != nil {
		a.cn.await(a.ctx, a.b, a.post) // its slot is about to be reused
		a.post = nil
	}
	a.err, a.ran = nil, false
}

// finish settles a read that was served: it reads the replay position that
// rode behind it and raises the connection's floor to it. Without one, the
// floor is marked lost and the next replica read captures a primary position
// first. The poll's answer comes after the read's own ReadyForQuery: when it
// is not in yet, the read returns without it, and the connection's next
// replica read, which is the first to need the floor, settles it
// (settlePoll).
func (a *attempt) finish() {
	inj := a.post
	a.post = nil
	a.cn.finishRead(a.ctx, a.b, inj, a.trail)
}

// finishRead is attempt.finish, by value: a read whose rows are still open
// calls it when they are closed, after its attempt is gone.
func (cn *Conn) finishRead(ctx context.Context, b *backend, inj *wire.Injection, trail bool) {
	if inj == nil {
		switch {
		case !trail || !cn.c.cfg.ReadYourWrites:
		case !cn.c.trailPolls() && !b.peer.TxPooled:
			cn.unbounded = b
		case b.wire != nil:
			cn.markLost(ctx, false)
		}
		return
	}
	cn.unbounded = nil
	if inj.Sent() && !inj.Done() && !b.closed() && cn.poll.b == nil {
		b.wire.Disarm()
		cn.poll = pendingPoll{b: b, inj: inj}
		return
	}
	cn.applyPoll(ctx, b, inj)
}

// trailPolls reports whether a replay poll rides behind each replica read to
// bound what it saw. With one replica it does not: a connection's replica
// reads all run on the same server connection to that replica, whose replay
// position never goes backwards, so the read is its own bound
// (Conn.unbounded), and the primary has everything a standby of it replayed.
// Only a read on another server connection (the replica was reconnected,
// perhaps restarted, which can take it back to an earlier consistent point)
// needs the floor; it then reads a fresh primary position first (onReplica).
func (c *Connector) trailPolls() bool { return len(c.topo.replicas) > 1 }

// pendingPoll is a read's trailing replay poll whose answer had not arrived
// when the read returned.
type pendingPoll struct {
	b   *backend
	inj *wire.Injection
}

// settlePoll applies the connection's pending replay poll, waiting for its
// answer within ctx: before the connection's next replica read, which needs
// the floor and would reuse the poll's slot.
func (cn *Conn) settlePoll(ctx context.Context) {
	if p := cn.poll; p.b != nil {
		cn.poll = pendingPoll{}
		cn.applyPoll(ctx, p.b, p.inj)
	}
}

// applyPoll reads a trailing replay poll's answer and raises the
// connection's floor to it, or marks the floor lost.
func (cn *Conn) applyPoll(ctx context.Context, b *backend, inj *wire.Injection) {
	if !cn.await(ctx, b, inj) || inj.Err() != nil {
		if err := inj.Err(); err != nil {
			b.injectionFailed(stmtPoll, err)
			if isRefusal(err) {
				b.node.markRefused()
			}
		}
		cn.markLost(ctx, false)
		return
	}
	row, null := inj.Row()
	l, known, inRecovery, err := parsePoll(row, null)
	if err != nil || !known || !inRecovery {
		// Promoted while reading: the read may have seen writes of the new
		// history; only a primary position bounds it.
		if err == nil && !inRecovery {
			b.node.notStandby.Store(true)
		}
		cn.markLost(ctx, false)
		return
	}
	cn.c.topo.observe(b.node, b.peer.Instance, l, time.Now().UnixNano())
	cn.sess.wm.Advance(l)
}

// refusedBackoff is how long a replica that refused to start a transaction
// under the session's defaults is left out: the defaults come from the DSN,
// the role or the database, and rarely change.
const refusedBackoff = time.Minute

// markRefused leaves n out of reads for refusedBackoff.
func (n *node) markRefused() {
	n.downUntil.Store(time.Now().Add(refusedBackoff).UnixNano())
	n.obs.refusedUntil.Store(n.downUntil.Load())
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
// op is the read, which each attempt runs on its backend, and its answer.
// With trail, a replay poll rides behind the read; done, when not nil, must
// be called once the read's answer has been consumed (at once for Exec, when
// its rows are closed for Query) to learn what the read saw. A read-only
// transaction's BEGIN goes this way too, with query "" and no trail.
//
// onReplica reports onPrimary when the statement must run on the primary
// instead: no replica is ready in time (on_timeout=primary), or a replica
// refused it as a write (SQLSTATE 25006, which means nothing ran; cls is
// updated). A replica whose connection fails is dropped and the next one
// tried: a read is safe to send again.
func (cn *Conn) onReplica(ctx context.Context, query string, cls *sqlclass.Result, trail bool, op *replicaOp) (onPrimary bool, done func(), err error) {
	cn.obs = stmtObs{}
	// The connection's own write may have returned before its position
	// arrived (deferred.go). A poll in front of the read does not need the
	// position: it is sent at once, and the position, which has arrived by
	// the time the read's answer has, is compared with the poll's answer
	// then (pipelined). Not with on_timeout=stale, whose choice of replica
	// needs the whole watermark.
	var spec *pendingCapture
	if cn.c.cfg.ReadYourWrites && cn.c.cfg.OnTimeout != OnTimeoutStale {
		spec = cn.inFlight()
	}
	wm, err := cn.watermarkBut(ctx, spec)
	if err != nil {
		return cn.positionLost(ctx)
	}
	var tried uint64
	var busy *node // a replica passed over for max_waits
	retriedStale := false
	for {
		b, check, stale, err := cn.nextReplica(ctx, wm, &tried, &busy)
		if errors.Is(err, errUsePrimary) {
			return cn.toPrimary(), nil, nil
		}
		if err != nil {
			return false, nil, err
		}
		if b.peer.TxPooled && len(cn.sess.set.names) > 0 {
			// Behind a transaction pooler a setting cannot be made to
			// travel with the read (it would stay on whichever server
			// connection took it, for other clients): the reads stay on
			// the primary, as with pgx.
			cn.sess.set.refused = cn.sess.set.version
			cn.setPins(cn.pins|pinSettings, "session settings behind a transaction pooler")
			return cn.toPrimary(), nil, nil
		}
		if u := cn.unbounded; u != nil && u != b {
			// The connection's last replica read ran on another server
			// connection, and no poll bounded what it saw: only a primary
			// position does now.
			cn.unbounded = nil
			cn.markLost(ctx, false)
			spec = nil
			if wm, err = cn.watermark(ctx); err != nil {
				return cn.positionLost(ctx)
			}
			tried &^= 1 << uint(b.node.index%64)
			continue
		}
		if spec != nil && !stale && (cn.pending != spec || cn.c.methodFor(b) != WaitPoll) {
			// The whole watermark before the read: the capture was
			// settled meanwhile (wm does not count it), or the server
			// waits, and does better with the position in hand, which
			// is due within microseconds, than with a poll that,
			// finding the replica behind, costs a second round trip
			// before the wait (measured on PostgreSQL 19: p50 1.07x the
			// spin floor this way, 1.09x with the poll).
			spec = nil
			if wm, err = cn.watermark(ctx); err != nil {
				return cn.positionLost(ctx)
			}
			check = wm > 0 && b.node.knownReplayOn(b) < wm
		}
		att := attempt{ctx: ctx, cn: cn, b: b, op: op, trail: trail} // on the stack: see the trail case below
		a := &att
		res, chkErr := waitOK, error(nil)
		switch {
		case check || spec != nil && !stale:
			res, chkErr = cn.checkedRead(ctx, a, &wm, spec != nil)
			spec = nil
		default:
			a.read()
		}
		if chkErr != nil {
			a.drop()
			if ctx.Err() != nil {
				return false, nil, ctx.Err()
			}
			if errors.Is(chkErr, errPositionLost) {
				return cn.positionLost(ctx)
			}
			if cerr := cn.c.configError(b, chkErr); cerr != nil {
				return false, nil, cerr
			}
			if b.closed() {
				cn.dropReplica(b)
			}
			if isRefusal(chkErr) {
				b.node.markRefused()
				cn.skip(b.node, FallbackRefused)
			} else {
				b.node.markDown()
				cn.skip(b.node, FallbackUnreachable)
			}
			continue
		}
		switch res {
		case waitNotStandby:
			a.drop()
			cn.skip(b.node, FallbackPromoted)
			continue
		case waitCannot:
			// The session holds a lock there that pgryw did not take (a
			// function it was told reads only took one): closing the
			// connection releases it, and the read goes elsewhere.
			a.drop()
			cn.dropReplica(b)
			cn.skip(b.node, FallbackCannotWait)
			continue
		case waitBusy:
			a.drop()
			busy = b.node
			continue
		case waitUnchecked:
			a.drop()
			cn.skip(b.node, FallbackCannotWait)
			continue
		case waitTimeout, waitBehind:
			if perr := cn.behind(ctx, b.node, wm, ""); perr != nil {
				a.drop()
				if perr == errUsePrimary {
					return cn.toPrimary(), nil, nil
				}
				return false, nil, perr
			}
			if !a.ran {
				a.read() // on_timeout=stale
			}
		}
		if a.unset {
			// The replica would not take the connection's settings: its
			// reads stay on the primary, where the settings are.
			a.drop()
			cn.sess.set.refused = cn.sess.set.version
			cn.setPins(cn.pins|pinSettings, "settings a replica refused")
			return cn.toPrimary(), nil, nil
		}
		if a.err == nil {
			if !b.stillStandby() {
				// Promoted after this read was answered: the answer stands
				// (it has everything the node replayed), the node does not.
				b.node.notStandby.Store(true)
			}
			cn.c.stats.replicaReads.Add(1)
			cn.servedReplica(ctx, b.node, cls, query == "")
			op.checked = wm
			switch {
			case !trail:
				return false, nil, nil
			case a.post == nil:
				// Nothing rides behind the read (one replica: see
				// trailPolls): nothing to read after its rows, so the
				// caller's rows need no wrapper to settle it.
				a.finish()
				return false, nil, nil
			}
			inj := a.post
			return false, func() { cn.finishRead(ctx, b, inj, true) }, nil
		}
		if ctx.Err() != nil {
			err := a.err
			a.finish()
			cn.servedReplica(ctx, b.node, cls, query == "")
			return false, nil, err
		}
		var pgErr *pgconn.PgError
		isPg := errors.As(a.err, &pgErr)
		if isPg && pgErr.Code == sqlstateReadOnly && query != "" {
			a.drop()
			cn.c.classes.learnWrite(query)
			*cls = cn.c.classes.get(query)
			return true, nil, nil
		}
		if isPg && refusedByStandby(pgErr) {
			// Nothing ran: the standby refused to start the transaction
			// (a database or role default of SERIALIZABLE, say). The
			// primary can run it.
			a.drop()
			b.node.markRefused()
			cn.skip(b.node, FallbackRefused)
			return cn.toPrimary(), nil, nil
		}
		if isPg && query != "" && refusedAsStandby(pgErr) && !isStaleDescription(pgErr) {
			// Refused because it is a standby (an unlogged table, a WAL
			// function during recovery): nothing ran, and the primary
			// gives the answer pgx would. It stays there from now on.
			a.drop()
			cn.c.classes.learnPrimary(query, pgErr.Code)
			*cls = cn.c.classes.get(query)
			cn.skip(b.node, FallbackRefused)
			return cn.toPrimary(), nil, nil
		}
		if isPg && isStaleDescription(pgErr) {
			// A description pgx cached before a schema change (the
			// session's own or another's ALTER TABLE, replayed here, or
			// taken by a discarded attempt): pgx has dropped it, and
			// nothing ran. Read again.
			a.drop()
			if !retriedStale {
				retriedStale = true
				tried &^= 1 << uint(b.node.index%64)
			}
			continue
		}
		if b.closed() || errors.Is(a.err, driver.ErrBadConn) || pgconn.SafeToRetry(a.err) || isPg && replicaFault(pgErr) {
			// The replica failed the read before any row reached the
			// caller (pgx reads the first row before returning): a
			// connection fault, a shutdown, a recovery conflict. A read
			// is safe to send again, to another node.
			a.drop()
			if b.closed() {
				cn.dropReplica(b)
				b.node.markDown()
			}
			cn.skip(b.node, FallbackUnreachable)
			continue
		}
		err = a.err
		a.finish()
		cn.servedReplica(ctx, b.node, cls, query == "")
		return false, nil, err
	}
}

// pipelined sends the read with its check in one flush and, while a polled
// replica is merely behind, tries again within the budget: with the check
// for the first few tries (so the answer costs no extra round trip when the
// replica gets there), then polling alone and reading once it is there. With
// WAIT FOR or PolarDB's wait the server does the waiting, so one try says
// it all.
//
// A read waits on the replica only with one of max_waits' places: taken
// before a server-side wait is sent, or before polling starts. Without one
// it gets a check that does not wait (a replay position poll riding in
// front of it, whatever the server), and waitBusy if that finds the
// replica behind.
//
// With partial (polling only), the connection's own capture behind its last
// write was still on its way when the read began, and *wm does not count
// it: the poll needs no position, *wm is made whole once the read's answer
// is in, and the poll's answer is compared with that. A replica found
// behind is then waited for as usual.
func (cn *Conn) pipelined(ctx context.Context, a *attempt, wm *lsn.LSN, partial bool) (waitResult, error) {
	b := a.b
	budget := cn.c.budget(ctx)
	method := cn.c.methodFor(b)
	serverWaits := method != WaitPoll
	held, over := false, false
	if serverWaits {
		held = cn.c.enterWait(b.node)
		over = !held
		if over {
			method, serverWaits = WaitPoll, false
		}
	}
	defer func() {
		if held {
			cn.c.leaveWait(b.node)
		}
	}()
	deadline := time.Now().Add(budget)
	// Behind a transaction pooler the check must run in the read's own
	// implicit transaction, chained in front of its extended-protocol
	// execution: a transaction of its own could reach another server
	// connection, and after a repoint another server, than the read.
	// Where it cannot (a simple-protocol read, PolarDB's SETs), the read
	// is not checked on the replica at all.
	// (pgx sends a transaction's BEGIN as a simple Query, always.)
	pooled := b.peer.TxPooled
	if pooled && (b.noChain || method == WaitPolar || a.op.kind == opBegin) {
		return waitUnchecked, nil
	}
	for i := 0; ; i++ {
		if i < pipelinedAttempts || serverWaits || pooled {
			inj := cn.c.armCheck(b, method, *wm, max(time.Until(deadline), time.Millisecond))
			notices := b.wire.Notices()
			a.read()
			if partial {
				partial = false
				w, err := cn.watermark(ctx) // settles the capture first
				if err != nil {
					return waitTimeout, fmt.Errorf("%w: %w", errPositionLost, err)
				}
				*wm = w
			}
			if pooled && !inj.Sent() {
				// A read in the simple protocol: the connection's reads
				// are (default_query_exec_mode=simple_protocol).
				a.drop()
				b.noChain = b.noChain || inj.Refused()
				return waitUnchecked, nil
			}
			if a.unset {
				return waitOK, nil
			}
			res, err := cn.c.checked(b, method, inj, *wm)
			if err == nil && res == waitOK && method == WaitPolar {
				res = cn.c.polarOutcome(b, a, *wm, notices)
			}
			if err == nil && inj.Err() != nil {
				a.drop() // the server skipped the read behind the check
			}
			if err != nil || res != waitBehind {
				return res, err
			}
		} else {
			res, err := cn.c.pollOnce(ctx, b, *wm)
			if err != nil || res != waitBehind {
				if err == nil && res == waitOK {
					a.read()
				}
				return res, err
			}
		}
		a.drop()
		left := time.Until(deadline)
		if !held && !over && left > 0 {
			held = cn.c.enterWait(b.node)
			over = !held
		}
		if over {
			return waitBusy, nil
		}
		if left <= 0 {
			cn.c.stats.waitTimeouts.Add(1)
			return waitTimeout, nil
		}
		if i == 0 {
			cn.c.stats.waits.Add(1)
			cn.obs.waited = true
		}
		if err := ctxsleep.Sleep(ctx, min(cn.c.pollDelay(b.node, *wm, i), left)); err != nil {
			return waitTimeout, err
		}
	}
}

// positionLost is onReplica's answer when the watermark a read needs could
// not be read: the context's end, or else the primary.
func (cn *Conn) positionLost(ctx context.Context) (onPrimary bool, done func(), err error) {
	if err := ctx.Err(); err != nil {
		return false, nil, err
	}
	cn.skip(nil, FallbackPositionLost)
	return cn.toPrimary(), nil, nil
}

// toPrimary counts a read sent to the primary instead of a replica.
func (cn *Conn) toPrimary() bool {
	cn.c.stats.primaryReads.Add(1)
	cn.c.stats.fallbacks.Add(1)
	cn.fellBack()
	return true
}
