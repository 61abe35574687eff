package pgryw

import (
	"context"
	"database/sql/driver"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgryw/pgryw/internal/lsn"
	"github.com/pgryw/pgryw/internal/wire"
)

// One attempt of a replica read on one replica: the statement sent with
// its check in front (pipelined, waiting.go) and its replay poll behind,
// its answer used or discarded, and what the poll says the read saw; and
// the statement itself, as every executor runs it (stmtOp).

// attempt is one read on one replica: its answer, until used or discarded.
type attempt struct {
	ctx   context.Context
	cn    *Conn
	b     *backend
	op    *stmtOp
	trail bool            // a replay poll rides behind the read
	post  *wire.Injection // that poll, once armed
	ran   bool
	err   error
	// unset: the replica refused the connection's settings, which rode in
	// front of the read; its answer must not be used.
	unset bool
	// known: the read went without a check, the monitor having seen the
	// replica get there while it waited (waiting.try).
	known bool
}

func (a *attempt) read() {
	if a.cn.poll.b == a.b {
		a.cn.settlePoll(a.ctx) // its slot is about to be reused
	}
	var set *wire.Injection
	if a.b.applied.version != a.cn.sess.set.version {
		set = a.cn.armSettings(a.b)
	}
	if w := a.b.wire; w != nil {
		if a.trail && a.cn.c.cfg.ReadYourWrites && a.cn.c.trailPolls() && !a.b.peer.TxPooled {
			a.post = a.b.injectPrepared(&a.b.post, stmtPoll, sqlPoll)
			w.AppendAfterExec(a.post)
		}
	}
	peek := a.op.kind == opPgxBatch && a.b.wire != nil
	if peek {
		a.b.wire.Watch()
	}
	a.err = a.op.run(a.b)
	a.ran = true
	if w := a.b.wire; w != nil {
		w.Disarm()
	}
	if peek {
		a.err = a.b.peekBatch(a.ctx)
	}
	if set != nil && a.op.lazy() {
		a.cn.await(a.ctx, a.b, set) // nothing of the answer was read yet
	}
	a.unset = set != nil && a.cn.settledSettings(a.b, set)
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
			cn.unbounded, cn.unboundedAt, cn.unboundedInst = b, cn.c.opened.Load(), b.peer.Instance
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
				b.node.record(eventRefused)
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
			b.node.record(eventPromoted)
		}
		cn.markLost(ctx, false)
		return
	}
	cn.c.topo.observe(b.node, b.peer.Instance, l, inj.SentAt(), time.Now().UnixNano())
	cn.sess.wm.Advance(l)
}

// The statement as the executors run it. Both front ends hand the core one
// stmtOp per statement, database/sql's (Conn's entry points) and pgx's
// (Pool, PoolConn, their transactions): the plan decides where it runs,
// the executors (runPrimary, onReplica, a transaction) run it on a backend
// with run, and the front end takes the answer from the op in its own
// types. So the routing, the waits, the captures and the session state are
// one code for both.

// opKind is what a stmtOp runs.
type opKind uint8

const (
	opQuery    opKind = iota // database/sql QueryContext: driver.Rows
	opExec                   // database/sql ExecContext: a driver.Result
	opBegin                  // database/sql BeginTx
	opEnd                    // the end (COMMIT or ROLLBACK) of a read-only transaction on a replica
	opPgxQuery               // pgx Query: pgx.Rows
	opPgxExec                // pgx Exec: a command tag
	opPgxBatch               // pgx SendBatch: batch results
	opPgxBegin               // pgx BeginTx
)

// stmtOp is the application's statement as an executor runs it on the
// backend it chose, and its answer. A struct kept in the Conn
// (Conn.startOp) rather than closures over the caller's variables: a
// routed statement allocates nothing of pgryw's own.
type stmtOp struct {
	kind  opKind
	ctx   context.Context
	query string
	args  []driver.NamedValue // database/sql's arguments
	// st is database/sql's prepared statement: on a backend where it was
	// prepared, the statement runs through it.
	st   *stmt
	opts driver.TxOptions // opBegin
	end  func() error     // opEnd

	pargs []any         // pgx's arguments, options such as a pgx.QueryExecMode first
	batch *pgx.Batch    // opPgxBatch
	live  *bool         // opPgxBatch on a replica: the attempt's callbacks are the caller's (attemptBatch)
	popts pgx.TxOptions // opPgxBegin
	// ahead: pgx's Query reads the first row before returning, as pgx's
	// stdlib does for database/sql: a replica's check riding in front has
	// answered by then, a replica that fails the read before any row
	// reached the caller is passed over for another node, and a stale
	// description is sent again. A statement that may write returns as
	// pgx's does, before any answer. For a batch
	// (on a replica, where an attempt may be discarded and the batch sent
	// again): what is sent is a copy without the caller's callbacks,
	// which run from the results that stand (pgxBatch.Close).
	ahead bool

	ok      bool    // run succeeded: there is an answer to discard
	checked lsn.LSN // the watermark the replica was known or checked to have replayed
	rows    driver.Rows
	res     driver.Result
	tx      txInner  // opBegin, opPgxBegin
	on      *backend // opBegin, opPgxBegin: where tx is open

	prows pgx.Rows
	more  bool  // ahead: what the first Next said
	qerr  error // opPgxQuery: the error pgx's Query returned; the others reach the caller through the rows
	tag   pgconn.CommandTag
	bres  pgx.BatchResults
}

// native reports whether the op is pgx's front end's: its errors reach the
// caller as pgx gives them, with no database/sql retry behind them.
func (o *stmtOp) native() bool { return o.kind >= opPgxQuery }

// begins reports whether the op opens a transaction.
func (o *stmtOp) begins() bool { return o.kind == opBegin || o.kind == opPgxBegin }

// open reports whether a successful op's answer is still to be read by the
// caller (rows, batch results): the statement's outcome is known once it
// has been.
func (o *stmtOp) open() bool {
	return o.kind == opQuery || o.kind == opPgxQuery || o.kind == opPgxBatch
}

// lazy reports whether run returns before any of the server's answer has
// been read: whatever rode in front of the statement is read explicitly.
func (o *stmtOp) lazy() bool { return o.kind == opPgxBatch || o.kind == opPgxQuery && !o.ahead }

// run sends the statement on b.
func (o *stmtOp) run(b *backend) error {
	var err error
	switch o.kind {
	case opQuery:
		o.rows, err = b.queryVia(o.ctx, o.st, o.query, o.args)
	case opExec:
		o.res, err = b.execVia(o.ctx, o.st, o.query, o.args)
	case opBegin:
		var t driver.Tx
		if t, err = b.conn.(driver.ConnBeginTx).BeginTx(o.ctx, o.opts); err == nil {
			o.tx, o.on = sqlTx{t}, b
		}
	case opEnd:
		err = o.end()
	case opPgxQuery:
		err = o.pgxQuery(b)
	case opPgxExec:
		o.tag, err = b.pgx().Exec(o.ctx, o.query, o.pargs...)
	case opPgxBatch:
		bt := o.batch
		if o.ahead {
			o.live = new(bool)
			*o.live = true
			bt = attemptBatch(bt, o.live)
		}
		o.bres = b.pgx().SendBatch(o.ctx, bt)
	case opPgxBegin:
		var t pgx.Tx
		if t, err = b.pgx().BeginTx(o.ctx, o.popts); err == nil {
			o.tx, o.on = pgxTx{t}, b
		}
	}
	o.ok = err == nil
	return err
}

// pgxQuery runs pgx's Query, and with ahead reads the first row: its error,
// or the rows', is the statement's.
func (o *stmtOp) pgxQuery(b *backend) error {
	o.prows, o.qerr = b.pgx().Query(o.ctx, o.query, o.pargs...)
	o.more = false
	if o.qerr != nil || !o.ahead {
		return o.qerr
	}
	o.more = o.prows.Next()
	return o.prows.Err()
}

// discard throws away an answer that will not be used: after it, the op
// holds none.
func (o *stmtOp) discard() {
	if o.ok {
		switch o.kind {
		case opQuery:
			o.rows.Close()
		case opBegin, opPgxBegin:
			o.tx.rollback(o.ctx)
		case opPgxQuery:
			o.prows.Close()
		case opPgxBatch:
			if o.live != nil {
				*o.live = false // its callbacks only read their result now
			}
			o.bres.Close()
		}
	}
	o.ok = false
	o.rows, o.res, o.tx, o.on = nil, nil, nil, nil
	o.prows, o.qerr, o.more, o.bres = nil, nil, false, nil
}

// txInner is a front end's open transaction on one backend: database/sql's
// driver.Tx or pgx's pgx.Tx.
type txInner interface {
	commit(ctx context.Context) error
	rollback(ctx context.Context) error
}

// sqlTx is database/sql's transaction, as pgx's stdlib driver opened it.
type sqlTx struct{ driver.Tx }

func (t sqlTx) commit(context.Context) error   { return t.Tx.Commit() }
func (t sqlTx) rollback(context.Context) error { return t.Tx.Rollback() }

// pgxTx is pgx's transaction.
type pgxTx struct{ pgx.Tx }

func (t pgxTx) commit(ctx context.Context) error   { return t.Tx.Commit(ctx) }
func (t pgxTx) rollback(ctx context.Context) error { return t.Tx.Rollback(ctx) }

// attemptBatch returns a new batch of b's statements for one attempt on a
// replica: pgx keeps what it learned of each statement in the batch it
// sent (a batch is sent once), and an attempt may be discarded and the
// batch sent again. Each of the caller's callbacks runs, as pgx runs it
// (from Close, with pgx's order and errors), while live holds; once the
// attempt is discarded (live false) it only reads its result, so the
// caller's callbacks run once, with the results that stand.
func attemptBatch(b *pgx.Batch, live *bool) *pgx.Batch {
	nb := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, len(b.QueuedQueries))}
	for i, q := range b.QueuedQueries {
		nq := &pgx.QueuedQuery{SQL: q.SQL, Arguments: q.Arguments}
		if fn := q.Fn; fn != nil {
			nq.Fn = func(br pgx.BatchResults) error {
				if !*live {
					_, err := br.Exec()
					return err
				}
				return fn(br)
			}
		}
		nb.QueuedQueries[i] = nq
	}
	return nb
}
