package pgryw_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// pgx's front end (Pool, PoolConn, Tx) against the real primary and
// replicas: each way of writing pgx offers, then each way of reading at
// once, under lag.

// openPool opens a pgryw Pool on the test cluster with extra DSN keys,
// closed with the test.
func openPool(t *testing.T, extra string) *pgryw.Pool {
	t.Helper()
	pgtest.Require(t, cluster)
	dsn := cluster.WriterDSN() + "&replicas=" + strings.Join(cluster.ReplicaAddrs(), ",")
	if extra != "" {
		dsn += "&" + extra
	}
	pc, err := pgryw.ParsePoolConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.Config.ReadFunctions = append(pc.Config.ReadFunctions, nodeProbes...)
	p, err := pgryw.NewPoolWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// pgxWrites are the ways a pgx program writes a row (id, v).
var pgxWrites = []struct {
	name string
	run  func(ctx context.Context, p *pgryw.Pool, c *pgryw.PoolConn, table string, id int64) error
}{
	{"Pool.Exec", func(ctx context.Context, p *pgryw.Pool, _ *pgryw.PoolConn, table string, id int64) error {
		_, err := p.Exec(ctx, "INSERT INTO "+table+" (id, v) VALUES ($1, 1)", id)
		return err
	}},
	{"PoolConn.QueryRow RETURNING", func(ctx context.Context, _ *pgryw.Pool, c *pgryw.PoolConn, table string, id int64) error {
		var got int64
		return c.QueryRow(ctx, "INSERT INTO "+table+" (id, v) VALUES ($1, 1) RETURNING id", id).Scan(&got)
	}},
	{"Pool.BeginTx commit", func(ctx context.Context, p *pgryw.Pool, _ *pgryw.PoolConn, table string, id int64) error {
		return pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO "+table+" (id, v) VALUES ($1, 1)", id)
			return err
		})
	}},
	{"Pool.SendBatch", func(ctx context.Context, p *pgryw.Pool, _ *pgryw.PoolConn, table string, id int64) error {
		b := &pgx.Batch{}
		b.Queue("SELECT 1")
		b.Queue("INSERT INTO "+table+" (id, v) VALUES ($1, 1)", id)
		return p.SendBatch(ctx, b).Close()
	}},
	{"Pool.CopyFrom", func(ctx context.Context, p *pgryw.Pool, _ *pgryw.PoolConn, table string, id int64) error {
		_, err := p.CopyFrom(ctx, pgx.Identifier{table}, []string{"id", "v"}, pgx.CopyFromRows([][]any{{id, 1}}))
		return err
	}},
}

// pgxReads are the ways a pgx program reads the row back; each returns
// whether it saw it and the port of the node that answered. A read-only
// transaction that began on a replica moves to the primary when, before
// its first statement, the pool's watermark rose (another worker wrote:
// session_scope=db): it is left out of the replica share (anywhere).
var pgxReads = []struct {
	name     string
	run      func(ctx context.Context, p *pgryw.Pool, c *pgryw.PoolConn, table string, id int64) (bool, int, error)
	anywhere bool
}{
	{"Pool.QueryRow", func(ctx context.Context, p *pgryw.Pool, _ *pgryw.PoolConn, table string, id int64) (bool, int, error) {
		var n, port int
		err := p.QueryRow(ctx, "SELECT count(*), "+nodePort+" FROM "+table+" WHERE id = $1", id).Scan(&n, &port)
		return n == 1, port, err
	}, false},
	{"PoolConn.Query", func(ctx context.Context, _ *pgryw.Pool, c *pgryw.PoolConn, table string, id int64) (bool, int, error) {
		rows, err := c.Query(ctx, "SELECT id, "+nodePort+" FROM "+table+" WHERE id = $1", id)
		if err != nil {
			return false, 0, err
		}
		type row struct {
			ID   int64
			Port int
		}
		got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
		if err != nil || len(got) == 0 {
			return false, 0, err
		}
		return true, got[0].Port, nil
	}, false},
	{"Pool.SendBatch read", func(ctx context.Context, p *pgryw.Pool, _ *pgryw.PoolConn, table string, id int64) (bool, int, error) {
		b := &pgx.Batch{}
		var n, port int
		b.Queue("SELECT count(*) FROM "+table+" WHERE id = $1", id).QueryRow(func(r pgx.Row) error { return r.Scan(&n) })
		b.Queue("SELECT " + nodePort).QueryRow(func(r pgx.Row) error { return r.Scan(&port) })
		err := p.SendBatch(ctx, b).Close()
		return n == 1, port, err
	}, false},
	{"read-only Tx", func(ctx context.Context, p *pgryw.Pool, _ *pgryw.PoolConn, table string, id int64) (bool, int, error) {
		var n, port int
		err := pgx.BeginTxFunc(ctx, p, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, "SELECT count(*), "+nodePort+" FROM "+table+" WHERE id = $1", id).Scan(&n, &port)
		})
		return n == 1, port, err
	}, true},
}

// poolWriteThenRead runs every write shape followed at once by every read
// shape, from several workers each with a PoolConn of its own besides the
// Pool.
func poolWriteThenRead(t *testing.T, p *pgryw.Pool, table string, workers, rounds int) *workload {
	t.Helper()
	var w workload
	var wg sync.WaitGroup
	var id atomic.Int64
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			c, err := p.Acquire(ctx)
			if err != nil {
				w.errs.Add(1)
				w.firstErr.CompareAndSwap(nil, err)
				return
			}
			defer c.Release()
			for i := range rounds {
				wr := pgxWrites[i%len(pgxWrites)]
				rd := pgxReads[(i/len(pgxWrites))%len(pgxReads)]
				k := id.Add(1)
				if err := wr.run(ctx, p, c, table, k); err != nil {
					w.errs.Add(1)
					w.firstErr.CompareAndSwap(nil, fmt.Errorf("%s: %w", wr.name, err))
					continue
				}
				ok, port, err := rd.run(ctx, p, c, table, k)
				if !rd.anywhere {
					w.reads.Add(1)
				}
				switch {
				case err != nil:
					w.errs.Add(1)
					w.firstErr.CompareAndSwap(nil, fmt.Errorf("%s after %s: %w", rd.name, wr.name, err))
				case !ok:
					w.stale.Add(1)
				}
				if port != cluster.Writer.Port && !rd.anywhere {
					w.onReplica.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return &w
}

func TestIntegrationPoolReadYourWrites(t *testing.T) {
	setDelay(t, 100*time.Millisecond)
	p := openPool(t, "wait_timeout=1s&pool_max_conns=16")
	var mu sync.Mutex
	why := map[string]int{}
	p.Connector().SetServedBy(func(_ context.Context, s pgryw.ServedBy) {
		if s.Route == pgryw.RouteFallback {
			mu.Lock()
			why[s.Fallback.String()]++
			mu.Unlock()
		}
	})
	w := poolWriteThenRead(t, p, newTable(t), 4, 2*len(pgxWrites)*len(pgxReads))
	w.fresh(t, p.Connector())
	// Most reads on replicas, not all: on a loaded machine a few of this
	// workload's (four workers, nine shapes) fell back (8%, seen once, on
	// PostgreSQL 18 in a full CI run); what they fell back for is logged.
	t.Logf("fallbacks by reason: %v", why)
	if share := w.replicaShare(); share < 0.8 {
		t.Fatalf("only %.1f%% of reads served by replicas", share*100)
	}
}

// The control: without the wait, the same program sees its writes missing.
func TestIntegrationPoolOffIsStale(t *testing.T) {
	setDelay(t, 100*time.Millisecond)
	p := openPool(t, "read_your_writes=off&pool_max_conns=16")
	w := poolWriteThenRead(t, p, newTable(t), 2, len(pgxWrites)*len(pgxReads))
	t.Logf("reads=%d stale=%d replica=%d", w.reads.Load(), w.stale.Load(), w.onReplica.Load())
	if w.stale.Load() == 0 {
		t.Fatal("read_your_writes=off observed no stale reads through the Pool")
	}
}

// TestIntegrationPoolErrorsArePgx: a server error reaches the caller as
// pgx gives it, from a replica read and from a write, and a row that is
// not there is pgx.ErrNoRows.
func TestIntegrationPoolErrorsArePgx(t *testing.T) {
	p := openPool(t, "")
	ctx := context.Background()
	table := newTable(t)
	var pgErr *pgconn.PgError
	_, err := p.Exec(ctx, "INSERT INTO "+table+" (id, v) VALUES (1, NULL)")
	if !errors.As(err, &pgErr) || pgErr.Code != "23502" {
		t.Fatalf("a NOT NULL violation: %v", err)
	}
	if _, ok := err.(*pgconn.PgError); !ok {
		t.Fatalf("the error is %T, not pgx's *pgconn.PgError", err)
	}
	// An execution error reaches pgx's caller through the rows, not from
	// Query itself, on a replica as on the primary.
	for _, hint := range []string{"/* pgryw:replica */ ", "/* pgryw:primary */ "} {
		rows, err := p.Query(ctx, hint+"SELECT 1/(v-v) FROM (SELECT 1 AS v) s")
		if err != nil {
			t.Fatalf("%sQuery returned %v; pgx reports an execution error through the rows", hint, err)
		}
		for rows.Next() {
		}
		if !errors.As(rows.Err(), &pgErr) || pgErr.Code != "22012" {
			t.Fatalf("%srows.Err() = %v", hint, rows.Err())
		}
	}
	err = p.QueryRow(ctx, "SELECT 1/(v-v) FROM (SELECT 1 AS v) s WHERE "+nodeStandby).Scan(new(int))
	if !errors.As(err, &pgErr) || pgErr.Code != "22012" {
		t.Fatalf("division by zero on a replica: %v", err)
	}
	err = p.QueryRow(ctx, "SELECT v FROM "+table+" WHERE id = 42").Scan(new(int))
	if !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("no row: %v, want pgx.ErrNoRows", err)
	}
	if st := p.Stats(); st.ReplicaReads == 0 {
		t.Fatalf("no read reached a replica: %+v", st)
	}
}
