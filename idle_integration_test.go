package pgryw_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// A server-side idle timeout (idle_session_timeout) must not end what
// pgryw keeps open behind a connection the caller keeps using: a sql.Conn
// that only reads for longer than the timeout leaves its primary
// connection untouched, one that only writes its replica connection. pgx,
// whose one connection serves every statement, never sees the timeout
// there; neither may pgryw's caller. See docs/guarantees.md#idle-sessions.

// idleTimeout is the servers' idle_session_timeout in these tests, and
// idleSpan how long each program keeps one side of the connection idle.
const (
	idleTimeout = "1s"
	idleSpan    = 2500 * time.Millisecond
	idleStep    = 200 * time.Millisecond
)

// idleSQL is what the idle tests need of a connection: database/sql's
// sql.Conn and pgryw's PoolConn both give it.
type idleSQL interface {
	exec(ctx context.Context, q string, args ...any) error
	one(ctx context.Context, q string, args ...any) (string, error)
}

type sqlConnIdle struct{ c *sql.Conn }

func (s sqlConnIdle) exec(ctx context.Context, q string, args ...any) error {
	_, err := s.c.ExecContext(ctx, q, args...)
	return err
}

func (s sqlConnIdle) one(ctx context.Context, q string, args ...any) (string, error) {
	var v string
	err := s.c.QueryRowContext(ctx, q, args...).Scan(&v)
	return v, err
}

type poolConnIdle struct{ c *pgryw.PoolConn }

func (s poolConnIdle) exec(ctx context.Context, q string, args ...any) error {
	_, err := s.c.Exec(ctx, q, args...)
	return err
}

func (s poolConnIdle) one(ctx context.Context, q string, args ...any) (string, error) {
	var v string
	err := s.c.QueryRow(ctx, q, args...).Scan(&v)
	return v, err
}

// readsOnly is the first program: a setting, a write, reads alone for
// longer than the timeout, then a write again and the setting read on the
// primary. replicas says whether the reads must be served by replicas
// (pgryw; pgx stdlib has none).
func readsOnly(t *testing.T, c idleSQL, table string, replicas bool) {
	t.Helper()
	ctx := context.Background()
	if err := c.exec(ctx, "SET ryw.idle = 'kept'"); err != nil {
		t.Fatal(err)
	}
	if err := c.exec(ctx, "INSERT INTO "+table+" VALUES (1, 1)"); err != nil {
		t.Fatal(err)
	}
	onReplica := 0
	rctx := pgryw.WithServedBy(ctx, func(_ context.Context, s pgryw.ServedBy) {
		if s.Role == pgryw.RoleReplica {
			onReplica++
		}
	})
	reads := 0
	for start := time.Now(); time.Since(start) < idleSpan; reads++ {
		v, err := c.one(rctx, "SELECT count(*)::text FROM "+table)
		if err != nil {
			t.Fatalf("read %d after %v: %v", reads, time.Since(start).Round(time.Millisecond), err)
		}
		if v != "1" {
			t.Fatalf("read %d: count %s, want 1", reads, v)
		}
		time.Sleep(idleStep)
	}
	if replicas && onReplica != reads {
		t.Fatalf("%d of %d reads on replicas: the primary connection was not left idle", onReplica, reads)
	}
	if err := c.exec(ctx, "INSERT INTO "+table+" VALUES (2, 2)"); err != nil {
		t.Fatalf("write after %v of reads alone: %v", idleSpan, err)
	}
	got, err := c.one(pgryw.WithPrimary(ctx), "SELECT current_setting('ryw.idle')")
	if err != nil {
		t.Fatalf("the setting, on the primary: %v", err)
	}
	if got != "kept" {
		t.Fatalf("ryw.idle on the primary = %q, want kept: the session's setting was lost", got)
	}
	if v, err := c.one(ctx, "SELECT count(*)::text FROM "+table); err != nil || v != "2" {
		t.Fatalf("read after the write: %q, %v; want 2", v, err)
	}
}

// writesOnly is the second program: a read, writes alone for longer than
// the timeout, then reads, which must run on a replica without an error
// and without counting the replica as failed.
func writesOnly(t *testing.T, c idleSQL, table string, nodeMisses func() int64) {
	t.Helper()
	ctx := context.Background()
	if err := c.exec(ctx, "SET ryw.idle = 'kept'"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.one(ctx, "SELECT count(*)::text FROM "+table); err != nil {
		t.Fatal(err)
	}
	misses := nodeMisses()
	id := 0
	for start := time.Now(); time.Since(start) < idleSpan; {
		id++
		if err := c.exec(ctx, "INSERT INTO "+table+" VALUES ($1, 1)", id); err != nil {
			t.Fatalf("write %d: %v", id, err)
		}
		time.Sleep(idleStep)
	}
	var served []pgryw.ServedBy
	rctx := pgryw.WithServedBy(ctx, func(_ context.Context, s pgryw.ServedBy) { served = append(served, s) })
	for i := 0; i < 3; i++ {
		v, err := c.one(rctx, "SELECT count(*)::text || current_setting('ryw.idle') FROM "+table)
		if err != nil {
			t.Fatalf("read %d after %v of writes alone: %v", i, idleSpan, err)
		}
		if want := fmt.Sprint(id) + "kept"; v != want {
			t.Fatalf("read %d: %q, want %q", i, v, want)
		}
	}
	for i, s := range served {
		if s.Role != pgryw.RoleReplica || s.Fallback != pgryw.FallbackNone {
			t.Errorf("read %d served by %s (%v), fallback %v: want a replica, nothing passed over", i, s.Addr, s.Role, s.Fallback)
		}
	}
	if d := nodeMisses() - misses; d != 0 {
		t.Errorf("%d replica misses during the reads: a connection the server ended for idleness counted as the replica failing", d)
	}
}

// replicaMisses sums the replicas' Misses of c.
func replicaMisses(c *pgryw.Connector) func() int64 {
	return func() int64 {
		var n int64
		for _, s := range c.NodeStats() {
			if s.Role == pgryw.RoleReplica {
				n += s.Misses.Total()
			}
		}
		return n
	}
}

func TestIntegrationIdleSessionTimeoutReadsOnly(t *testing.T) {
	db, _ := openDB(t, "idle_session_timeout="+idleTimeout)
	readsOnly(t, sqlConnIdle{oneConn(t, db)}, newTable(t), true)
}

// The control: pgx stdlib on the primary alone runs the same program
// without an error, its one connection never idle.
func TestIntegrationIdleSessionTimeoutPgxControl(t *testing.T) {
	pgtest.Require(t, cluster)
	db, err := sql.Open("pgx", cluster.WriterDSN()+"&idle_session_timeout="+idleTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	readsOnly(t, sqlConnIdle{oneConn(t, db)}, newTable(t), false)
}

func TestIntegrationIdleSessionTimeoutWritesOnly(t *testing.T) {
	db, c := openDB(t, "idle_session_timeout="+idleTimeout)
	writesOnly(t, sqlConnIdle{oneConn(t, db)}, newTable(t), replicaMisses(c))
}

// The timeout comes from the role (ALTER ROLE … SET), not the DSN: pgryw
// cannot know it from its configuration.
func TestIntegrationIdleSessionTimeoutFromRole(t *testing.T) {
	pgtest.Require(t, cluster)
	ctx := context.Background()
	role := fmt.Sprintf("ryw_idle_%d", os.Getpid())
	admin, err := pgx.Connect(ctx, cluster.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(ctx) }) // after the cleanup below, which uses it
	table := newTable(t)
	for _, q := range []string{
		"DROP ROLE IF EXISTS " + role,
		"CREATE ROLE " + role + " LOGIN",
		"GRANT ALL ON " + table + " TO " + role,
		"ALTER ROLE " + role + " SET idle_session_timeout = '" + idleTimeout + "'",
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	dsn := strings.Replace(cluster.WriterDSN(), "postgres@", role+"@", 1) + "&replicas=" + strings.Join(cluster.ReplicaAddrs(), ",")
	if dsn == cluster.WriterDSN() {
		t.Fatal("no user to replace in the writer's DSN")
	}
	// Cleanups run last first: the pool closes, the second table's
	// grant goes (newTableFor), then this one's and the role.
	t.Cleanup(func() {
		for _, q := range []string{"REVOKE ALL ON " + table + " FROM " + role, "DROP ROLE IF EXISTS " + role} {
			if _, err := admin.Exec(ctx, q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	db, c := openDSN(t, dsn)
	conn := oneConn(t, db)
	var got string
	if err := conn.QueryRowContext(pgryw.WithPrimary(ctx), "SHOW idle_session_timeout").Scan(&got); err != nil || got != idleTimeout {
		t.Fatalf("idle_session_timeout = %q, %v; want %s from the role", got, err, idleTimeout)
	}
	readsOnly(t, sqlConnIdle{conn}, table, true)
	writesOnly(t, sqlConnIdle{oneConn(t, db)}, newTableFor(t, admin, role), replicaMisses(c))
}

// newTableFor is newTable, granted to role, through admin, until the
// test's end.
func newTableFor(t *testing.T, admin *pgx.Conn, role string) string {
	t.Helper()
	table := newTable(t)
	ctx := context.Background()
	if _, err := admin.Exec(ctx, "GRANT ALL ON "+table+" TO "+role); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "REVOKE ALL ON "+table+" FROM "+role); err != nil {
			t.Error(err)
		}
	})
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	return table
}

// The same through pgx's front end: a PoolConn acquired and held.
func TestIntegrationIdleSessionTimeoutPoolConn(t *testing.T) {
	pgtest.Require(t, cluster)
	ctx := context.Background()
	dsn := cluster.WriterDSN() + "&replicas=" + strings.Join(cluster.ReplicaAddrs(), ",") + "&idle_session_timeout=" + idleTimeout
	cfg, err := pgryw.ParsePoolConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Config.ReadFunctions = append(cfg.Config.ReadFunctions, nodeProbes...)
	pool, err := pgryw.NewPoolWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	t.Run("reads", func(t *testing.T) {
		pc, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Release()
		readsOnly(t, poolConnIdle{pc}, newTable(t), true)
	})
	t.Run("Conn().Prepare", func(t *testing.T) {
		// A pgx program that prepares by name on the primary's own pgx
		// connection after its reads ran on replicas: Conn() replaces a
		// connection the server ended, as pgxpool's never idled.
		pc, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Release()
		table := newTable(t)
		if _, err := pc.Exec(ctx, "INSERT INTO "+table+" VALUES (1, 1)"); err != nil {
			t.Fatal(err)
		}
		for start := time.Now(); time.Since(start) < idleSpan; {
			var n int
			if err := pc.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 1 {
				t.Fatalf("read: %d, %v", n, err)
			}
			time.Sleep(idleStep)
		}
		if _, err := pc.Conn().Prepare(ctx, "ryw_idle_ins", "INSERT INTO "+table+" VALUES ($1, 1)"); err != nil {
			t.Fatalf("Conn().Prepare after %v of reads alone: %v", idleSpan, err)
		}
		if _, err := pc.Exec(ctx, "ryw_idle_ins", 2); err != nil {
			t.Fatalf("executing it by name: %v", err)
		}
	})
	t.Run("writes", func(t *testing.T) {
		pc, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Release()
		writesOnly(t, poolConnIdle{pc}, newTable(t), replicaMisses(pool.Connector()))
	})
}
