package pgryw_test

// TestTransparencyPgx is TestTransparency for pgx's front end: the same
// random programs (and batches, and COPY) run through pgryw's Pool, its
// acquired PoolConns and their pgx.Tx, against pgryw's primary and two
// lagging replicas under faults, and through pgxpool on the primary alone;
// every step is compared as TestTransparency compares them.
//
//	go test -run TestTransparencyPgx -args -tseed=N     replays a seed
//	PGRYW_TRANSPARENCY_PGX_PROGRAMS=N                   programs to run

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgryw/pgryw"
)

const tpPgxDefaultProgs = 10

func TestTransparencyPgx(t *testing.T) {
	tpCheck(t, true, "PGRYW_TRANSPARENCY_PGX_PROGRAMS", tpPgxDefaultProgs)
}

// tpPgxConn is what a program's session is on pgx's side and on pgryw's:
// a *pgxpool.Conn or a *pgryw.PoolConn.
type tpPgxConn interface {
	tpPgxQuerier
	BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	Conn() *pgx.Conn
	Release()
}

// tpPgxQuerier is what a step runs on: a pool, a connection or a
// transaction.
type tpPgxQuerier interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	Query(context.Context, string, ...any) (pgx.Rows, error)
	QueryRow(context.Context, string, ...any) pgx.Row
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
	CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error)
}

// tpNative is a side's state for pgx's front end.
type tpNative struct {
	xpool  *pgxpool.Pool // pgx's side
	pool   *pgryw.Pool   // pgryw's side
	pconns [tpSessions]tpPgxConn
	ptxs   [tpSessions]pgx.Tx
}

// openNative opens side i (0: pgxpool, 1: pgryw's Pool) for a program.
func (r *tpRun) openNative(i int, extra string) (*tpSide, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := r.dbs[i]
	err := tpResetTables(ctx, db, i)
	if err != nil {
		return nil, err
	}
	s := &tpSide{native: true, txOpen: &r.txOpen}
	s.opening = func() { s.txOpen.Add(1) }
	s.life, s.end = context.WithCancel(context.Background())
	// Sessions hold one connection each; the pool's own statements take
	// one more.
	size := "&pool_max_conns=" + strconv.Itoa(tpSessions+1)
	if i == 0 {
		s.xpool, err = pgxpool.New(ctx, tpDSN(db, extra)+size)
	} else {
		s.opening = func() {
			r.faultMu.Lock()
			r.txOpen.Add(1)
			for _, c := range r.nw.Conns(0) {
				if c.Port() != tpPrimaryPort() {
					c.Disarm()
				}
			}
			r.faultMu.Unlock()
		}
		dsn := tpDSN(db, extra) + size + "&wait_timeout=300ms" + r.rywKeys()
		var pc *pgryw.PoolConfig
		if pc, err = pgryw.ParsePoolConfig(dsn); err == nil {
			if s.pool, err = pgryw.NewPoolWithConfig(ctx, pc); err == nil {
				s.c = s.pool.Connector()
				pgryw.SetNetHook(s.c, r.nw.Wrap)
			}
		}
	}
	if err != nil {
		return nil, err
	}
	if s.obs, err = pgx.Connect(ctx, tpDSN(db, "")); err != nil {
		s.closeNative()
		return nil, err
	}
	if _, err := s.obs.Exec(ctx, "LISTEN "+tpChannel); err != nil {
		s.closeNative()
		return nil, err
	}
	s.held = map[string]bool{}
	for k := range s.pconns {
		if i == 0 {
			c, err := s.xpool.Acquire(ctx)
			if err != nil {
				s.closeNative()
				return nil, err
			}
			s.pconns[k] = c
			continue
		}
		c, err := s.pool.Acquire(ctx)
		if err != nil {
			s.closeNative()
			return nil, err
		}
		s.pconns[k] = c
		if a := pgryw.PoolConnPrimaryAddr(c); a != nil {
			s.held[a.String()] = true
		}
	}
	return s, nil
}

func (s *tpSide) closeNative() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for k, tx := range s.ptxs {
		if tx != nil {
			tx.Rollback(ctx)
			s.ptxs[k] = nil
		}
	}
	s.txOpen.Store(0)
	for k, c := range s.pconns {
		if c != nil {
			c.Release()
			s.pconns[k] = nil
		}
	}
	if s.xpool != nil {
		s.xpool.Close()
	}
	if s.pool != nil {
		s.pool.Close()
	}
	if s.obs != nil {
		s.obs.Close(ctx)
	}
	s.end()
}

// pq is what a step of session sess runs on.
func (s *tpSide) pq(sess int) tpPgxQuerier {
	switch {
	case sess < 0 && s.xpool != nil:
		return s.xpool
	case sess < 0:
		return s.pool
	case s.ptxs[sess] != nil:
		return s.ptxs[sess]
	}
	return s.pconns[sess]
}

// tpPgxOptions are database/sql's transaction options in pgx's terms.
func tpPgxOptions(o sql.TxOptions) pgx.TxOptions {
	var p pgx.TxOptions
	if o.ReadOnly {
		p.AccessMode = pgx.ReadOnly
	}
	switch o.Isolation {
	case sql.LevelReadCommitted:
		p.IsoLevel = pgx.ReadCommitted
	case sql.LevelRepeatableRead:
		p.IsoLevel = pgx.RepeatableRead
	case sql.LevelSerializable:
		p.IsoLevel = pgx.Serializable
	}
	return p
}

// tpStmtName is the name prepared statement slot k is prepared under.
func tpStmtName(k int) string { return "stmt" + strconv.Itoa(k) }

// runNative runs one step through pgx's front end and records what it
// showed.
func (s *tpSide) runNative(st tpStep) tpResult {
	var res tpResult
	ctx, cancel := context.WithTimeout(s.servedCtx(st, &res), st.timeout())
	defer cancel()
	start := time.Now()
	q := s.pq(st.sess)
	switch st.op {
	case "exec":
		ended := s.beforeExec(st, st.sess >= 0 && s.ptxs[st.sess] != nil)
		tag, err := q.Exec(ctx, st.sql, st.args...)
		ended()
		res.err = errText(err)
		if err == nil {
			res.affected = strconv.FormatInt(tag.RowsAffected(), 10)
		}
	case "query":
		rows, err := q.Query(ctx, st.sql, st.args...)
		res.readPgxRows(rows, err)
	case "begin":
		if s.ptxs[st.sess] != nil {
			res.err = "skipped: in a transaction"
			break
		}
		s.opening()
		tx, err := s.pconns[st.sess].BeginTx(ctx, tpPgxOptions(st.tx))
		res.err = errText(err)
		if err == nil {
			s.ptxs[st.sess] = tx
		} else {
			s.txOpen.Add(-1)
		}
	case "commit", "rollback":
		tx := s.ptxs[st.sess]
		if tx == nil {
			res.err = "skipped: no transaction"
			break
		}
		s.ptxs[st.sess] = nil
		// Open until it has ended: no replica is stopped under a
		// COMMIT on its way.
		if st.op == "commit" {
			res.err = errText(tx.Commit(ctx))
		} else {
			res.err = errText(tx.Rollback(ctx))
		}
		s.txOpen.Add(-1)
	case "prepare":
		var err error
		if tx := s.ptxs[st.sess]; tx != nil {
			_, err = tx.Prepare(ctx, tpStmtName(st.stmt), st.sql)
		} else {
			_, err = s.pconns[st.sess].Conn().Prepare(ctx, tpStmtName(st.stmt), st.sql)
		}
		res.err = errText(err)
	case "sexec":
		tag, err := q.Exec(ctx, tpStmtName(st.stmt), st.args...)
		res.err = errText(err)
		if err == nil {
			res.affected = strconv.FormatInt(tag.RowsAffected(), 10)
		}
	case "squery":
		rows, err := q.Query(ctx, tpStmtName(st.stmt), st.args...)
		res.readPgxRows(rows, err)
	case "sclose":
		if s.ptxs[st.sess] != nil {
			res.err = "skipped: in a transaction"
			break
		}
		res.err = errText(s.pconns[max(st.sess, 0)].Conn().Deallocate(ctx, tpStmtName(st.stmt)))
	case "panicrow":
		// The caller's own Scanner panics inside QueryRow's Scan: the
		// pool's connection must go back all the same (a pool of
		// tpSessions+1 with the sessions' held has one to spare).
		func() {
			defer func() {
				if p := recover(); p != nil {
					res.err = fmt.Sprint("panic: ", p)
				}
			}()
			res.err = errText(q.QueryRow(ctx, st.sql, st.args...).Scan(tpPanicScanner{}))
		}()
	case "batch":
		b := &pgx.Batch{}
		parts := make([]tpResult, len(st.batch))
		for i, bs := range st.batch {
			qq := b.Queue(bs.sql, bs.args...)
			if st.cb {
				qq.Query(func(rows pgx.Rows) error {
					// Rows that failed before any answer have no
					// description (pgx's FieldDescriptions would panic).
					parts[i].readPgxRows(rows, rows.Err())
					return nil
				})
			}
		}
		br := q.SendBatch(ctx, b)
		if !st.cb {
			for i := range st.batch {
				rows, err := br.Query()
				parts[i].readPgxRows(rows, err)
			}
		}
		res.err = errText(br.Close())
		for _, part := range parts {
			res.cols = append(res.cols, part.cols...)
			res.rows = append(res.rows, part.rows...)
			if part.err != "" {
				res.rows = append(res.rows, []string{"error " + part.err})
			}
		}
	case "copy":
		n, err := q.CopyFrom(ctx, pgx.Identifier{"t"}, []string{"id", "v"}, pgx.CopyFromRows(st.rows))
		res.err = errText(err)
		if err == nil {
			res.affected = strconv.FormatInt(n, 10)
		}
	}
	res.took = time.Since(start)
	s.observe(&res)
	return res
}

// readPgxRows records pgx's rows: their columns as Query returned them,
// their values, and their error.
func (r *tpResult) readPgxRows(rows pgx.Rows, err error) {
	if err != nil {
		r.err = errText(err)
		if rows != nil {
			rows.Close()
		}
		return
	}
	defer rows.Close()
	for _, fd := range rows.FieldDescriptions() {
		r.cols = append(r.cols, fd.Name)
	}
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			r.err = errText(err)
			return
		}
		r.rows = append(r.rows, tpRow(vals))
	}
	r.err = errText(rows.Err())
	if r.err == "" {
		r.affected = rows.CommandTag().String()
	}
}

// nativeStep draws a batch or a COPY.
// tpPanicScanner panics when a value is scanned into it: the caller's own
// code failing while it reads a row.
type tpPanicScanner struct{}

func (tpPanicScanner) Scan(any) error { panic("the caller's Scanner panics") }

func (g *tpGen) nativeStep(s int) {
	if g.rng.IntN(8) == 0 {
		g.add(tpStep{sess: -1, op: "panicrow", sql: "SELECT id FROM t UNION ALL SELECT 0 ORDER BY 1 LIMIT 1"})
		return
	}
	if g.rng.IntN(3) == 0 {
		var rows [][]any
		for range 1 + g.rng.IntN(2) {
			rows = append(rows, []any{g.id(s), int64(g.rng.IntN(100))})
		}
		if g.rng.IntN(4) == 0 && !g.inTx[s] && !g.block[s] {
			s = -1
		}
		g.add(tpStep{sess: s, op: "copy", rows: rows})
		return
	}
	var batch []tpStep
	for range 1 + g.rng.IntN(3) {
		sub := tpGen{rng: g.rng}
		switch g.rng.IntN(3) {
		case 0:
			sub.write(s)
		case 1:
			sub.add(tpStep{sess: s, op: "query", sql: "SELECT id, v FROM t WHERE id >= $1 ORDER BY id", args: []any{g.id(s)}})
		default:
			sub.add(tpStep{sess: s, op: "query", sql: tpReads[g.rng.IntN(len(tpReads))]})
		}
		batch = append(batch, sub.prog...)
	}
	if g.rng.IntN(4) == 0 && !g.inTx[s] && !g.block[s] {
		s = -1
	}
	g.add(tpStep{sess: s, op: "batch", batch: batch, cb: g.rng.IntN(2) == 0})
}
