package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/pgryw/pgryw/internal/ctxsleep"
	"github.com/pgryw/pgryw/internal/lsn"
)

// The wire-level models: pgryw's message patterns, and variations of them,
// sent by hand on raw protocol connections, with none of database/sql's,
// pgx's or pgryw's Go code in between. Measured in the same run as pgryw,
// they say where pgryw's time goes (the round trips and server work its
// pattern costs, against its Go overhead) and what another pattern would
// give. They run only when named in -strategies ("all" names them all).
//
//	wire-insert         the insert alone: Bind/Execute/Sync of a prepared INSERT
//	wire-capture        the insert with pgryw's capture behind it in the same
//	                    flush (Bind/Execute/Sync of a prepared
//	                    SELECT pg_current_wal_insert_lsn(), ...); write = until
//	                    the capture's answer (what pgryw waits for), "own" =
//	                    until the insert's own answer (where a write could return)
//	wire-fastcap        the insert with a fast-path FunctionCall of
//	                    pg_current_wal_insert_lsn behind it in the same flush:
//	                    pgryw's capture once the call is known to work
//	wire-one-sync       the insert in an explicit transaction with the capture
//	                    after its COMMIT, all before one Sync (Bind/Execute of
//	                    prepared BEGIN, INSERT, COMMIT and the capture, then
//	                    Sync): one answer, one flush from the server, where
//	                    wire-capture's two Syncs cost two
//
// Two read-only models read a row written before the run, with no write and
// no watermark, as pgryw-read and replica-read do:
//
//	wire-read           the read alone: Bind/Execute/Sync of the prepared read
//	wire-read-trail     the read with pgryw's trailing replay poll behind it in
//	                    the same flush, its answer awaited (pgryw's read with
//	                    no pending watermark)
//
// The read models insert like wire-capture (their read starts once the
// capture's answer is in, as pgryw's does) and then read the row on a
// replica:
//
//	wire-poll-spin      [replay poll][read] in one flush, again at once until
//	                    the poll says the replica has replayed the capture
//	wire-poll-trail     the same with pgryw's trailing replay poll behind the
//	                    read: pgryw's PostgreSQL ≤ 18 pattern, retried at once
//	wire-poll-backoff   pgryw's pattern with pgryw's sleep between tries when
//	                    no lag estimate is known (200µs doubling to 5ms)
//	wire-waitfor        [WAIT FOR LSN ... (a simple Query)][read] in one flush
//	                    (PostgreSQL ≥ 19)
//	wire-waitfor-trail  the same with the trailing replay poll: pgryw's
//	                    PostgreSQL 19 pattern
//	wire-do-wait        a DO block that loops on pg_last_wal_replay_lsn(),
//	                    committing each turn (so it holds no snapshot while
//	                    it waits) and raising on timeout, then the read, in
//	                    one Sync: the read does not run when the wait fails
const (
	wireInsert       = "wire-insert"
	wireCapture      = "wire-capture"
	wireOneSync      = "wire-one-sync"
	wireFastCap      = "wire-fastcap"
	wireRead         = "wire-read"
	wireReadTrail    = "wire-read-trail"
	wirePollSpin     = "wire-poll-spin"
	wirePollTrail    = "wire-poll-trail"
	wirePollBackoff  = "wire-poll-backoff"
	wireWaitFor      = "wire-waitfor"
	wireWaitForTrail = "wire-waitfor-trail"
	wireDoWait       = "wire-do-wait"
)

var modelStrategies = []string{wireInsert, wireCapture, wireFastCap, wireOneSync, wireRead, wireReadTrail, wirePollSpin, wirePollTrail, wirePollBackoff, wireWaitFor, wireWaitForTrail, wireDoWait}

// The statements the models prepare, by name. capture and poll are pgryw's
// (wait.go).
const (
	sqlCaptureModel = "SELECT pg_current_wal_insert_lsn(), current_setting('wal_block_size')"
	sqlPollModel    = "SELECT pg_last_wal_replay_lsn(), pg_is_in_recovery()"
	oidInt8         = 20
)

// model is one wire-level model strategy.
type model struct {
	kind        string
	budget      time.Duration
	primaryDSN  string
	replicaDSNs []string
	insertSQL   string
	getSQL      string

	prim    connPool
	repl    []connPool
	targets sync.Map // id → lsn.LSN, from the insert's capture to the read
}

func newModel(kind string, e *env, cfg *config) *model {
	ins, get := statements(tableName(kind))
	if kind == wireRead || kind == wireReadTrail {
		_, get = statements(preloadTable)
	}
	m := &model{kind: kind, budget: cfg.budget, primaryDSN: e.primaryDSN, replicaDSNs: cfg.replicaDSNs, insertSQL: ins, getSQL: get}
	m.prim = connPool{free: make(chan *rawConn, cfg.workers), dial: func(ctx context.Context) (*rawConn, error) {
		return dialRaw(ctx, m.primaryDSN, map[string]parsed{"ins": {ins, []uint32{oidInt8, oidInt8}}, "cap": {sqlCaptureModel, nil}, "begin": {"BEGIN", nil}, "commit": {"COMMIT", nil}}, kind == wireFastCap)
	}}
	for _, dsn := range cfg.replicaDSNs {
		m.repl = append(m.repl, connPool{free: make(chan *rawConn, cfg.workers), dial: func(ctx context.Context) (*rawConn, error) {
			return dialRaw(ctx, dsn, map[string]parsed{"get": {get, []uint32{oidInt8}}, "poll": {sqlPollModel, nil}}, false)
		}})
	}
	return m
}

func (m *model) name() string { return m.kind }

func (m *model) shape() shape { return shapeOf(m.kind) }

func (m *model) close() {
	m.prim.close()
	for i := range m.repl {
		m.repl[i].close()
	}
}

// insert writes the row; all but wire-insert read the primary's position
// riding behind it, as pgryw does, and keep it for the read.
func (m *model) insert(ctx context.Context, id, v int64) (time.Duration, error) {
	c, err := m.prim.get(ctx)
	if err != nil {
		return 0, err
	}
	defer m.prim.put(c)
	c.deadline(ctx, 5*time.Second)
	t0 := time.Now()
	idArg, vArg := strconv.AppendInt(nil, id, 10), strconv.AppendInt(nil, v, 10)
	oneSync := m.kind == wireOneSync
	capture := m.kind != wireInsert
	switch m.kind {
	case wireOneSync:
		c.execNoSync("begin")
		c.execNoSync("ins", idArg, vArg)
		c.execNoSync("commit")
		c.execPrepared("cap")
	case wireInsert:
		c.execPrepared("ins", idArg, vArg)
	case wireFastCap:
		c.execPrepared("ins", idArg, vArg)
		c.fe.Send(&pgproto3.FunctionCall{Function: c.captureFn})
	default:
		c.execPrepared("ins", idArg, vArg)
		c.execPrepared("cap")
	}
	if err := c.flush(); err != nil {
		return 0, c.broken(err)
	}
	g, err := c.group()
	if err != nil {
		return 0, err
	}
	if !capture {
		return 0, g.err
	}
	var early time.Duration
	if !oneSync {
		early = time.Since(t0)
		if g, err = c.group(); err != nil {
			return 0, err
		}
	}
	if g.err != nil {
		return 0, g.err
	}
	if m.kind == wireFastCap {
		if g.row == nil || g.row[0] == nil {
			return 0, errors.New("the fast-path capture returned no position")
		}
		at, err := lsn.Parse(string(g.row[0]))
		if err != nil {
			return 0, err
		}
		m.targets.Store(id, at)
		return early, nil
	}
	if len(g.row) != 2 || g.row[0] == nil || g.row[1] == nil {
		return 0, errors.New("capture returned no position")
	}
	at, err := lsn.Parse(string(g.row[0]))
	if err != nil {
		return 0, err
	}
	bs, err := strconv.ParseUint(string(g.row[1]), 10, 32)
	if err != nil || bs == 0 {
		return 0, fmt.Errorf("capture returned wal_block_size %q", g.row[1])
	}
	m.targets.Store(id, lsn.ReplayTarget(at, bs))
	return early, nil
}

func (m *model) read(ctx context.Context, id int64) (readOut, error) {
	var target lsn.LSN
	if m.shape() == insertRead {
		t, ok := m.targets.LoadAndDelete(id)
		if !ok {
			return readOut{}, errors.New("no captured position for the row")
		}
		target = t.(lsn.LSN)
	}
	pool := &m.repl[uint64(id)%uint64(len(m.repl))]
	c, err := pool.get(ctx)
	if err != nil {
		return readOut{}, err
	}
	defer pool.put(c)
	c.deadline(ctx, m.budget+5*time.Second)
	idArg := strconv.AppendInt(nil, id, 10)
	deadline := time.Now().Add(m.budget)
	for tries := 1; ; tries++ {
		var (
			check, get group
			err        error
		)
		trail := m.kind == wirePollTrail || m.kind == wirePollBackoff || m.kind == wireWaitForTrail || m.kind == wireReadTrail
		switch m.kind {
		case wireRead, wireReadTrail:
			c.execPrepared("get", idArg)
		case wireDoWait:
			c.execUnnamed(doWaitSQL(target, m.budget))
			c.fe.Send(&pgproto3.Bind{PreparedStatement: "get", Parameters: [][]byte{idArg}})
			c.fe.Send(&pgproto3.Execute{})
			c.fe.Send(&pgproto3.Sync{})
		case wireWaitFor, wireWaitForTrail:
			c.fe.Send(&pgproto3.Query{String: waitForModelSQL(target, time.Until(deadline))})
			c.execPrepared("get", idArg)
		default:
			c.execPrepared("poll")
			c.execPrepared("get", idArg)
		}
		if trail {
			c.execPrepared("poll")
		}
		if err := c.flush(); err != nil {
			return readOut{}, c.broken(err)
		}
		if m.kind != wireDoWait && m.shape() == insertRead {
			if check, err = c.group(); err != nil {
				return readOut{}, err
			}
		}
		if get, err = c.group(); err != nil {
			return readOut{}, err
		}
		if trail {
			if _, err := c.group(); err != nil {
				return readOut{}, err
			}
		}
		out := readOut{tries: tries}
		if len(get.row) == 2 {
			if get.row[0] != nil {
				v, err := strconv.ParseInt(string(get.row[0]), 10, 64)
				out.v = sql.NullInt64{Int64: v, Valid: err == nil}
			}
			out.port, _ = strconv.ParseInt(string(get.row[1]), 10, 64)
		}
		switch m.kind {
		case wireRead, wireReadTrail:
			return out, get.err
		case wireDoWait:
			// The wait raised (the read did not run) or the read failed.
			if get.err != nil && !errors.Is(get.err, errDoTimeout) {
				return out, get.err
			}
			return out, nil
		case wireWaitFor, wireWaitForTrail:
			if check.err != nil {
				return out, check.err
			}
			return out, get.err // a timeout shows as a stale read
		}
		if check.err != nil || get.err != nil {
			return out, errors.Join(check.err, get.err)
		}
		replayed := false
		if len(check.row) == 2 && check.row[0] != nil {
			if l, err := lsn.Parse(string(check.row[0])); err == nil {
				replayed = l >= target
			}
		}
		if replayed || !time.Now().Before(deadline) {
			return out, nil
		}
		if m.kind == wirePollBackoff {
			if err := ctxsleep.Sleep(ctx, min(200*time.Microsecond<<min(tries-1, 5), 5*time.Millisecond, time.Until(deadline))); err != nil {
				return out, err
			}
		}
	}
}

// waitForModelSQL is pgryw's WAIT FOR (wait.go).
func waitForModelSQL(target lsn.LSN, budget time.Duration) string {
	return fmt.Sprintf("WAIT FOR LSN '%s' WITH (MODE 'standby_replay', TIMEOUT '%dms', NO_THROW)", target, max(budget.Milliseconds(), 1))
}

// errDoTimeout is the SQLSTATE doWaitSQL raises on timeout.
const doTimeoutState = "PR001"

var errDoTimeout = errors.New("replica behind")

// doWaitSQL is a server-side wait a standby can run: it loops until the
// replay position reaches target, committing each turn (a DO block outside a
// transaction block may: each turn is a fresh transaction, so no snapshot is
// held across turns), and raises once budget has passed. The LSN and the
// budget are formatted from numbers we hold.
func doWaitSQL(target lsn.LSN, budget time.Duration) string {
	return fmt.Sprintf(`DO $$DECLARE t0 timestamptz := clock_timestamp(); BEGIN
LOOP
  IF pg_last_wal_replay_lsn() >= '%s'::pg_lsn THEN RETURN; END IF;
  COMMIT;
  IF clock_timestamp() - t0 > interval '%d milliseconds' THEN RAISE EXCEPTION USING ERRCODE = '%s', MESSAGE = 'replica behind'; END IF;
END LOOP;
END$$`, target, max(budget.Milliseconds(), 1), doTimeoutState)
}

// connPool hands out raw connections, at most one per worker at a time.
type connPool struct {
	free chan *rawConn
	dial func(context.Context) (*rawConn, error)
}

func (p *connPool) get(ctx context.Context) (*rawConn, error) {
	select {
	case c := <-p.free:
		return c, nil
	default:
		return p.dial(ctx)
	}
}

func (p *connPool) put(c *rawConn) {
	if c.dead {
		c.close()
		return
	}
	select {
	case p.free <- c:
	default:
		c.close()
	}
}

func (p *connPool) close() {
	for {
		select {
		case c := <-p.free:
			c.close()
		default:
			return
		}
	}
}

// rawConn is a server connection taken over from pgconn after the startup:
// frontend messages are written and backend messages read by hand.
type rawConn struct {
	nc   net.Conn
	fe   *pgproto3.Frontend
	dead bool
	// captureFn is pg_current_wal_insert_lsn()'s OID, for wire-fastcap.
	captureFn uint32
}

// parsed is a statement to prepare on a raw connection.
type parsed struct {
	sql  string
	oids []uint32
}

// dialRaw connects, prepares stmts and hands over the raw connection;
// captureFn looks up pg_current_wal_insert_lsn()'s OID first (wire-fastcap).
func dialRaw(ctx context.Context, dsn string, stmts map[string]parsed, captureFn bool) (*rawConn, error) {
	pc, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	if err := pc.SyncConn(ctx); err != nil {
		pc.Close(ctx)
		return nil, err
	}
	var fn uint32
	if captureFn {
		res := pc.ExecParams(ctx, "SELECT 'pg_catalog.pg_current_wal_insert_lsn()'::pg_catalog.regprocedure::pg_catalog.oid", nil, nil, nil, nil).Read()
		if res.Err != nil || len(res.Rows) != 1 {
			pc.Close(ctx)
			return nil, errors.Join(errors.New("looking up pg_current_wal_insert_lsn's OID"), res.Err)
		}
		if n, err := strconv.ParseUint(string(res.Rows[0][0]), 10, 32); err == nil {
			fn = uint32(n)
		}
	}
	hc, err := pc.Hijack()
	if err != nil {
		pc.Close(ctx)
		return nil, err
	}
	c := &rawConn{nc: hc.Conn, fe: pgproto3.NewFrontend(hc.Conn, hc.Conn), captureFn: fn}
	for name, st := range stmts {
		c.fe.Send(&pgproto3.Parse{Name: name, Query: st.sql, ParameterOIDs: st.oids})
	}
	c.fe.Send(&pgproto3.Sync{})
	c.deadline(ctx, 10*time.Second)
	if err := c.flush(); err != nil {
		c.close()
		return nil, err
	}
	g, err := c.group()
	if err == nil {
		err = g.err
	}
	if err != nil {
		c.close()
		return nil, fmt.Errorf("prepare: %w", err)
	}
	return c, nil
}

// deadline bounds the socket's next operations by ctx's deadline or d.
func (c *rawConn) deadline(ctx context.Context, d time.Duration) {
	dl := time.Now().Add(d)
	if cd, ok := ctx.Deadline(); ok && cd.Before(dl) {
		dl = cd
	}
	c.nc.SetDeadline(dl)
}

// execPrepared queues Bind/Execute/Sync of a prepared statement.
func (c *rawConn) execPrepared(name string, args ...[]byte) {
	c.fe.Send(&pgproto3.Bind{PreparedStatement: name, Parameters: args})
	c.fe.Send(&pgproto3.Execute{})
	c.fe.Send(&pgproto3.Sync{})
}

// execNoSync queues Bind/Execute of a prepared statement, with no Sync.
func (c *rawConn) execNoSync(name string, args ...[]byte) {
	c.fe.Send(&pgproto3.Bind{PreparedStatement: name, Parameters: args})
	c.fe.Send(&pgproto3.Execute{})
}

// execUnnamed queues Parse/Bind/Execute of a one-off text, with no Sync.
func (c *rawConn) execUnnamed(query string) {
	c.fe.Send(&pgproto3.Parse{Query: query})
	c.fe.Send(&pgproto3.Bind{})
	c.fe.Send(&pgproto3.Execute{})
}

func (c *rawConn) flush() error { return c.fe.Flush() }

func (c *rawConn) broken(err error) error {
	c.dead = true
	return err
}

func (c *rawConn) close() {
	c.fe.Send(&pgproto3.Terminate{})
	c.fe.Flush()
	c.nc.Close()
}

// group is the answer to one Sync or Query: its first row and its error.
type group struct {
	row [][]byte // nil entries are NULL
	err error
}

// group reads messages up to the next ReadyForQuery.
func (c *rawConn) group() (group, error) {
	var g group
	for {
		msg, err := c.fe.Receive()
		if err != nil {
			return g, c.broken(err)
		}
		switch msg := msg.(type) {
		case *pgproto3.DataRow:
			if g.row == nil {
				g.row = make([][]byte, len(msg.Values))
				for i, v := range msg.Values {
					if v != nil {
						g.row[i] = append([]byte{}, v...)
					}
				}
			}
		case *pgproto3.FunctionCallResponse:
			if g.row == nil {
				g.row = [][]byte{nil}
				if msg.Result != nil {
					g.row[0] = append([]byte{}, msg.Result...)
				}
			}
		case *pgproto3.ErrorResponse:
			if msg.Code == doTimeoutState {
				g.err = errDoTimeout
			} else {
				g.err = fmt.Errorf("server: %s (SQLSTATE %s)", msg.Message, msg.Code)
			}
		case *pgproto3.ReadyForQuery:
			return g, nil
		}
	}
}
