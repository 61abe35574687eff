package pgryw

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/pgryw/pgryw/internal/pgfake"
	"github.com/pgryw/pgryw/internal/pgtest"
	"github.com/pgryw/pgryw/internal/wire"
)

// The probe backoff doubles from probeBackoffMin per failure in a row, up
// to probeBackoffMax.
func TestProbeBackoff(t *testing.T) {
	ms := time.Millisecond
	for k, want := range map[int32]time.Duration{
		0: 100 * ms, 1: 100 * ms, 2: 200 * ms, 3: 400 * ms, 4: 800 * ms, 5: 1600 * ms, 6: 3200 * ms,
		7: 5 * time.Second, 8: 5 * time.Second, 1 << 30: 5 * time.Second,
	} {
		if got := probeBackoff(k); got != want {
			t.Errorf("probeBackoff(%d) = %v, want %v", k, got, want)
		}
	}
}

// A node that failed stays out of reads until a probe answers, however long
// ago it failed: reads never connect to a node known to be down. Failures
// in a row lengthen the wait for the next probe; reads failing together
// count once.
func TestNodeDownUntilProbed(t *testing.T) {
	n := &node{}
	now := func() int64 { return time.Now().UnixNano() }
	if !n.usable(now()) {
		t.Fatal("a fresh node is not usable")
	}
	n.markDown()
	n.markDown() // a second read failing at the same time
	if n.usable(now()) || n.fails.Load() != 1 {
		t.Fatalf("after a failure: usable %v, failures %d", n.usable(now()), n.fails.Load())
	}
	if d := time.Duration(n.retryAt.Load() - now()); d <= 0 || d > probeBackoffMin {
		t.Errorf("first probe in %v, want within %v", d, probeBackoffMin)
	}
	n.retryAt.Store(now() - int64(time.Hour))
	if n.usable(now()) {
		t.Fatal("usable once the probe was due, before any probe answered")
	}
	n.probeFailed()
	if d := time.Duration(n.retryAt.Load() - now()); n.fails.Load() != 2 || d <= probeBackoffMin || d > 2*probeBackoffMin {
		t.Errorf("after a failed probe: failures %d, next probe in %v", n.fails.Load(), d)
	}
	if !n.probeAnswered() || !n.usable(now()) {
		t.Fatal("a probe answered, and the node is not back")
	}
	if n.fails.Load() != 2 {
		t.Errorf("failures %d once back, want 2 kept until it answers again", n.fails.Load())
	}
	n.markDown() // it fails a read again at once: the backoff goes on
	if d := time.Duration(n.retryAt.Load() - now()); n.fails.Load() != 3 || d <= 2*probeBackoffMin {
		t.Errorf("failing again: failures %d, next probe in %v", n.fails.Load(), d)
	}
	n.probeAnswered()
	if n.probeAnswered() || n.fails.Load() != 0 {
		t.Errorf("answering twice: failures %d, want 0", n.fails.Load())
	}
}

// A writer named by several hosts: each host is also a replica node,
// unless listed in replicas already; one host, or no replicas, adds none.
func TestWriterCandidatesAreReplicas(t *testing.T) {
	for _, tc := range []struct {
		dsn  string
		want []string // node addresses; * marks a writer candidate
	}{
		{"postgres://u@a:5432,b:5433,A:5432/db?target_session_attrs=read-write&replicas=b:5433,c",
			[]string{"b:5433", "c:5432", "*a:5432"}},
		{"host=a,b port=5432,5433 user=u target_session_attrs=primary replicas=c:5434",
			[]string{"c:5434", "*a:5432", "*b:5433"}},
		{"host=a user=u replicas=b", []string{"b:5432"}},
		{"host=a,b user=u", nil}, // no replicas: pgx alone, untouched
	} {
		cfg, err := ParseDSN(tc.dsn)
		if err != nil {
			t.Fatal(err)
		}
		c, err := newConnector(cfg, connHooks{})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for i, n := range c.topo.replicas {
			if n.index != i {
				t.Errorf("%s: node %s has index %d at %d", tc.dsn, n.addr, n.index, i)
			}
			a := n.addr
			if n.candidate {
				a = "*" + a
			}
			got = append(got, a)
		}
		if len(c.replicas) != len(got) || len(got) != len(tc.want) {
			t.Errorf("%s: nodes %q (%d connectors), want %q", tc.dsn, got, len(c.replicas), tc.want)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("%s: nodes %q, want %q", tc.dsn, got, tc.want)
				break
			}
		}
	}
}

// The first position of a new timeline moves the pool's watermark to it,
// restarts the primary-position history, and from then on positions of the
// old timeline (stragglers) move nothing shared.
func TestTimelineSwitch(t *testing.T) {
	cfg, err := ParseDSN("host=a user=u replicas=b")
	if err != nil {
		t.Fatal(err)
	}
	c, err := newConnector(cfg, connHooks{})
	if err != nil {
		t.Fatal(err)
	}
	if !c.sawPrimary(primaryPos{lsn: 100, tli: 1}) || c.tli.Load() != 1 || c.stats.writerChanges.Load() != 0 {
		t.Fatalf("first position: timeline %d, changes %d", c.tli.Load(), c.stats.writerChanges.Load())
	}
	c.db.wm.Advance(5000) // a write the new writer never got
	c.topo.hist.add(5000, time.Now().UnixNano(), 1)
	if !c.sawPrimary(primaryPos{lsn: 300, tli: 2}) {
		t.Fatal("a position of a new timeline was refused")
	}
	if c.tli.Load() != 2 || c.db.wm.Load() != 300 || c.topo.hist.latest() != 300 || c.stats.writerChanges.Load() != 1 {
		t.Fatalf("after the switch: timeline %d, pool watermark %v, history at %v, changes %d",
			c.tli.Load(), c.db.wm.Load(), c.topo.hist.latest(), c.stats.writerChanges.Load())
	}
	if c.sawPrimary(primaryPos{lsn: 9000, tli: 1}) || c.topo.hist.latest() != 300 {
		t.Fatalf("a straggler of the old timeline was taken: history at %v", c.topo.hist.latest())
	}
	if !c.sawPrimary(primaryPos{lsn: 400, tli: 2}) || c.topo.hist.latest() != 400 {
		t.Fatal("a position of the current timeline was not recorded")
	}

	// A Session moves to a new generation, and not back to an older one.
	s := NewSession()
	s.advanceAt(generation{system: 7, timeline: 1}, 5000)
	s.advanceAt(generation{system: 7, timeline: 2}, 300)
	s.advanceAt(generation{system: 7, timeline: 1}, 9000)
	if g, l := s.position(); g != (generation{system: 7, timeline: 2}) || l != 300 {
		t.Fatalf("session at %+v %v, want timeline 2 at 300", g, l)
	}
}

// startToggleProxy starts a pgtest.SwitchProxy in front of a fake server, closed
// with the test: down (SetTarget("")) it takes each connection and closes it
// at once, as a server that refuses to talk.
func startToggleProxy(t *testing.T, target string) *pgtest.SwitchProxy {
	t.Helper()
	p, err := pgtest.StartSwitchProxy(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// fakeNodes starts a fake writer and a fake standby answering "writer" and
// "replica" to backoffRead (and pgryw's own statements).
func fakeNodes(t *testing.T) (writer, replica *pgfake.Server) {
	t.Helper()
	answer := func(who string, standby bool) pgfake.Handler {
		return func(c *pgfake.Conn, b pgfake.Batch) []pgproto3.BackendMessage {
			return c.Answer(b, func(q pgfake.Query) pgfake.Result {
				switch q.SQL {
				case backoffRead:
					return pgfake.Result{Cols: []pgfake.Column{{Name: "v", OID: 25}}, Rows: [][][]byte{pgfake.Row(who)}}
				case sqlPoll:
					rec := "f"
					if standby {
						rec = "t"
					}
					return pgfake.Result{Cols: []pgfake.Column{{Name: "lsn", OID: 3220}, {Name: "rec", OID: 16}}, Rows: [][][]byte{pgfake.Row("0/3000000", rec)}}
				case sqlCapture:
					return pgfake.Result{Cols: []pgfake.Column{{Name: "l", OID: 3220}, {Name: "b", OID: 25}, {Name: "f", OID: 25}, {Name: "o", OID: 26}},
						Rows: [][][]byte{{[]byte("0/3000000"), []byte("8192"), []byte("000000010000000000000003"), nil}}}
				case sqlCaptureLSN:
					return pgfake.Result{Cols: []pgfake.Column{{Name: "l", OID: 3220}}, Rows: [][][]byte{pgfake.Row("0/3000000")}}
				}
				return pgfake.Result{Err: pgfake.Error("42601", "unexpected "+q.SQL)}
			})
		}
	}
	var err error
	if writer, err = pgfake.Start(pgfake.Config{InHotStandby: "off", Handler: answer("writer", false)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { writer.Close() })
	if replica, err = pgfake.Start(pgfake.Config{InHotStandby: "on", Handler: answer("replica", true)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { replica.Close() })
	return writer, replica
}

const backoffRead = "SELECT v FROM t"

// A replica that goes down is left alone by reads, which go to the writer
// without an error and never connect to it (every connection attempt is the
// monitor's), and is probed by the monitor, each probe after twice the wait
// of the one before; when it answers again, reads go back to it. With
// read_your_writes=off too, where the monitor sends nothing to a healthy
// replica.
func TestDownReplicaBackoff(t *testing.T) {
	t.Parallel()
	for _, extra := range []string{"", "read_your_writes=off"} {
		t.Run("extra="+extra, func(t *testing.T) {
			t.Parallel()
			writer, replica := fakeNodes(t)
			proxy := startToggleProxy(t, replica.Addr())
			cfg, err := ParseDSN(fmt.Sprintf("host=%s port=%d user=app password=hunter2 dbname=app sslmode=disable connect_timeout=2 replicas=%s %s",
				writer.Host(), writer.Port(), proxy.Addr(), extra))
			if err != nil {
				t.Fatal(err)
			}
			logs := &pgtest.Logs{}
			cfg.Logger = slog.New(logs)
			c, err := newConnector(cfg, connHooks{})
			if err != nil {
				t.Fatal(err)
			}
			// The probes' backoff starts at first, not probeBackoffMin, so
			// the test runs in a fraction of the time; it is the same
			// doubling.
			const first = 20 * time.Millisecond
			for _, r := range c.topo.replicas {
				r.probeMin = first
			}
			c.monitorEvery = first / 2
			var mu sync.Mutex
			var down bool
			var probes []time.Time // the monitor's connection attempts while down
			var readDials int      // reads' connection attempts while down
			dial := c.dial
			c.dial = func(ctx context.Context, n *node, why dialFor) (driver.Conn, error) {
				if n.index >= 0 {
					mu.Lock()
					if down {
						if why == forMonitor {
							probes = append(probes, time.Now())
						} else {
							readDials++
						}
					}
					mu.Unlock()
				}
				return dial(ctx, n, why)
			}
			db := sql.OpenDB(c)
			defer db.Close()
			db.SetMaxOpenConns(2)
			read := func() string {
				t.Helper()
				var v string
				if err := db.QueryRow(backoffRead).Scan(&v); err != nil {
					t.Fatalf("read: %v", err)
				}
				return v
			}
			// held keeps a replica connection that is idle while the
			// replica is down, and dies with it.
			held, err := db.Conn(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			defer held.Close()
			for _, q := range []interface {
				QueryRowContext(context.Context, string, ...any) *sql.Row
			}{held, db} {
				var v string
				if err := q.QueryRowContext(context.Background(), backoffRead).Scan(&v); err != nil || v != "replica" {
					t.Fatalf("the first read was served by the %s (%v)", v, err)
				}
			}

			mu.Lock()
			down = true
			mu.Unlock()
			proxy.SetTarget("")
			start := time.Now()
			for time.Since(start) < 25*first {
				if v := read(); v != "writer" {
					t.Fatalf("a read was served by the down replica")
				}
				time.Sleep(5 * time.Millisecond)
			}
			mu.Lock()
			down = false
			got, rd := append([]time.Time(nil), probes...), readDials
			mu.Unlock()
			// One read may find the replica gone before the monitor does
			// (its connection died with the proxy's; under load the
			// monitor's 10 ms tick can come later) and try a new
			// connection once; after that failure the node is down, and
			// no read dials it again.
			if rd > 1 {
				t.Errorf("reads connected to the down replica %d times, want at most 1", rd)
			}
			if len(got) < 2 {
				t.Fatalf("%d probes while down: the monitor does not probe", len(got))
			}
			// The i-th probe came after at least i failures.
			var at []time.Duration
			for _, p := range got {
				at = append(at, p.Sub(start).Round(time.Millisecond))
			}
			for i := 1; i < len(got); i++ {
				if gap, min := got[i].Sub(got[i-1]), backoffFrom(first, int32(i)); gap < min-5*time.Millisecond {
					t.Errorf("probe %d came %v after the one before, want at least %v (probes at %v)", i, gap, min, at)
				}
			}
			t.Logf("%d probes while down, at %v", len(got), at)

			proxy.SetTarget(replica.Addr())
			back := time.Now()
			for read() != "replica" {
				if time.Since(back) > probeBackoffMax+5*time.Second {
					t.Fatalf("the replica answers again, and reads do not go to it after %v", time.Since(back))
				}
				time.Sleep(5 * time.Millisecond)
			}
			t.Logf("reads back on the replica %v after it answered again", time.Since(back).Round(time.Millisecond))
			// The held connection's replica connection died while the
			// replica was down: it is replaced, not tried (which would
			// fail, and take the replica out of reads again).
			fails := c.topo.replicas[0].fails.Load()
			var v string
			if err := held.QueryRowContext(context.Background(), backoffRead).Scan(&v); err != nil || v != "replica" {
				t.Errorf("read on a connection idle through the outage: served by the %s (%v)", v, err)
			}
			if n := c.topo.replicas[0]; n.down.Load() || n.fails.Load() > fails {
				t.Errorf("the replica failed again (down %v, failures %d, were %d)", n.down.Load(), n.fails.Load(), fails)
			}

			// The monitor logged the node leaving reads and coming back,
			// naming it and never the password.
			addr := proxy.Addr()
			var sawDown, sawBack bool
			for _, l := range logs.Lines() {
				if strings.Contains(l, "hunter2") {
					t.Errorf("a log line holds the password: %s", l)
				}
				if !strings.Contains(l, addr) {
					continue
				}
				sawDown = sawDown || strings.HasPrefix(l, "WARN ") && strings.Contains(l, "node down")
				sawBack = sawBack || strings.HasPrefix(l, "INFO ") && strings.Contains(l, "node up")
			}
			if !sawDown || !sawBack {
				t.Errorf("logged node down at Warn: %v, back at Info: %v; lines: %v", sawDown, sawBack, logs.Lines())
			}
		})
	}
}

// BenchmarkIdlePeek is what Conn.checkPrimary adds before the first
// statement on a writer connection that database/sql handed out again: one
// non-blocking peek at its socket. It allocates nothing.
func BenchmarkIdlePeek(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			defer c.Close()
			io.Copy(io.Discard, c)
		}
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	p := newSockPeek(nc)
	if p == nil {
		b.Skip("no socket peek on this platform")
	}
	w := wire.Wrap(nc)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if p.gone(w) {
			b.Fatal("a live connection looks gone")
		}
	}
}
