package pgrywotel_test

// Against a real primary and replica: otelsql wrapping pgryw (with its
// trailing sqlcommenter comments) changes no route, and the statements'
// spans carry the serving node and the route.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/XSAM/otelsql"
	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
	pgrywotel "github.com/pgryw/pgryw/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

var cluster *pgtest.Cluster

func TestMain(m *testing.M) {
	os.Exit(pgtest.Main(m, pgtest.Options{Replicas: 1}, func(c *pgtest.Cluster) { cluster = c }))
}

func dsn() string {
	return cluster.WriterDSN() + "&wait_timeout=2s&replicas=" + strings.Join(cluster.ReplicaAddrs(), ",")
}

// route is what the comparison looks at in a report.
type route struct {
	Addr     string
	Role     pgryw.Role
	Route    pgryw.Route
	Fallback pgryw.Fallback
	Begin    bool
}

type routes struct {
	mu  sync.Mutex
	got []route
}

func (r *routes) hook(_ context.Context, s pgryw.ServedBy) {
	r.mu.Lock()
	r.got = append(r.got, route{s.Addr, s.Role, s.Route, s.Fallback, s.Begin})
	r.mu.Unlock()
}

// scenario runs one statement of each routing class on db, and returns
// where each ran and the text of one statement as the server saw it.
func scenario(t *testing.T, ctx context.Context, db *sql.DB, table string) ([]route, string) {
	t.Helper()
	var rec routes
	ctx = pgryw.WithServedBy(ctx, rec.hook)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	var n int
	one := func(q interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
	}, ctx context.Context, query string, args ...any) {
		t.Helper()
		must(q.QueryRowContext(ctx, query, args...).Scan(&n))
	}
	_, err := db.ExecContext(ctx, "INSERT INTO "+table+" VALUES ($1)", 1)
	must(err)
	one(db, ctx, "SELECT count(*) FROM "+table+" WHERE id = $1", 1)
	if n != 1 {
		t.Fatalf("read after write: %d rows", n)
	}
	one(db, ctx, "SELECT count(*) FROM "+table+" /* pgryw:primary */")
	one(db, pgryw.WithPrimary(ctx), "SELECT count(*) FROM "+table)
	// Transactions, read-write and read-only.
	tx, err := db.BeginTx(ctx, nil)
	must(err)
	_, err = tx.ExecContext(ctx, "INSERT INTO "+table+" VALUES ($1)", 2)
	must(err)
	one(tx, ctx, "SELECT count(*) FROM "+table)
	must(tx.Commit())
	rtx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	must(err)
	one(rtx, ctx, "SELECT count(*) FROM "+table)
	must(rtx.Commit())
	// A prepared statement (otelsql comments the text it prepares).
	st, err := db.PrepareContext(ctx, "SELECT count(*) FROM "+table+" WHERE id = $1")
	must(err)
	one(stmtQuerier{st}, ctx, "", 2)
	must(st.Close())
	// A replica hint on a write is refused before any server sees it.
	if _, err := db.ExecContext(ctx, "/* pgryw:replica */ DELETE FROM "+table); !errors.Is(err, pgryw.ErrReplicaHint) {
		t.Fatalf("replica hint on a write: %v", err)
	}
	// What the server received, comments and all.
	var text string
	must(db.QueryRowContext(ctx, "SELECT query FROM pg_stat_activity WHERE pid = pg_backend_pid()").Scan(&text))
	// Session state pins a connection; a replica hint reads past the pin.
	conn, err := db.Conn(ctx)
	must(err)
	defer conn.Close()
	_, err = conn.ExecContext(ctx, "SET application_name = 'pgrywotel'")
	must(err)
	one(conn, ctx, "SELECT count(*) FROM "+table)
	one(conn, pgryw.WithReplica(ctx), "SELECT count(*) FROM "+table)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.got, text
}

// stmtQuerier adapts *sql.Stmt to scenario's one.
type stmtQuerier struct{ st *sql.Stmt }

func (s stmtQuerier) QueryRowContext(ctx context.Context, _ string, args ...any) *sql.Row {
	return s.st.QueryRowContext(ctx, args...)
}

func newTable(t *testing.T, name string) {
	t.Helper()
	db, err := sql.Open("pgryw", cluster.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE " + name + " (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitCaughtUp(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func tracer(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp, rec
}

// TestRoutesUnderOtelsql runs the same statements through pgryw alone and
// through otelsql wrapping pgryw, with sqlcommenter's trailing comments
// (traceparent) on every statement, and compares where each ran.
func TestRoutesUnderOtelsql(t *testing.T) {
	pgtest.Require(t, cluster)
	plain, err := sql.Open("pgryw", dsn())
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	tp, _ := tracer(t)
	wrapped, err := otelsql.Open("pgryw", dsn(), otelsql.WithTracerProvider(tp),
		otelsql.WithSQLCommenter(true), otelsql.WithTextMapPropagator(propagation.TraceContext{}))
	if err != nil {
		t.Fatal(err)
	}
	defer wrapped.Close()
	newTable(t, "otel_plain")
	newTable(t, "otel_wrapped")

	ctx, span := tp.Tracer("pgrywotel_test").Start(context.Background(), "scenario")
	defer span.End()
	want, plainText := scenario(t, ctx, plain, "otel_plain")
	got, wrappedText := scenario(t, ctx, wrapped, "otel_wrapped")
	if strings.Contains(plainText, "traceparent") || !strings.Contains(wrappedText, "/*traceparent='00-") {
		t.Fatalf("statements as the server saw them:\nplain   %q\nwrapped %q", plainText, wrappedText)
	}
	t.Logf("wrapped statement: %q", wrappedText)
	if len(want) != 14 {
		t.Fatalf("%d reports without otelsql: %+v", len(want), want)
	}
	for i := range max(len(want), len(got)) {
		var w, g route
		if i < len(want) {
			w = want[i]
		}
		if i < len(got) {
			g = got[i]
		}
		if w != g {
			t.Errorf("statement %d: without otelsql %+v, with %+v", i, w, g)
		}
	}
	// The scenario covers these routes, on both nodes.
	seen := map[pgryw.Route]bool{}
	for _, r := range want {
		seen[r.Route] = true
	}
	for _, r := range []pgryw.Route{pgryw.RouteReplica, pgryw.RouteReplicaHint, pgryw.RouteWrite, pgryw.RoutePinned, pgryw.RoutePrimaryHint, pgryw.RouteTransaction} {
		if !seen[r] {
			t.Errorf("route %v not exercised: %+v", r, want)
		}
	}
	// Stats through otelsql's connections.
	st, err := pgryw.StatsOf(wrapped)
	if err != nil || st.ReplicaReads == 0 {
		t.Fatalf("StatsOf an otelsql pool: %+v, %v", st, err)
	}
}

// attrs returns a span's attributes by key.
func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestSpanAttributes: otelsql's statement spans carry the serving node and
// the route, set pool-wide with Instrument or per context with Context.
func TestSpanAttributes(t *testing.T) {
	pgtest.Require(t, cluster)
	newTable(t, "otel_spans")
	for _, how := range []string{"Instrument", "Context"} {
		t.Run(how, func(t *testing.T) {
			tp, rec := tracer(t)
			db, err := otelsql.Open("pgryw", dsn(), otelsql.WithTracerProvider(tp))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			ctx := context.Background()
			if how == "Instrument" {
				if err := pgrywotel.Instrument(db); err != nil {
					t.Fatal(err)
				}
			} else {
				ctx = pgrywotel.Context(ctx)
			}
			ctx, parent := tp.Tracer("pgrywotel_test").Start(ctx, "request")
			if _, err := db.ExecContext(ctx, "INSERT INTO otel_spans VALUES ($1) ON CONFLICT DO NOTHING", 1); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := db.QueryRowContext(ctx, "SELECT count(*) FROM otel_spans WHERE id = $1", 1).Scan(&n); err != nil || n != 1 {
				t.Fatalf("read: %d rows, %v", n, err)
			}
			parent.End()
			if p := attrs(parent.(sdktrace.ReadOnlySpan)); p[pgrywotel.RouteKey].Type() != attribute.EMPTY {
				t.Errorf("the request's own span got pgryw's attributes: %v", p)
			}
			primary, replica := cluster.Writer, cluster.Replicas[0]
			want := map[string]map[attribute.Key]string{
				string(otelsql.MethodConnExec): {
					pgrywotel.ServerAddressKey: primary.Host, pgrywotel.ServerPortKey: fmt.Sprint(primary.Port),
					pgrywotel.RoleKey: "primary", pgrywotel.RouteKey: "write",
				},
				string(otelsql.MethodConnQuery): {
					pgrywotel.ServerAddressKey: replica.Host, pgrywotel.ServerPortKey: fmt.Sprint(replica.Port),
					pgrywotel.RoleKey: "replica", pgrywotel.RouteKey: "replica",
				},
			}
			found := 0
			for _, s := range rec.Ended() {
				w, ok := want[s.Name()]
				if !ok {
					continue
				}
				found++
				a := attrs(s)
				for k, v := range w {
					if a[k].String() != v {
						t.Errorf("span %s: %s = %q, want %q (all: %v)", s.Name(), k, a[k].String(), v, a)
					}
				}
				if f := a[pgrywotel.FallbackKey]; f.Type() != attribute.EMPTY {
					t.Errorf("span %s: fallback %v", s.Name(), f.String())
				}
			}
			if found != 2 {
				t.Fatalf("%d statement spans, want 2: %v", found, rec.Ended())
			}
		})
	}
}
