package pgryw_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgryw/pgryw"
)

// TestIntegrationCatalogBounded sends statements calling 40 distinct
// user functions the classifier does not know through a one-connection
// pool, and watches the primary's pg_stat_activity meanwhile: pgryw asks the
// primary's catalog about them over at most one extra connection (not one
// per name), the names become known (the statements move to replicas), and
// once db.Close returns none of the pool's connections is left.
func TestIntegrationCatalogBounded(t *testing.T) {
	const nfuncs = 40
	app := fmt.Sprintf("pgryw_catalog_%d", os.Getpid())
	db, c := openDB(t, "application_name="+app)
	db.SetMaxOpenConns(1)
	ctx := context.Background()

	admin, err := pgx.Connect(ctx, cluster.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	names := make([]string, nfuncs)
	for i := range names {
		names[i] = fmt.Sprintf("cat_f_%d_%d", os.Getpid(), i)
		if _, err := admin.Exec(ctx, "CREATE FUNCTION "+names[i]+"() RETURNS int LANGUAGE sql STABLE AS 'SELECT "+fmt.Sprint(i)+"'"); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		a, err := pgx.Connect(ctx, cluster.WriterDSN())
		if err != nil {
			return
		}
		defer a.Close(ctx)
		for _, n := range names {
			a.Exec(ctx, "DROP FUNCTION IF EXISTS "+n+"()")
		}
	})
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}

	// Count the pool's client backends on the primary, as fast as we can,
	// until told to stop.
	count := func() int {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_stat_activity
			WHERE backend_type = 'client backend' AND application_name = $1 AND pid <> pg_backend_pid()`, app).Scan(&n); err != nil {
			t.Errorf("pg_stat_activity: %v", err)
		}
		return n
	}
	var (
		peak atomic.Int64
		stop = make(chan struct{})
		wg   sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if n := int64(count()); n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()

	// First every statement once: each name is unknown and asked about.
	query := func(i int) {
		var v int
		if err := db.QueryRowContext(ctx, "SELECT "+names[i]+"()").Scan(&v); err != nil {
			t.Fatalf("%s(): %v", names[i], err)
		}
		if v != i {
			t.Fatalf("%s() = %d, want %d", names[i], v, i)
		}
	}
	for i := range names {
		query(i)
	}
	// Then until each is served by a replica: its name became known.
	deadline := time.Now().Add(15 * time.Second)
	for i := range names {
		for {
			before := c.Stats().ReplicaReads
			query(i)
			if c.Stats().ReplicaReads > before {
				break
			}
			if time.Now().After(deadline) {
				close(stop)
				wg.Wait()
				t.Fatalf("SELECT %s() (STABLE) never served by a replica; peak %d primary connections", names[i], peak.Load())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	close(stop)
	wg.Wait()
	// The pool's one connection, the catalog's one, and one to spare for a
	// monitor connection to the primary (today it polls replicas only).
	const limit = 1 + 1 + 1
	t.Logf("peak %d pool connections on the primary while asking about %d functions; stats %+v", peak.Load(), nfuncs, c.Stats())
	if p := peak.Load(); p > limit {
		t.Errorf("pool held %d connections to the primary while asking the catalog; want at most %d (pool 1 + monitor 1 + catalog 1)", p, limit)
	}

	// The catalog's connection is idle now; DB.Close must close it (and the
	// pool's) before returning, or promptly after.
	if n := count(); n == 0 {
		t.Errorf("no pool connection on the primary before Close: the test cannot see them")
	}
	db.Close()
	deadline = time.Now().Add(2 * time.Second)
	for {
		n := count()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections of the pool still on the primary 2s after db.Close()", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestIntegrationCatalogCloseMidLookup closes the pool while catalog
// look-ups are still connecting to a slow primary (every primary connection
// after the pool's own takes 300ms to send its startup message): nothing of
// the pool may reach the primary after db.Close has returned.
func TestIntegrationCatalogCloseMidLookup(t *testing.T) {
	app := fmt.Sprintf("pgryw_catclose_%d", os.Getpid())
	db, c := openDB(t, "application_name="+app)
	db.SetMaxOpenConns(1)
	var primaryConns atomic.Int64
	pgryw.SetNetHook(c, func(port uint16, nc net.Conn) net.Conn {
		if int(port) == cluster.Writer.Port && primaryConns.Add(1) > 1 {
			return &slowStart{Conn: nc, delay: 300 * time.Millisecond}
		}
		return nc
	})
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, cluster.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	// Names nobody created: they stay unknown, and each statement calling one
	// fails on the server, after pgryw has started asking about it.
	for i := 0; i < 40; i++ {
		db.ExecContext(ctx, fmt.Sprintf("SELECT cat_missing_%d_%d()", os.Getpid(), i))
	}
	db.Close()
	closed := time.Now()
	var seen []int
	zero := time.Time{}
	for time.Since(closed) < time.Second {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_stat_activity
			WHERE backend_type = 'client backend' AND application_name = $1`, app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		seen = append(seen, n)
		if n == 0 && zero.IsZero() {
			zero = time.Now()
		}
		if n > 0 && !zero.IsZero() {
			t.Fatalf("%d pool connections on the primary %v after db.Close() returned, after the last had gone; counts %s", n, time.Since(closed), compact(seen))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if zero.IsZero() {
		t.Fatalf("pool connections still on the primary 1s after db.Close(); counts %s", compact(seen))
	}
	t.Logf("%d primary connections opened by the pool; counts after Close %s", primaryConns.Load(), compact(seen))
}

// slowStart delays a connection's first write (the startup message).
type slowStart struct {
	net.Conn
	delay time.Duration
	once  sync.Once
}

func (s *slowStart) Write(p []byte) (int, error) {
	s.once.Do(func() { time.Sleep(s.delay) })
	return s.Conn.Write(p)
}

func compact(s []int) string {
	var b strings.Builder
	for i, n := range s {
		if i == 0 || n != s[i-1] {
			fmt.Fprintf(&b, "%d ", n)
		}
	}
	return b.String()
}

// TestIntegrationCatalogAnswers checks what the primary's catalog makes of
// names: a function with any volatile overload stays a write, an unqualified
// name matches every schema, a schema-qualified one only its schema, and a
// quoted name with characters that would need escaping in SQL or in an
// array literal is found all the same.
func TestIntegrationCatalogAnswers(t *testing.T) {
	db, c := openDB(t, "")
	db.SetMaxOpenConns(1)
	ctx := context.Background()
	pid := os.Getpid()
	schema := fmt.Sprintf("cat_s_%d", pid)
	q := fmt.Sprintf("cat_q_%d", pid)
	v := fmt.Sprintf("cat_v_%d", pid)
	odd := fmt.Sprintf(`Odd, "{x}" '%d`, pid)
	oddSQL := `"` + strings.ReplaceAll(odd, `"`, `""`) + `"`
	setup := []string{
		"CREATE SCHEMA " + schema,
		"CREATE FUNCTION " + schema + "." + q + "() RETURNS int LANGUAGE sql STABLE AS 'SELECT 1'",
		"CREATE FUNCTION public." + q + "() RETURNS int LANGUAGE sql VOLATILE AS 'SELECT 2'",
		"CREATE FUNCTION " + v + "(int) RETURNS int LANGUAGE sql STABLE AS 'SELECT 3'",
		"CREATE FUNCTION " + v + "(text) RETURNS int LANGUAGE sql VOLATILE AS 'SELECT 4'",
		"CREATE FUNCTION " + oddSQL + "() RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT 5'",
	}
	admin, err := pgx.Connect(ctx, cluster.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	t.Cleanup(func() {
		admin, err := pgx.Connect(context.Background(), cluster.WriterDSN())
		if err != nil {
			return
		}
		defer admin.Close(context.Background())
		admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		admin.Exec(context.Background(), "DROP FUNCTION IF EXISTS public."+q+"(), "+v+"(int), "+v+"(text), "+oddSQL+"()")
	})
	for _, s := range setup {
		if _, err := admin.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	onReplica := func(query string, want int) bool {
		t.Helper()
		before := c.Stats().ReplicaReads
		var got int
		if err := db.QueryRowContext(ctx, query).Scan(&got); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		if got != want {
			t.Fatalf("%s = %d, want %d", query, got, want)
		}
		return c.Stats().ReplicaReads > before
	}
	writes := map[string]int{"SELECT " + q + "()": 2, "SELECT " + v + "(1)": 3}
	reads := map[string]int{"SELECT " + schema + "." + q + "()": 1, "SELECT " + oddSQL + "()": 5}
	// Writes first: they are asked in the same turn as the reads or an
	// earlier one, so once the reads are answered, so are they.
	for s, want := range writes {
		if onReplica(s, want) {
			t.Errorf("%s served by a replica before any answer", s)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for s, want := range reads {
		for !onReplica(s, want) {
			if time.Now().After(deadline) {
				t.Fatalf("%s never served by a replica", s)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for s, want := range writes {
		if onReplica(s, want) {
			t.Errorf("%s served by a replica: a volatile overload or schema makes it a write", s)
		}
	}
}
