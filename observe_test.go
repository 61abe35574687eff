package pgryw

// The served-by hook, the per-node counters and the log lines, asserted
// exactly on scripted servers (fakecluster_test.go). Waits, lag and stale
// reads need real replicas: observe_integration_test.go.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// servedLog records ServedBy reports.
type servedLog struct {
	mu  sync.Mutex
	got []ServedBy
}

func (l *servedLog) hook(_ context.Context, s ServedBy) {
	l.mu.Lock()
	l.got = append(l.got, s)
	l.mu.Unlock()
}

// take returns the reports since the last take.
func (l *servedLog) take() []ServedBy {
	l.mu.Lock()
	defer l.mu.Unlock()
	g := l.got
	l.got = nil
	return g
}

// p and r are the addresses of the scripted primary and replica i.
func (fc *fakeCluster) p() string      { return fc.primary.srv.Addr() }
func (fc *fakeCluster) r(i int) string { return fc.replicas[i].srv.Addr() }

// splitAddr splits a scripted node's address.
func splitAddr(addr string) (string, uint16) {
	host, port, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(port)
	return host, uint16(n)
}

func at(addr string, role Role, route Route) ServedBy {
	host, port := splitAddr(addr)
	return ServedBy{Addr: addr, Host: host, Port: port, Role: role, Route: route}
}

func (s ServedBy) because(f Fallback) ServedBy { s.Fallback = f; return s }
func (s ServedBy) begin() ServedBy             { s.Begin = true; return s }

func expectServed(t *testing.T, step string, got []ServedBy, want ...ServedBy) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s: served-by reports\n got %+v\nwant %+v", step, got, want)
	}
}

// nodeStats returns c's NodeStats by address, with the histogram's
// bucket bounds left out (they are the same for every node).
func nodeStatsByAddr(c *Connector) map[string]NodeStats {
	m := map[string]NodeStats{}
	for _, s := range c.NodeStats() {
		s.WaitTime.Bounds = nil
		m[s.Addr] = s
	}
	return m
}

func TestServedByRoutes(t *testing.T) {
	mc := newFakeCluster(t, 1, "")
	var pool, own servedLog
	mc.c.SetServedBy(pool.hook)
	ctx := WithServedBy(context.Background(), own.hook)
	conn, err := mc.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	read := func(ctx context.Context, q string) {
		t.Helper()
		var v int
		if err := conn.QueryRowContext(ctx, q, int64(7)).Scan(&v); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec := func(ctx context.Context, q string) {
		t.Helper()
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	step := func(name string, want ...ServedBy) {
		t.Helper()
		p, o := pool.take(), own.take()
		expectServed(t, name+" (pool hook)", p, want...)
		expectServed(t, name+" (context hook)", o, want...)
	}
	p, r := mc.p(), mc.r(0)

	mc.replicas[0].ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	read(ctx, selectSQL)
	step("read", at(r, RoleReplica, RouteReplica))

	mc.primary.ExpectExec(insertSQL)
	if _, err := conn.ExecContext(ctx, insertSQL, 1); err != nil {
		t.Fatal(err)
	}
	step("insert", at(p, RolePrimary, RouteWrite))

	mc.primary.ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	read(WithPrimary(ctx), selectSQL)
	hinted := selectSQL + " /* pgryw:primary */"
	mc.primary.ExpectQuery(hinted).WithArgs(7).WillReturnRows(valueRow(1))
	read(ctx, hinted)
	step("primary hints", at(p, RolePrimary, RoutePrimaryHint), at(p, RolePrimary, RoutePrimaryHint))

	// A read-write transaction: BEGIN and each statement, on the primary.
	mc.primary.ExpectBegin()
	mc.primary.ExpectExec(insertSQL)
	mc.primary.ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	mc.primary.ExpectCommit()
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, insertSQL, 1); err != nil {
		t.Fatal(err)
	}
	var v int
	if err := tx.QueryRowContext(ctx, selectSQL, int64(7)).Scan(&v); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	step("read-write transaction", at(p, RolePrimary, RouteTransaction).begin(),
		at(p, RolePrimary, RouteTransaction), at(p, RolePrimary, RouteTransaction))

	// A read-only transaction: BEGIN routed like a read, its statements
	// where it runs.
	mc.replicas[0].ExpectBegin()
	mc.replicas[0].ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	mc.replicas[0].ExpectCommit()
	rtx, err := conn.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := rtx.QueryRowContext(ctx, selectSQL, int64(7)).Scan(&v); err != nil {
		t.Fatal(err)
	}
	if err := rtx.Commit(); err != nil {
		t.Fatal(err)
	}
	step("read-only transaction", at(r, RoleReplica, RouteReplica).begin(), at(r, RoleReplica, RouteTransaction))

	// Transaction control sent as statements.
	mc.primary.ExpectExec("BEGIN")
	mc.primary.ExpectExec("COMMIT")
	exec(ctx, "BEGIN")
	exec(ctx, "COMMIT")
	step("Exec'd BEGIN and COMMIT", at(p, RolePrimary, RouteTransaction), at(p, RolePrimary, RouteTransaction))

	// Session state pins; a replica hint overrides the pin for a read; a
	// write with the hint is refused by pgryw and reaches no server.
	mc.primary.ExpectExec("SELECT pg_advisory_lock(1)")
	mc.primary.ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	mc.replicas[0].ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	exec(ctx, "SELECT pg_advisory_lock(1)")
	read(ctx, selectSQL)
	read(WithReplica(ctx), selectSQL)
	if _, err := conn.ExecContext(WithReplica(ctx), "DELETE FROM t"); !errors.Is(err, ErrReplicaHint) {
		t.Fatalf("write with WithReplica: %v", err)
	}
	step("pinned", at(p, RolePrimary, RoutePinned), at(p, RolePrimary, RoutePinned), at(r, RoleReplica, RouteReplicaHint))

	// WithServedBy(nil) removes the context's hook; the pool's stays.
	mc.replicas[0].ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	read(WithServedBy(WithReplica(ctx), nil), selectSQL)
	expectServed(t, "context hook removed", own.take())
	expectServed(t, "pool hook kept", pool.take(), at(r, RoleReplica, RouteReplicaHint))
	mc.c.SetServedBy(nil)
	mc.replicas[0].ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	read(WithReplica(ctx), selectSQL)
	expectServed(t, "pool hook removed", pool.take())
	expectServed(t, "context hook kept", own.take(), at(r, RoleReplica, RouteReplicaHint))
	mc.verify(t)

	got := nodeStatsByAddr(mc.c)
	ph, pp := splitAddr(p)
	rh, rp := splitAddr(r)
	primary := NodeStats{Addr: p, Host: ph, Port: pp, Role: RolePrimary, Health: HealthUp,
		// insert, 2 hinted reads, 2 in the transaction, BEGIN, COMMIT, SET, pinned read
		Statements: 9, Writes: 2, Reads: 7, Transactions: 1,
		WaitTime: WaitHistogram{Counts: make([]int64, len(waitBounds)+1)},
		Pinned:   1, // by the advisory lock, which the read-back behind it found
	}
	replica := NodeStats{Addr: r, Host: rh, Port: rp, Role: RoleReplica, Health: HealthUp,
		Statements: 5, Reads: 5, Transactions: 1,
		WaitTime: WaitHistogram{Counts: make([]int64, len(waitBounds)+1)},
	}
	for _, want := range []NodeStats{primary, replica} {
		if g := got[want.Addr]; fmt.Sprintf("%+v", g) != fmt.Sprintf("%+v", want) {
			t.Errorf("NodeStats %s\n got %+v\nwant %+v", want.Addr, g, want)
		}
	}
	if s := mc.c.Stats(); s.ReplicaReads != 5 || s.Fallbacks != 0 {
		t.Errorf("Stats %+v", s)
	}
}

// failingDial makes the mock cluster's dials go through f first: f returns
// an error to fail the dial, or nil to let it through.
func (fc *fakeCluster) failingDial(f func(n *node) error) {
	orig := fc.c.dial
	fc.c.dial = func(ctx context.Context, n *node, why dialFor) (driver.Conn, error) {
		if err := f(n); err != nil {
			return nil, err
		}
		return orig(ctx, n, why)
	}
}

func TestServedByFallbacks(t *testing.T) {
	refusal := &pgconn.PgError{Severity: "ERROR", Code: "0A000", Message: "cannot use serializable mode in a hot standby"}
	for _, tc := range []struct {
		name    string
		prepare func(mc *fakeCluster)
		why     Fallback
		health  Health
	}{
		{"unreachable", func(mc *fakeCluster) {
			mc.failingDial(func(n *node) error {
				if n.index >= 0 {
					return errors.New("dial tcp: connection refused")
				}
				return nil
			})
		}, FallbackUnreachable, HealthDown},
		{"promoted", func(mc *fakeCluster) {
			// As newBackend does when the server says in_hot_standby=off.
			mc.failingDial(func(n *node) error {
				if n.index >= 0 {
					n.notStandby.Store(true)
				}
				return nil
			})
		}, FallbackPromoted, HealthNotStandby},
		{"refused", func(mc *fakeCluster) {
			mc.replicas[0].ExpectQuery(selectSQL).WithArgs(7).WillReturnError(refusal)
		}, FallbackRefused, HealthRefused},
		{"connection fault", func(mc *fakeCluster) {
			mc.replicas[0].ExpectQuery(selectSQL).WithArgs(7).WillReturnError(driver.ErrBadConn)
		}, FallbackUnreachable, HealthUp}, // a failed read alone does not mark the node down
	} {
		t.Run(tc.name, func(t *testing.T) {
			mc := newFakeCluster(t, 1, "")
			var l servedLog
			mc.c.SetServedBy(l.hook)
			tc.prepare(mc)
			mc.primary.ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
			if _, err := readOne(t, mc.db); err != nil {
				t.Fatal(err)
			}
			p := at(mc.p(), RolePrimary, RouteFallback)
			expectServed(t, "first read", l.take(), p.because(tc.why))
			ns := nodeStatsByAddr(mc.c)
			var want FallbackCounts
			want[tc.why] = 1
			if g := ns[mc.p()].Fallbacks; g != want {
				t.Errorf("primary Fallbacks %v, want %v", g, want)
			}
			if g := ns[mc.r(0)].Misses; g != want {
				t.Errorf("replica Misses %v, want %v", g, want)
			}
			if g := ns[mc.r(0)].Health; g != tc.health {
				t.Errorf("replica health %v, want %v", g, tc.health)
			}
			if g := ns[mc.p()].Reads; g != 1 {
				t.Errorf("primary Reads %d", g)
			}
			if s := mc.c.Stats(); s.Fallbacks != ns[mc.p()].Fallbacks.Total() {
				t.Errorf("Stats.Fallbacks %d, per-node %d", s.Fallbacks, ns[mc.p()].Fallbacks.Total())
			}
			if tc.health == HealthUp {
				mc.verify(t)
				return
			}
			// The replica is left alone now: the next read does not try it.
			mc.primary.ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
			if _, err := readOne(t, mc.db); err != nil {
				t.Fatal(err)
			}
			expectServed(t, "second read", l.take(), p.because(FallbackNoReplica))
			want[FallbackNoReplica] = 1
			if g := nodeStatsByAddr(mc.c)[mc.p()].Fallbacks; g != want {
				t.Errorf("primary Fallbacks %v, want %v", g, want)
			}
			mc.verify(t)
		})
	}
}

// A read-only transaction whose first statement a replica refuses moves to
// the primary: a fallback, reported with the statement that moved.
func TestServedByTransactionRefused(t *testing.T) {
	mc := newFakeCluster(t, 1, "")
	var l servedLog
	mc.c.SetServedBy(l.hook)
	refusal := &pgconn.PgError{Severity: "ERROR", Code: "0A000", Message: "cannot use serializable mode in a hot standby"}
	mc.replicas[0].ExpectBegin()
	mc.replicas[0].ExpectQuery(selectSQL).WithArgs(7).WillReturnError(refusal)
	mc.replicas[0].ExpectRollback()
	mc.primary.ExpectBegin()
	mc.primary.ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	mc.primary.ExpectCommit()
	tx, err := mc.db.BeginTx(context.Background(), &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readOne(t, tx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	expectServed(t, "transaction", l.take(), at(mc.r(0), RoleReplica, RouteReplica).begin(),
		at(mc.p(), RolePrimary, RouteTransaction).because(FallbackRefused))
	ns := nodeStatsByAddr(mc.c)
	var want FallbackCounts
	want[FallbackRefused] = 1
	if ns[mc.p()].Fallbacks != want || ns[mc.r(0)].Misses != want || ns[mc.r(0)].Health != HealthRefused {
		t.Errorf("primary %+v\nreplica %+v", ns[mc.p()], ns[mc.r(0)])
	}
	if s := mc.c.Stats(); s.Fallbacks != 1 {
		t.Errorf("Stats %+v", s)
	}
	mc.verify(t)
}

// A replica that refuses a read as a write (25006): the statement runs on
// the primary as the write it turned out to be.
func TestServedByLearnedWrite(t *testing.T) {
	mc := newFakeCluster(t, 1, "read_functions=audit_touch")
	var l servedLog
	mc.c.SetServedBy(l.hook)
	q := "SELECT audit_touch($1)"
	mc.replicas[0].ExpectQuery(q).WithArgs(7).WillReturnError(pgError("25006"))
	mc.primary.ExpectQuery(q).WithArgs(7).WillReturnRows(valueRow(1))
	var v int
	if err := mc.db.QueryRow(q, int64(7)).Scan(&v); err != nil {
		t.Fatal(err)
	}
	expectServed(t, "learned write", l.take(), at(mc.p(), RolePrimary, RouteWrite))
	if s := nodeStatsByAddr(mc.c)[mc.p()]; s.Writes != 1 || s.Fallbacks.Total() != 0 {
		t.Errorf("primary %+v", s)
	}
	mc.verify(t)
}

func TestServedByNoReplicas(t *testing.T) {
	mc := newFakeCluster(t, 0, "")
	var l servedLog
	ctx := WithServedBy(context.Background(), l.hook)
	mc.primary.ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	mc.primary.ExpectBegin()
	mc.primary.ExpectExec(insertSQL)
	mc.primary.ExpectCommit()
	var v int
	if err := mc.db.QueryRowContext(ctx, selectSQL, int64(7)).Scan(&v); err != nil {
		t.Fatal(err)
	}
	tx, err := mc.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, insertSQL, 1); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	p := at(mc.p(), RolePrimary, RouteNoReplicas)
	expectServed(t, "no replicas", l.take(), p, p.begin(), p)
	s := nodeStatsByAddr(mc.c)[mc.p()]
	if s.Statements != 2 || s.Transactions != 1 || s.Reads != 0 || s.Writes != 0 || len(mc.c.NodeStats()) != 1 {
		t.Errorf("NodeStats %+v", mc.c.NodeStats())
	}
	mc.verify(t)
}

var retryIn = regexp.MustCompile(`retry_in=(\S+)`)

// TestLogLines asserts every line one scenario writes: node state changes
// at Info and Warn, routing decisions at Debug, and nothing that names the
// password, the statement or its argument.
func TestLogLines(t *testing.T) {
	mc := newFakeCluster(t, 2, "")
	var h pgtest.Logs
	mc.c.SetLogger(slog.New(&h))
	r0, r1 := mc.c.topo.replicas[0], mc.c.topo.replicas[1]
	var r1Fails = true
	mc.failingDial(func(n *node) error {
		switch {
		case n == r0:
			n.notStandby.Store(true) // as newBackend does for in_hot_standby=off
		case n == r1 && r1Fails:
			return errors.New("dial tcp: connection refused")
		}
		return nil
	})
	const secret int64 = 424242
	mc.primary.ExpectQuery(selectSQL).WithArgs(secret).WillReturnRows(valueRow(1))
	var v int
	if err := mc.db.QueryRow(selectSQL, secret).Scan(&v); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"WARN pgryw: node down node=" + mc.r(1) + " role=replica failures=1 retry_in=…",
		"DEBUG pgryw: replica could not serve the read as asked node=" + mc.r(1) + " reason=replica unreachable",
		"WARN pgryw: node is not in recovery (the writer, or promoted): no reads go to it node=" + mc.r(0) + " role=replica",
		"DEBUG pgryw: replica could not serve the read as asked node=" + mc.r(0) + " reason=replica promoted",
		"INFO pgryw: node up node=" + mc.p() + " role=primary",
		"DEBUG pgryw: statement routed node=" + mc.p() + " role=primary route=fallback fallback=replica promoted",
	}
	got := h.Take()
	// The backoff left is a little under the first probe backoff.
	for i, line := range got {
		if m := retryIn.FindStringSubmatch(line); m != nil {
			if d, err := time.ParseDuration(m[1]); err != nil || d <= 0 || d > probeBackoff(1) {
				t.Errorf("%q: retry_in out of (0, %v]", line, probeBackoff(1))
			}
			got[i] = retryIn.ReplaceAllString(line, "retry_in=…")
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("lines\n got %q\nwant %q", got, want)
	}

	// replica1 comes back once its backoff is over.
	r1Fails = false
	r1.probeAnswered()
	mc.replicas[1].ExpectQuery(selectSQL).WithArgs(secret).WillReturnRows(valueRow(1))
	mc.primary.ExpectExec(insertSQL).WithArgs(secret)
	if err := mc.db.QueryRow(selectSQL, secret).Scan(&v); err != nil {
		t.Fatal(err)
	}
	if _, err := mc.db.Exec(insertSQL, secret); err != nil {
		t.Fatal(err)
	}
	want = []string{
		"INFO pgryw: node up node=" + mc.r(1) + " role=replica",
		"DEBUG pgryw: statement routed node=" + mc.r(1) + " role=replica route=replica",
		"DEBUG pgryw: statement routed node=" + mc.p() + " role=primary route=write",
	}
	got2 := h.Take()
	if !slices.Equal(got2, want) {
		t.Fatalf("lines\n got %q\nwant %q", got2, want)
	}
	for _, line := range append(got, got2...) {
		for _, leak := range []string{"hunter2", "SELECT", "INSERT", fmt.Sprint(secret)} {
			if strings.Contains(line, leak) {
				t.Errorf("log line %q contains %q", line, leak)
			}
		}
	}

	// Above Debug, statements write nothing.
	mc.c.SetLogger(slog.New(slog.NewTextHandler(&strings.Builder{}, &slog.HandlerOptions{Level: slog.LevelInfo})))
	mc.replicas[1].ExpectQuery(selectSQL).WithArgs(secret).WillReturnRows(valueRow(1))
	if err := mc.db.QueryRow(selectSQL, secret).Scan(&v); err != nil {
		t.Fatal(err)
	}
	mc.verify(t)
}

// TestObserveAllocs: with no hook and no Debug logger, observing a
// statement allocates nothing; nor does calling a hook that keeps nothing.
func TestObserveAllocs(t *testing.T) {
	cfg, err := ParseDSN("host=w.invalid replicas=r1.invalid,r2.invalid")
	if err != nil {
		t.Fatal(err)
	}
	c, err := newConnector(cfg, connHooks{})
	if err != nil {
		t.Fatal(err)
	}
	cn := &Conn{c: c}
	q := benchStatements[0]
	cls := c.classes.get(q)
	w := c.classes.get(benchStatements[1])
	r := c.topo.replicas[0]
	run := func(ctx context.Context) {
		cn.skip(c.topo.replicas[1], FallbackUnreachable)
		cn.servedReplica(ctx, r, RouteReplica, false)
		wp := plan{route: RouteWrite}
		cn.servedPrimary(ctx, &w, &wp)
		fp := plan{route: RouteFallback, read: true, tried: true}
		cn.servedPrimary(ctx, &cls, &fp)
		bp := plan{route: RoutePinned, read: true}
		cn.servedBegin(ctx, &bp)
	}
	ctx := context.Background()
	if n := testing.AllocsPerRun(200, func() { run(ctx) }); n != 0 {
		t.Errorf("no hook: %v allocations per statement", n)
	}
	var calls int
	c.SetServedBy(func(context.Context, ServedBy) { calls++ })
	hctx := WithServedBy(ctx, func(_ context.Context, s ServedBy) { calls += int(s.Role) })
	if n := testing.AllocsPerRun(200, func() { run(hctx) }); n != 0 {
		t.Errorf("with hooks: %v allocations per statement", n)
	}
	if calls == 0 {
		t.Fatal("hooks not called")
	}
}

func TestNodeHealth(t *testing.T) {
	n := &node{index: 0}
	now := func() int64 { return time.Now().UnixNano() }
	steps := []struct {
		do   func()
		want Health
	}{
		{func() {}, HealthUp},
		{n.markRefused, HealthRefused},
		{n.markDown, HealthDown}, // a later failure's backoff is not the refusal's
		{func() { n.downUntil.Store(0); n.probeAnswered() }, HealthUp},
		{n.markRefused, HealthRefused},
		{func() { n.notStandby.Store(true) }, HealthNotStandby},
	}
	for i, s := range steps {
		s.do()
		if got := n.health(now()); got != s.want {
			t.Fatalf("step %d: %v, want %v", i, got, s.want)
		}
	}
	p := &node{index: -1}
	p.notStandby.Store(true) // a primary is no standby; that is no news
	if got := p.health(now()); got != HealthUp {
		t.Fatalf("primary: %v", got)
	}
}
