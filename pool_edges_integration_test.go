package pgryw_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// pgx's front end at its edges: a pool without replicas, batches that
// begin transactions, a batch a replica refuses as a write, the pool's
// hooks, connections given back with answers unread.

// TestIntegrationPoolNoReplicas: with no replicas the Pool is pgx's own,
// and a failed Query, a failed QueryRow and a batch that begins a
// transaction all give their connection back (a pool of one would hang
// otherwise).
func TestIntegrationPoolNoReplicas(t *testing.T) {
	pgtest.Require(t, cluster)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	table := newTable(t)
	p, err := pgryw.NewPool(ctx, cluster.WriterDSN()+"&pool_max_conns=1")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for range 3 {
		if _, err := p.Query(ctx, "SELECT * FROM no_such_table"); err == nil {
			t.Fatal("a query of a missing table did not fail")
		}
		if err := p.QueryRow(ctx, "SELECT * FROM no_such_table").Scan(new(int)); err == nil {
			t.Fatal("a QueryRow of a missing table did not fail")
		}
	}
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue("INSERT INTO "+table+" (id, v) VALUES ($1, 1)", 1)
	br := p.SendBatch(ctx, b)
	tx := br.Tx()
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (id, v) VALUES ($1, 1)", 2); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := p.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 2 {
		t.Fatalf("count %d, %v", n, err)
	}
}

// TestIntegrationPoolBatchBeginTx: a batch that begins a transaction runs
// on the primary, and the transaction's commit moves the watermark: the
// pool's next read, on a replica behind, sees it. One whose BEGIN never
// ran (its context ended) leaves no transaction open on pgryw's side.
func TestIntegrationPoolBatchBeginTx(t *testing.T) {
	setDelay(t, 100*time.Millisecond)
	p := openPool(t, "wait_timeout=1s&pool_max_conns=2")
	ctx := context.Background()
	table := newTable(t)
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue("INSERT INTO "+table+" (id, v) VALUES ($1, 1)", 1)
	br := c.SendBatch(ctx, b)
	tx := br.Tx()
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var n, port int
	if err := p.QueryRow(ctx, "SELECT count(*), "+nodePort+" FROM "+table).Scan(&n, &port); err != nil || n != 1 {
		t.Fatalf("read after the batch's transaction: count %d, %v", n, err)
	}
	if port == cluster.Writer.Port {
		t.Errorf("the read ran on the primary")
	}

	done, stop := context.WithCancel(ctx)
	stop()
	b = &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue("SELECT 1")
	br = c.SendBatch(done, b)
	br.Close()
	tx2, err := c.Begin(ctx)
	if err != nil {
		t.Fatalf("a transaction after a batch whose BEGIN never ran: %v", err)
	}
	tx2.Rollback(ctx)

	// In a transaction, pgx refuses such a batch.
	tx3, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx3.Rollback(ctx)
	b = &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	if err := tx3.SendBatch(ctx, b).Close(); err == nil || err.Error() != "Batch.BeginTx cannot be used within a transaction" {
		t.Fatalf("a Batch.BeginTx batch in a transaction: %v", err)
	}
}

// TestIntegrationPoolBatchRefusedWrite: a batch classified as a read (a
// function listed in read_functions that writes) is refused by the
// replica (25006), runs on the primary, and its commit moves the pool's
// watermark: a read on another connection sees it.
func TestIntegrationPoolBatchRefusedWrite(t *testing.T) {
	table := newTable(t)
	fn := table + "_ins"
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, cluster.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE FUNCTION %s(bigint) RETURNS int LANGUAGE sql AS 'INSERT INTO %s (id, v) VALUES ($1, 1) RETURNING v'", fn, table)); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	setDelay(t, 100*time.Millisecond)
	p := openPool(t, "wait_timeout=1s&pool_max_conns=4&read_functions="+fn)
	for i := range int64(5) {
		b := &pgx.Batch{}
		b.Queue("SELECT "+fn+"($1)", i)
		if err := p.SendBatch(ctx, b).Close(); err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		c1, err := p.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c2, err := p.Acquire(ctx) // another connection than the batch's, most likely
		if err != nil {
			t.Fatal(err)
		}
		var n int
		err = c2.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE id = $1", i).Scan(&n)
		c1.Release()
		c2.Release()
		if err != nil || n != 1 {
			t.Fatalf("read after batch %d: count %d, %v", i, n, err)
		}
	}
}

// TestIntegrationPoolHooks: what a PrepareConn hook sends on the primary's
// connection is taken in as the connection's own statements are: a
// setting it makes (set_config with a literal name, with an argument, so
// pgx prepares it once and binds it after) follows the connection's reads
// to the replicas, also with reset_session=on (the reset runs before the
// hook); a ping changes nothing; a setting whose name pgryw cannot know
// keeps the reads on the primary, where it is. AfterConnect runs on
// replicas' connections too.
func TestIntegrationPoolHooks(t *testing.T) {
	pgtest.Require(t, cluster)
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		extra     string
		hook      func(ctx context.Context, c *pgx.Conn) error
		tenant    string // what the reads see
		onPrimary bool   // where they run
	}{
		{"set_config", "", func(ctx context.Context, c *pgx.Conn) error {
			_, err := c.Exec(ctx, "SELECT set_config('app.tenant', $1, false)", "a")
			return err
		}, "a", false},
		{"set_config reset_session", "&reset_session=on", func(ctx context.Context, c *pgx.Conn) error {
			_, err := c.Exec(ctx, "SELECT set_config('app.tenant', $1, false)", "a")
			return err
		}, "a", false},
		{"ping", "", func(ctx context.Context, c *pgx.Conn) error { return c.Ping(ctx) }, "", false},
		{"nothing", "", func(context.Context, *pgx.Conn) error { return nil }, "", false},
		{"computed name", "", func(ctx context.Context, c *pgx.Conn) error {
			_, err := c.Exec(ctx, "SELECT set_config($1, 'b', false)", "app.tenant")
			return err
		}, "b", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc, err := pgryw.ParsePoolConfig(cluster.WriterDSN() + "&pool_max_conns=1&replicas=" + cluster.ReplicaAddrs()[0] + tc.extra)
			if err != nil {
				t.Fatal(err)
			}
			pc.Config.ReadFunctions = append(pc.Config.ReadFunctions, nodeProbes...)
			var connected int
			pc.AfterConnect = func(context.Context, *pgx.Conn) error { connected++; return nil }
			pc.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) {
				err := tc.hook(ctx, c)
				return err == nil, err
			}
			p, err := pgryw.NewPoolWithConfig(ctx, pc)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			for i := range 6 {
				// Every other read is sent to the primary (WithPrimary),
				// where a reset left pending would ride in front of it.
				rctx, wantPrimary := ctx, tc.onPrimary
				if i%2 == 1 {
					rctx, wantPrimary = pgryw.WithPrimary(ctx), true
				}
				var tenant string
				var port int
				err := p.QueryRow(rctx, "SELECT coalesce(current_setting('app.tenant', true), ''), "+nodePort).Scan(&tenant, &port)
				if err != nil {
					t.Fatal(err)
				}
				if onPrimary := port == cluster.Writer.Port; tenant != tc.tenant || onPrimary != wantPrimary {
					t.Fatalf("read %d: tenant %q on the primary %v; want %q, on the primary %v", i, tenant, onPrimary, tc.tenant, wantPrimary)
				}
			}
			if !tc.onPrimary && connected < 2 {
				t.Errorf("AfterConnect ran on %d connections; want the primary's and the replica's", connected)
			}
		})
	}
}

// TestIntegrationPoolReleaseUnread: a connection given back with a
// replica's rows unread is not reused (pgxpool destroys it too), and the
// pool goes on.
func TestIntegrationPoolReleaseUnread(t *testing.T) {
	p := openPool(t, "pool_max_conns=1")
	ctx := context.Background()
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := c.Query(ctx, "SELECT g FROM generate_series(1, 100000) g")
	if err != nil {
		t.Fatal(err)
	}
	rows.Next()
	c.Release()
	var n int
	// (rows must not be touched now: their connection is the pool's.)
	if err := p.QueryRow(ctx, "SELECT 41 + 1").Scan(&n); err != nil || n != 42 {
		t.Fatalf("after a release with rows unread: %d, %v", n, err)
	}
	if st := p.Stat(); st.NewConnsCount() != 2 {
		t.Errorf("%d connections made; want 2 (the first was not reused)", st.NewConnsCount())
	}
}

// recordingTracer records the SQL of the queries pgx traces.
type recordingTracer struct {
	mu  sync.Mutex
	sql []string
}

func (r *recordingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	r.sql = append(r.sql, d.SQL)
	r.mu.Unlock()
	return ctx
}

func (r *recordingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestIntegrationPoolPgxOptions: pgx's options keep working through the
// Pool: a QueryTracer set on ConnConfig sees the application's statements,
// on the primary and on replicas, and none of pgryw's own; every query
// exec mode, as the connections' default or as a query's first argument,
// reads its own writes from replicas.
func TestIntegrationPoolPgxOptions(t *testing.T) {
	pgtest.Require(t, cluster)
	setDelay(t, 50*time.Millisecond)
	table := newTable(t)
	ctx := context.Background()
	modes := []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}
	id := int64(0)
	for _, def := range modes {
		t.Run(def.String(), func(t *testing.T) {
			pc, err := pgryw.ParsePoolConfig(cluster.WriterDSN() + "&wait_timeout=1s&pool_max_conns=2&replicas=" + strings.Join(cluster.ReplicaAddrs(), ","))
			if err != nil {
				t.Fatal(err)
			}
			pc.Config.ReadFunctions = append(pc.Config.ReadFunctions, nodeProbes...)
			tr := &recordingTracer{}
			pc.ConnConfig.Tracer = tr
			pc.ConnConfig.DefaultQueryExecMode = def
			p, err := pgryw.NewPoolWithConfig(ctx, pc)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			for _, per := range append([]pgx.QueryExecMode{0}, modes...) {
				id++
				var args []any
				if per != 0 {
					args = append(args, per)
				}
				if _, err := p.Exec(ctx, "INSERT INTO "+table+" (id, v) VALUES ($1, 1)", append(args, id)...); err != nil {
					t.Fatalf("insert, %v: %v", per, err)
				}
				var n, port int
				if err := p.QueryRow(ctx, "SELECT count(*), "+nodePort+" FROM "+table+" WHERE id = $1", append(args, id)...).Scan(&n, &port); err != nil {
					t.Fatalf("read, %v: %v", per, err)
				}
				if n != 1 || port == cluster.Writer.Port {
					t.Fatalf("read after the write, %v: count %d on port %d (primary %d)", per, n, port, cluster.Writer.Port)
				}
			}
			tr.mu.Lock()
			defer tr.mu.Unlock()
			for _, q := range tr.sql {
				if strings.Contains(q, "pg_current_wal") || strings.Contains(q, "pg_last_wal") || strings.Contains(q, "pgryw") || strings.Contains(q, "WAIT FOR") {
					t.Errorf("the tracer saw pgryw's own statement %q", q)
				}
			}
			if len(tr.sql) < 2*(len(modes)+1) {
				t.Errorf("the tracer saw %d statements, want at least %d", len(tr.sql), 2*(len(modes)+1))
			}
		})
	}
}

// TestIntegrationPoolSession: a Session carries a write's position from
// one Pool to another (session_scope=conn: no pool watermark to help),
// and across front ends, through its token.
func TestIntegrationPoolSession(t *testing.T) {
	setDelay(t, 100*time.Millisecond)
	table := newTable(t)
	ctx := context.Background()
	writer := openPool(t, "session_scope=conn&wait_timeout=1s")
	reader := openPool(t, "session_scope=conn&wait_timeout=1s")
	db, _ := openDB(t, "session_scope=conn&wait_timeout=1s")
	for i := range int64(5) {
		s := pgryw.NewSession()
		if _, err := writer.Exec(pgryw.WithSession(ctx, s), "INSERT INTO "+table+" (id, v) VALUES ($1, 1)", i); err != nil {
			t.Fatal(err)
		}
		tok, err := s.TokenContext(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var n, port int
		if err := reader.QueryRow(pgryw.WithSession(ctx, s), "SELECT count(*), "+nodePort+" FROM "+table+" WHERE id = $1", i).Scan(&n, &port); err != nil || n != 1 {
			t.Fatalf("the other Pool, with the Session: count %d, %v", n, err)
		}
		if port == cluster.Writer.Port {
			t.Errorf("the read with the Session ran on the primary")
		}
		other := pgryw.NewSession()
		if err := other.Observe(tok); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRowContext(pgryw.WithSession(ctx, other), "SELECT count(*) FROM "+table+" WHERE id = $1", i).Scan(&n); err != nil || n != 1 {
			t.Fatalf("database/sql, with the token: count %d, %v", n, err)
		}
	}
}
