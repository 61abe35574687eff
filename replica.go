package pgryw

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgryw/pgryw/internal/lsn"
	"github.com/pgryw/pgryw/internal/sqlclass"
)

// The replica read: pick a replica, make sure it has replayed the session's
// watermark (a check riding in front of the read, or a wait), run the read,
// and learn from a replay-position poll riding behind it an upper bound of
// what the read saw, which becomes the connection's floor for its next
// read (monotonic reads).

// replica returns this connection's backend for replica n: the one it
// holds, else one borrowed from n's idle connections, else a new one; a
// held one opened before n was last down is replaced. So is one, held or
// lent, that carried nothing for idleLook and that the server has ended
// meanwhile (its idle_session_timeout, while this connection only wrote
// or sat in n's pool): nothing of the caller's is lost with it, the
// session's settings ride in front of the next read on the new one.
func (cn *Conn) replica(ctx context.Context, n *node) (*backend, error) {
	ups := n.ups.Load()
	if b := cn.replicas[n.index]; b != nil {
		if b.current(ups) && !(b.touch() && b.gone()) {
			return b, nil
		}
		b.close()
		cn.replicas[n.index] = nil
	}
	for {
		b := n.idle.get(ups)
		if b == nil {
			break
		}
		if b.touch() && b.gone() {
			b.close()
			continue
		}
		cn.replicas[n.index] = b
		return b, nil
	}
	dc, err := cn.c.dial(ctx, n, forConn)
	if err != nil {
		return nil, err
	}
	b := newBackend(dc, n)
	b.born = cn.c.opened.Add(1)
	cn.replicas[n.index] = b
	return b, nil
}

// releaseReplicas gives the replica connections this connection holds
// back to their replicas' pools, for any Conn's next read: all but one
// that still serves it (a read-only transaction, rows still open, a
// statement prepared there), that is out of step, or that was given a
// custom parameter (app.tenant): a session that had one keeps it defined,
// as ”, after a reset, where a new session has none. A replay poll left
// riding behind its last read is settled first (it bounds what the read
// saw); it is normally in by now.
func (cn *Conn) releaseReplicas() {
	if cn.tx != nil {
		return
	}
	for i, b := range cn.replicas {
		if b == nil {
			continue
		}
		if cn.poll.b == b {
			ctx, cancel := context.WithTimeout(context.Background(), releaseWait)
			cn.settlePoll(ctx)
			cancel()
		}
		if b.closed() || b.preps > 0 || b.custom || !b.idle() || b.pg.IsBusy() {
			continue
		}
		cn.replicas[i] = nil
		b.node.idle.put(b, int(cn.c.conns.Load()))
	}
}

// releaseWait bounds how long releaseReplicas waits for a poll's answer: a
// connection whose answer does not come by then is closed.
const releaseWait = time.Second

func (cn *Conn) dropReplica(b *backend) {
	if cn.replicas[b.node.index] == b {
		cn.replicas[b.node.index] = nil
	}
	b.close()
}

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
			n.record(eventDown)
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
// updated). p's route says which (plan.fellBack). A replica whose
// connection fails is dropped and the next one tried: a read is safe to
// send again. What each attempt's outcome leads to is the table in next.
func (cn *Conn) onReplica(ctx context.Context, query string, cls *sqlclass.Result, p *plan, trail bool, op *stmtOp) (onPrimary bool, done func(error), err error) {
	cn.obs = stmtObs{}
	// r holds the plan and the classification by value, and gives them
	// back at the end: pointers to the caller's stack in r would make both
	// escape, and a replica read allocate.
	r := replicaRead{ctx: ctx, cn: cn, query: query, cls: *cls, p: *p, trail: trail, op: op}
	defer func() { *cls, *p = r.cls, r.p }()
	// The connection's own write may have returned before its position
	// arrived (deferred.go). A poll in front of the read does not need the
	// position: it is sent at once, and the position, which has arrived by
	// the time the read's answer has, is compared with the poll's answer
	// then (pipelined). Not with on_timeout=stale, whose choice of replica
	// needs the whole watermark.
	if cn.owed {
		cn.captureOwed(ctx)
	}
	r.spec = cn.speculate()
	if r.wm, err = cn.watermarkBut(ctx, r.spec); err != nil {
		return r.positionLost()
	}
	for {
		b, check, stale, err := cn.nextReplica(ctx, r.wm, &r.tried, &r.busy)
		if errors.Is(err, errUsePrimary) {
			return r.fellBack(nil, outNoReplica)
		}
		if err != nil {
			return false, nil, err
		}
		att := attempt{ctx: ctx, cn: cn, b: b, op: op, trail: trail} // on the stack
		a := &att
		o, err := r.try(a, check, stale)
		if o == outBehind {
			if o, err = r.behind(a); o == outBehind {
				o = r.answer(a) // on_timeout=stale: the answer stands, if usable
			}
		}
		switch next(o, r.retriedStale) {
		case stepDone:
			return r.served(a)
		case stepFail:
			a.drop()
			return false, nil, err
		case stepPrimary:
			a.drop()
			return r.fellBack(b, o)
		case stepSame:
			a.drop()
			if err := r.again(b, o); err != nil {
				return r.positionLost()
			}
		case stepOther:
			a.drop()
			r.skip(b, o)
		}
	}
}

// speculate returns the connection's own capture still on its way, which a
// poll in front of the read does not need; nil where there is none, or the
// whole watermark is needed first (on_timeout=stale).
func (cn *Conn) speculate() *pendingCapture {
	if cn.pending == nil || !cn.c.cfg.ReadYourWrites || cn.c.cfg.OnTimeout == OnTimeoutStale {
		return nil
	}
	return cn.inFlight()
}

// replicaRead is onReplica's state across its attempts.
type replicaRead struct {
	ctx   context.Context
	cn    *Conn
	query string
	cls   sqlclass.Result
	p     plan
	trail bool
	op    *stmtOp
	// spec: the connection's own capture still on its way, which wm does
	// not count (pipelined's partial).
	spec         *pendingCapture
	wm           lsn.LSN
	tried        uint64 // the replicas tried, by index bit
	busy         *node  // a replica passed over for max_waits
	retriedStale bool   // a stale description was read again once
	idleEnded    int    // connections found ended by the server for idleness (outIdleEnded)
	checked      bool   // the last attempt's read had a check riding with it
	refusedCode  string // outRefusedAsStandby's SQLSTATE
}

// outcome is what one attempt on a replica came to: its check's result, or
// what its answer says.
type outcome uint8

const (
	outAnswer           outcome = iota // the answer stands: rows, or the caller's error
	outFailed                          // the caller gets an error (the context's end, a configuration error)
	outPositionLost                    // the watermark could not be read
	outCheckRefused                    // the check was refused: the node refuses such reads for a while
	outCheckFault                      // the check failed with the connection
	outNotStandby                      // the node was promoted
	outCannotWait                      // the session holds a lock there that pgryw did not take
	outBusy                            // passed over for max_waits
	outUnchecked                       // no check can ride with this read there (a transaction pooler)
	outBehind                          // not replayed within the budget: on_timeout decides
	outBehindPrimary                   // … and it said the primary
	outSettingsRefused                 // the replica refused the connection's settings
	outSettingsPooled                  // settings cannot travel behind a transaction pooler
	outUnbounded                       // the last read ran on another server connection, unbounded
	outReadOnly                        // SQLSTATE 25006: it writes after all
	outRefusedByStandby                // the standby refused to start the transaction
	outRefusedAsStandby                // refused because it is a standby (an unlogged table …)
	outStaleDescription                // pgx's cached description predates a schema change
	outIdleEnded                       // the server had ended the connection for idleness: another one
	outFault                           // failed before any row: a fault, a shutdown, a conflict
	outNoReplica                       // no replica is usable, or on_timeout sent it to the primary at once
	outcomes
)

// step is what onReplica does after an attempt.
type step uint8

const (
	stepDone    step = iota // return the answer
	stepFail                // return the error
	stepPrimary             // run the statement on the primary
	stepSame                // try the same replica again
	stepOther               // try another replica
)

// next is the executor's outcome table, a pure function (replica_test.go
// holds its table).
func next(o outcome, retriedStale bool) step {
	switch o {
	case outAnswer:
		return stepDone
	case outFailed:
		return stepFail
	case outPositionLost, outBehindPrimary, outSettingsRefused, outSettingsPooled,
		outReadOnly, outRefusedByStandby, outRefusedAsStandby, outNoReplica:
		return stepPrimary
	case outUnbounded, outIdleEnded:
		return stepSame
	case outStaleDescription:
		if !retriedStale {
			return stepSame
		}
	}
	return stepOther
}

const (
	eventNone     nodeEvent = iota
	eventDown               // unreachable: probed by the monitor from now on
	eventGone               // eventDown if its connection closed
	eventRefused            // refuses such reads: left out for refusedBackoff
	eventPromoted           // no longer a standby
)

// connRule says whether an outcome closes the connection to its replica.
type connRule uint8

const (
	keepConn     connRule = iota
	dropIfClosed          // the outcome closed it: forget it
	dropConn              // close it (it may hold what pgryw did not take)
)

// effect is what an outcome does to the node and to the connection to it,
// and the reason ServedBy and the node's counters give for passing over it.
type effect struct {
	event nodeEvent
	why   Fallback
	conn  connRule
}

// effects is, per outcome, its effect.
var effects = [outcomes]effect{
	outCheckRefused:     {eventRefused, FallbackRefused, dropIfClosed},
	outCheckFault:       {eventDown, FallbackUnreachable, dropIfClosed},
	outNotStandby:       {eventNone, FallbackPromoted, keepConn},
	outCannotWait:       {eventNone, FallbackCannotWait, dropConn},
	outUnchecked:        {eventNone, FallbackCannotWait, keepConn},
	outRefusedByStandby: {eventRefused, FallbackRefused, keepConn},
	outRefusedAsStandby: {eventNone, FallbackRefused, keepConn},
	outFault:            {eventGone, FallbackUnreachable, dropIfClosed},
	// Not the node's fault: the connection had sat idle, behind a caller
	// busy elsewhere (replicaRead.again drops it).
	outIdleEnded: {eventNone, FallbackNone, dropIfClosed},
}

// try runs one attempt on b: the watermark made whole or the check armed as
// needed, then the read, and says what came of the check.
func (r *replicaRead) try(a *attempt, check, stale bool) (outcome, error) {
	cn, b := r.cn, a.b
	r.checked = false
	if b.peer.TxPooled && len(cn.sess.set.names) > 0 {
		return outSettingsPooled, nil
	}
	if u := cn.unbounded; u != nil && !cn.bounds(u, b) {
		return outUnbounded, nil
	}
	if r.spec != nil && !stale && (cn.pending != r.spec || cn.c.methodFor(b) != WaitPoll) {
		var err error
		if check, err = r.whole(b); err != nil {
			return r.lost(err)
		}
	}
	if !check && (r.spec == nil || stale) {
		a.read()
		return r.answer(a), nil
	}
	res, err := cn.checkedRead(r.ctx, a, &r.wm, r.spec != nil)
	r.checked = !a.known // ServedBy.Checked: a check rode with the answer used
	r.spec = nil
	if err != nil {
		return r.checkFailed(b, err)
	}
	if o := waitOutcomes[res]; o != outAnswer {
		return o, nil
	}
	return r.answer(a), nil
}

// bounds reports whether a read on b sees at least what this connection's
// last replica read, unbounded on u, saw: b is u, or a connection to the
// same server instance that was open when that read's answer was in (the
// connections lent from a replica's pool are): one that lived through the
// read and is still open has seen no restart since, which could take the
// server back to an earlier consistent point, and replay only moves
// forward. If b was closed meanwhile, the read on it fails, and the next
// connection is checked again.
func (cn *Conn) bounds(u, b *backend) bool {
	return u == b || u.node == b.node && cn.unboundedInst != 0 && b.peer.Instance == cn.unboundedInst && b.born <= cn.unboundedAt
}

// whole reads the whole watermark before the read: the capture was settled
// meanwhile (wm does not count it), or the server waits, and does better
// with the position in hand, which is due within microseconds, than with a
// poll that, finding the replica behind, costs a second round trip before
// the wait (measured on PostgreSQL 19: p50 1.07x the spin floor this way,
// 1.09x with the poll). check reports that b must be checked for it.
func (r *replicaRead) whole(b *backend) (check bool, err error) {
	r.spec = nil
	if r.wm, err = r.cn.watermark(r.ctx); err != nil {
		return false, err
	}
	return r.wm > 0 && b.node.knownReplayOn(b) < r.wm, nil
}

// waitOutcomes is the outcome of each check result; waitOK's is the read's
// answer's (replicaRead.answer).
var waitOutcomes = [...]outcome{
	waitOK:         outAnswer,
	waitNotStandby: outNotStandby,
	waitCannot:     outCannotWait,
	waitBusy:       outBusy,
	waitUnchecked:  outUnchecked,
	waitRecheck:    outUnchecked,
	waitTimeout:    outBehind,
	waitBehind:     outBehind,
}

// checkFailed is the outcome of a check on b that failed with err.
func (r *replicaRead) checkFailed(b *backend, err error) (outcome, error) {
	switch {
	case errors.Is(err, errPositionLost):
		return r.lost(err)
	case r.ctx.Err() != nil:
		return outFailed, r.ctx.Err()
	case r.endedIdle(b):
		return outIdleEnded, nil
	}
	if cerr := r.cn.c.configError(b, err); cerr != nil {
		return outFailed, cerr
	}
	if isRefusal(err) {
		return outCheckRefused, nil
	}
	return outCheckFault, nil
}

// lost is the outcome of a watermark that could not be read: the context's
// end, or else the primary.
func (r *replicaRead) lost(err error) (outcome, error) {
	if cerr := r.ctx.Err(); cerr != nil {
		return outFailed, cerr
	}
	return outPositionLost, err
}

// behind applies on_timeout (and max_fallback) to a replica found behind:
// the primary, a *ReplicaBehindError, or its answer anyway (outBehind),
// read now if it was not.
func (r *replicaRead) behind(a *attempt) (outcome, error) {
	switch err := r.cn.behind(r.ctx, a.b.node, r.wm, ""); {
	case err == errUsePrimary:
		return outBehindPrimary, nil
	case err != nil:
		return outFailed, err
	}
	if !a.ran {
		a.read()
	}
	return outBehind, nil
}

// answer says what the read's answer is: one that stands, or one that
// shows the read must go elsewhere (nothing ran, or nothing reached the
// caller).
func (r *replicaRead) answer(a *attempt) outcome {
	b := a.b
	switch {
	case (a.err != nil || a.unset) && r.ctx.Err() == nil && r.endedIdle(b):
		return outIdleEnded
	case a.unset:
		return outSettingsRefused
	case a.err == nil, r.ctx.Err() != nil:
		return outAnswer
	}
	var pgErr *pgconn.PgError
	if errors.As(a.err, &pgErr) {
		if o := r.refusal(pgErr); o != outAnswer {
			return o
		}
	}
	if b.closed() || errors.Is(a.err, driver.ErrBadConn) || pgconn.SafeToRetry(a.err) || pgErr != nil && replicaFault(pgErr) {
		// The replica failed the read before any row reached the caller
		// (pgx reads the first row before returning): a read is safe to
		// send again, to another node.
		return outFault
	}
	return outAnswer
}

// maxIdleEnded bounds how many connections one read takes in turn after
// finding each ended by the server for idleness: a node's lent
// connections may all have sat idle; a new one has not.
const maxIdleEnded = 3

// endedIdle reports that b's server ended its session for idleness
// (idle_session_timeout): b sat idle while its Conn was busy elsewhere,
// or in its node's pool, and the timer fired as the read went out, after
// the look in front of it. A read may be sent again; the node is not at
// fault.
func (r *replicaRead) endedIdle(b *backend) bool {
	ended, _ := b.endedIdle()
	return ended && r.idleEnded < maxIdleEnded
}

// refusal is the outcome of a server error that says nothing ran and the
// statement belongs elsewhere, or outAnswer.
func (r *replicaRead) refusal(pgErr *pgconn.PgError) outcome {
	switch {
	case pgErr.Code == sqlstateReadOnly && r.query != "":
		return outReadOnly
	case refusedByStandby(pgErr):
		// The standby refused to start the transaction (a database or
		// role default of SERIALIZABLE, say). The primary can run it.
		return outRefusedByStandby
	case isStaleDescription(pgErr):
		// A description pgx cached before a schema change (the session's
		// own or another's ALTER TABLE, replayed here, or taken by a
		// discarded attempt): pgx has dropped it. Read again.
		return outStaleDescription
	case r.query != "" && refusedAsStandby(pgErr):
		// Refused because it is a standby (an unlogged table, a WAL
		// function during recovery): the primary gives the answer pgx
		// would.
		r.refusedCode = pgErr.Code
		return outRefusedAsStandby
	}
	return outAnswer
}

// served returns an answer that stands, and settles what it saw.
func (r *replicaRead) served(a *attempt) (bool, func(error), error) {
	cn, b := r.cn, a.b
	cn.obs.wm, cn.obs.checked = r.wm, r.checked
	if a.err != nil {
		err := a.err
		a.finish()
		cn.servedReplica(r.ctx, b.node, r.p.route, r.query == "")
		return false, nil, err
	}
	if !b.stillStandby() {
		// Promoted after this read was answered: the answer stands (it
		// has everything the node replayed), the node does not.
		b.node.record(eventPromoted)
	}
	cn.c.stats.replicaReads.Add(1)
	cn.servedReplica(r.ctx, b.node, r.p.route, r.query == "")
	r.op.checked = r.wm
	switch {
	case !r.trail:
		return false, nil, nil
	case a.post == nil:
		// Nothing rides behind the read (one replica: see trailPolls):
		// nothing to read after its rows, so the caller's rows need no
		// wrapper to settle it.
		a.finish()
		return false, nil, nil
	}
	ctx, inj := r.ctx, a.post
	return false, func(error) { cn.finishRead(ctx, b, inj, true) }, nil
}

// skip passes over b's node after outcome o, for another replica.
func (r *replicaRead) skip(b *backend, o outcome) {
	if o == outBusy {
		r.busy = b.node
		return
	}
	r.learn(b, o)
}

// learn applies outcome o's effect on b and its node.
func (r *replicaRead) learn(b *backend, o outcome) {
	e := effects[o]
	closed := b.closed()
	if e.conn == dropConn || e.conn == dropIfClosed && closed {
		r.cn.dropReplica(b)
	}
	ev := e.event
	if ev == eventGone {
		ev = eventNone
		if closed {
			ev = eventDown
		}
	}
	b.node.record(ev)
	if e.why != FallbackNone {
		r.cn.skip(b.node, e.why)
	}
}

// again makes b's replica eligible for the next try after outcome o. After
// outUnbounded it needs a primary position first, and an error means that
// could not be read.
func (r *replicaRead) again(b *backend, o outcome) error {
	r.tried &^= 1 << uint(b.node.index%64)
	if o == outIdleEnded {
		// Another connection to the same replica: nothing was lost with
		// this one, the session's settings go with the read.
		r.idleEnded++
		r.cn.dropReplica(b)
		return nil
	}
	if o != outUnbounded {
		r.retriedStale = true
		return nil
	}
	// The connection's last replica read ran on another server
	// connection, and no poll bounded what it saw: only a primary position
	// does now.
	cn := r.cn
	cn.unbounded = nil
	cn.markLost(r.ctx, false)
	r.spec = nil
	var err error
	r.wm, err = cn.watermark(r.ctx)
	return err
}

// positionLost is onReplica's answer when the watermark a read needs could
// not be read: the context's end, or else the primary.
func (r *replicaRead) positionLost() (bool, func(error), error) {
	if err := r.ctx.Err(); err != nil {
		return false, nil, err
	}
	return r.fellBack(nil, outPositionLost)
}

// fellBack sends the statement to the primary after outcome o on b's
// replica (b nil: before any attempt).
func (r *replicaRead) fellBack(b *backend, o outcome) (bool, func(error), error) {
	cn := r.cn
	if r.op.kind == opPgxBatch && (o == outReadOnly || o == outRefusedAsStandby) {
		// Which of a batch's statements was refused is not known: the
		// batch goes to the primary, and nothing is learned. One that
		// writes after all (25006) commits there as a write.
		if b != nil {
			r.learn(b, o)
		}
		if o == outReadOnly {
			r.cls.Write, r.cls.Reason = true, "refused by a replica (25006)"
		}
		r.p.fellBack(o == outReadOnly)
		return cn.toPrimary(), nil, nil
	}
	switch o {
	case outReadOnly:
		cn.c.classes.learnWrite(r.query)
		r.cls = cn.c.classes.get(r.query)
		r.p.fellBack(true)
		return true, nil, nil
	case outRefusedAsStandby:
		// It stays there from now on.
		cn.c.classes.learnPrimary(r.query, r.refusedCode)
		r.cls = cn.c.classes.get(r.query)
	case outSettingsRefused:
		// The replica would not take the connection's settings: its reads
		// stay on the primary, where the settings are.
		cn.sess.set.refused = cn.sess.set.version
		cn.setPins(cn.pins|pinSettings, "settings a replica refused")
	case outSettingsPooled:
		// Behind a transaction pooler a setting cannot be made to travel
		// with the read (it would stay on whichever server connection
		// took it, for other clients): the reads stay on the primary, as
		// with pgx.
		cn.sess.set.refused = cn.sess.set.version
		cn.setPins(cn.pins|pinSettings, "session settings behind a transaction pooler")
	case outPositionLost:
		cn.skip(nil, FallbackPositionLost)
	}
	if b != nil {
		r.learn(b, o)
	}
	r.p.fellBack(false)
	return cn.toPrimary(), nil, nil
}

// toPrimary counts a read sent to the primary instead of a replica.
func (cn *Conn) toPrimary() bool {
	cn.c.stats.primaryReads.Add(1)
	cn.c.stats.fallbacks.Add(1)
	cn.fellBack()
	return true
}
