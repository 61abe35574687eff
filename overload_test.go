package pgryw

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pgryw/pgryw/internal/lsn"
)

// Unit tests of the overload bounds: the max_fallback gate, the
// max_replica_lag arithmetic, and (on scripted servers, as in
// routing_test.go) which node serves a read when a bound
// applies. The wire side of max_waits (what check a read over the bound
// sends) is in overload_protocol_test.go; the bounds under load against
// real servers in overload_integration_test.go.

func TestFallbackGate(t *testing.T) {
	var g fallbackGate
	g.init(2)
	for i := 0; i < 2; i++ {
		if !g.try() {
			t.Fatalf("slot %d of 2 not taken", i+1)
		}
	}
	if g.try() {
		t.Fatal("a third slot taken")
	}
	if g.wait(context.Background(), time.Millisecond) {
		t.Fatal("wait took a slot none gave back")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if g.wait(ctx, time.Hour) {
		t.Fatal("wait took a slot with its context ended")
	}
	got := make(chan bool)
	go func() { got <- g.wait(context.Background(), time.Hour) }()
	g.release()
	if !<-got {
		t.Fatal("wait did not take the slot given back")
	}
	if g.inUse.Load() != 2 || g.peak.Load() != 2 {
		t.Fatalf("inUse %d peak %d, want 2 2", g.inUse.Load(), g.peak.Load())
	}
	g.release()
	g.release()
	if g.inUse.Load() != 0 || len(g.slots) != 0 {
		t.Fatalf("after releasing all: inUse %d, %d tokens", g.inUse.Load(), len(g.slots))
	}

	var free fallbackGate
	free.init(0) // no bound: counted all the same
	for i := 0; i < 100; i++ {
		if !free.try() {
			t.Fatal("max_fallback=0 refused a slot")
		}
	}
	if free.peak.Load() != 100 {
		t.Fatalf("peak %d, want 100", free.peak.Load())
	}
}

func TestPrimarySamples(t *testing.T) {
	var s primarySamples
	if _, ok := s.atOrBelow(100); ok {
		t.Fatal("a time from an empty ring")
	}
	if _, _, ok := s.latest(); ok {
		t.Fatal("a latest sample from an empty ring")
	}
	s.add(100, 10)
	s.add(100, 20) // still there: the later time bounds more
	s.add(200, 30)
	s.add(300, 40)
	for _, c := range []struct {
		p    lsn.LSN
		want int64
		ok   bool
	}{{50, 0, false}, {100, 20, true}, {199, 20, true}, {200, 30, true}, {1000, 40, true}} {
		if at, ok := s.atOrBelow(c.p); at != c.want || ok != c.ok {
			t.Errorf("atOrBelow(%d) = %d, %v; want %d, %v", c.p, at, ok, c.want, c.ok)
		}
	}
	if l, at, ok := s.latest(); l != 300 || at != 40 || !ok {
		t.Errorf("latest = %d, %d, %v", l, at, ok)
	}
	// A lower position is another primary history: start over.
	s.add(50, 50)
	if _, ok := s.atOrBelow(100); !ok {
		t.Fatal("position 50 at time 50 not found at or below 100")
	}
	if at, _ := s.atOrBelow(1000); at != 50 {
		t.Fatalf("old history kept: atOrBelow(1000) = %d", at)
	}

	// With a spacing, older entries stay that far apart and the newest is
	// always the latest sample; the ring wraps and stays ordered.
	s = primarySamples{spacing: 100}
	for i := int64(1); i <= 10000; i++ {
		s.add(lsn.LSN(i*10), i*10)
	}
	if s.n != sampleRing {
		t.Fatalf("%d entries, want a full ring of %d", s.n, sampleRing)
	}
	for k := 1; k < s.n; k++ {
		a, b := (s.head+k-1)%sampleRing, (s.head+k)%sampleRing
		if s.lsn[a] >= s.lsn[b] || s.at[a] >= s.at[b] {
			t.Fatalf("ring out of order at %d", k)
		}
		if k < s.n-1 && s.at[b]-s.at[a] < 90 {
			t.Fatalf("entries %d apart, spacing 100", s.at[b]-s.at[a])
		}
	}
	if l, at, _ := s.latest(); l != 100000 || at != 100000 {
		t.Fatalf("latest = %d at %d, want the last sample", l, at)
	}
	if at, ok := s.atOrBelow(99995); !ok || at < 99995-200 {
		t.Fatalf("atOrBelow(99995) = %d, %v: more than two spacings old", at, ok)
	}
	if _, ok := s.atOrBelow(10); ok {
		t.Fatal("a position older than the ring found")
	}
}

func TestLagBoundAllows(t *testing.T) {
	now := time.Now().UnixNano()
	sec := int64(time.Second)
	n := &node{}

	var d lagBound
	d.init(ReplicaLag{Duration: 2 * time.Second})
	if d.allows(n, now) {
		t.Fatal("allowed with nothing known")
	}
	d.samples.add(1000, now-5*sec)
	d.samples.add(2000, now-3*sec)
	d.samples.add(3000, now-sec)
	d.samples.add(4000, now-sec/10)
	for _, c := range []struct {
		replay lsn.LSN
		want   bool
	}{
		{0, false},    // no replay position known
		{500, false},  // older than every sample
		{1500, false}, // has what the primary had 5s ago
		{2999, false}, // 3s ago
		{3000, true},  // 1s ago
		{4000, true},  // caught up with the latest sample
		{9000, true},
	} {
		n.replay.update(lsn.LSN(uint64(c.replay)), 0, true)
		if got := d.allows(n, now); got != c.want {
			t.Errorf("duration bound, replay %d: allows = %v", c.replay, got)
		}
	}
	// Staleness grows while nothing new is learnt.
	n.replay.update(lsn.LSN(3000), 0, true)
	if d.allows(n, now+2*sec) {
		t.Error("allowed 2s later without news")
	}

	var b lagBound
	b.init(ReplicaLag{Bytes: 1024})
	n.replay.update(lsn.LSN(4000), 0, true)
	if b.allows(n, now) {
		t.Fatal("allowed with no sample of the primary")
	}
	b.samples.add(5000, now-sec/10)
	for _, c := range []struct {
		replay lsn.LSN
		want   bool
	}{{3976, true}, {3975, false}, {6000, true}, {0, false}} {
		n.replay.update(lsn.LSN(uint64(c.replay)), 0, true)
		if got := b.allows(n, now); got != c.want {
			t.Errorf("byte bound, replay %d: allows = %v", c.replay, got)
		}
	}
	n.replay.update(lsn.LSN(5000), 0, true)
	if b.allows(n, now+2*lagFresh) {
		t.Error("allowed on a sample older than lagFresh")
	}
}

// pick passes over replicas not known to be within max_replica_lag; when
// none is, the least behind comes back as hopeless, for on_timeout.
func TestPickLagBound(t *testing.T) {
	now := time.Now().UnixNano()
	topo := &topology{}
	topo.lag.init(ReplicaLag{Duration: time.Second})
	for i, r := range []lsn.LSN{100, 300, 200} {
		n := &node{index: i}
		n.replay.update(lsn.LSN(uint64(r)), 0, true)
		topo.replicas = append(topo.replicas, n)
	}
	topo.lag.samples.add(150, now-10*int64(time.Second))
	topo.lag.samples.add(250, now-int64(time.Millisecond))
	for i := 0; i < 6; i++ {
		if n, hopeless := topo.pick(0, 0, time.Second); n == nil || n.index != 1 || hopeless {
			t.Fatalf("pick = %+v, %v; want replica 1, the only one within the bound", n, hopeless)
		}
	}
	if n, hopeless := topo.pick(0, 1<<1, time.Second); n == nil || n.index != 2 || !hopeless {
		t.Fatalf("pick without 1 = %+v, %v; want replica 2, least behind, hopeless", n, hopeless)
	}
	if topo.lag.skips.Load() == 0 {
		t.Fatal("no skips counted")
	}
}

// max_replica_lag with read_your_writes=off (the scripted cluster's setting):
// unknown or too far behind, the replica is passed over and on_timeout
// decides; known to be within it, the replica reads.
func TestMaxReplicaLagRoutes(t *testing.T) {
	for _, tc := range []struct {
		extra   string
		replica bool   // the read is served by the replica when passed over
		errHas  string // or fails with this
	}{
		{"", false, ""},
		{"on_timeout=error", false, "not known to be within max_replica_lag=2s"},
		{"on_timeout=stale", true, ""},
	} {
		t.Run(tc.extra, func(t *testing.T) {
			mc := newFakeCluster(t, 1, "max_replica_lag=2s "+tc.extra)
			c := mc.c
			r := c.topo.replicas[0]
			now := time.Now().UnixNano()
			expect := func(replica bool) {
				if replica {
					mc.replicas[0].ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
				} else if tc.errHas == "" {
					mc.primary.ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
				}
			}
			check := func(what string, err error) {
				t.Helper()
				if tc.errHas != "" {
					var rbe *ReplicaBehindError
					if !errors.Is(err, ErrReplicaBehind) || !errors.As(err, &rbe) || rbe.Limit != "max_replica_lag=2s" || !strings.Contains(err.Error(), tc.errHas) {
						t.Fatalf("%s: %v; want ErrReplicaBehind for max_replica_lag=2s", what, err)
					}
				} else if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
			}

			// Nothing known yet.
			expect(tc.replica)
			_, err := readOne(t, mc.db)
			check("nothing known", err)

			// Known to have what the primary had 3s ago.
			c.topo.lag.samples.add(100, now-3*int64(time.Second))
			c.topo.lag.samples.add(200, now-int64(time.Millisecond))
			c.topo.observe(r, 0, 100, now, now)
			expect(tc.replica)
			_, err = readOne(t, mc.db)
			check("3s behind", err)

			// Known to have what the primary had a moment ago.
			c.topo.observe(r, 0, 200, now, now)
			expect(true)
			if _, err := readOne(t, mc.db); err != nil {
				t.Fatalf("caught up: %v", err)
			}
			mc.verify(t)
			st := c.Stats()
			if st.LagSkips < 2 || st.ReplicaReads == 0 {
				t.Errorf("stats %+v", st)
			}
			switch {
			case tc.errHas != "" && st.BehindErrors != 2,
				tc.replica && st.StaleReads != 2,
				!tc.replica && tc.errHas == "" && (st.Fallbacks != 2 || st.FallbackPeak != 1):
				t.Errorf("stats %+v", st)
			}
			if c.over.fallback.inUse.Load() != 0 {
				t.Errorf("%d fallback slots still taken", c.over.fallback.inUse.Load())
			}
		})
	}
}

// max_fallback full: on_max_fallback decides. wait takes the slot given
// back meanwhile, or fails once the budget runs out; error fails at once;
// stale serves the replica's rows.
func TestMaxFallbackFull(t *testing.T) {
	for _, tc := range []struct {
		name, extra string
		replica     bool // served by the replica
		fails       bool
		freed       bool // a slot is given back while the read waits
	}{
		{"wait freed", "wait_timeout=1h", false, false, true},
		{"wait times out", "wait_timeout=20ms", false, true, false},
		{"error", "on_max_fallback=error", false, true, false},
		{"stale", "on_max_fallback=stale", true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mc := newFakeCluster(t, 1, "max_replica_lag=2s max_fallback=1 "+tc.extra)
			c := mc.c
			var logged bytes.Buffer
			c.SetLogger(slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug})))
			release := HoldFallbacks(c, 1)
			if tc.freed {
				go func() {
					for c.stats.fallbackWaits.Load() == 0 {
						time.Sleep(time.Millisecond)
					}
					release()
				}()
			} else {
				defer release()
			}
			switch {
			case tc.replica:
				mc.replicas[0].ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
			case !tc.fails:
				mc.primary.ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
			}
			_, err := readOne(t, mc.db)
			var rbe *ReplicaBehindError
			if tc.fails {
				if !errors.As(err, &rbe) || !errors.Is(err, ErrReplicaBehind) || rbe.Limit != "max_fallback=1" || !strings.Contains(err.Error(), "max_fallback=1 reads were already running on the primary") {
					t.Fatalf("read: %v; want ErrReplicaBehind for max_fallback=1", err)
				}
			} else if err != nil {
				t.Fatalf("read: %v", err)
			}
			mc.verify(t)
			st := c.Stats()
			wantWaits := int64(0)
			if !strings.Contains(tc.name, "error") && !tc.replica {
				wantWaits = 1
			}
			if st.FallbackWaits != wantWaits || st.FallbacksRefused != map[bool]int64{true: 0, false: 1}[tc.freed] || st.FallbackPeak != 1 {
				t.Errorf("stats %+v", st)
			}
			if tc.replica && st.StaleReads != 1 {
				t.Errorf("stats %+v", st)
			}
			refused := strings.Contains(logged.String(), "max_fallback reached")
			if refused == tc.freed || strings.Contains(logged.String(), "SELECT") {
				t.Errorf("log:\n%s", logged.String())
			}
		})
	}
}

// A fallback read keeps its slot until its rows are closed; a read-only
// transaction that falls back, until it ends.
func TestFallbackSlotHeldUntilDone(t *testing.T) {
	mc := newFakeCluster(t, 1, "max_replica_lag=2s max_fallback=1 on_max_fallback=error")
	c := mc.c
	inUse := func() int64 { return c.over.fallback.inUse.Load() }

	mc.primary.ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	rows, err := mc.db.Query(selectSQL, int64(7))
	if err != nil {
		t.Fatal(err)
	}
	if inUse() != 1 {
		t.Fatalf("open rows: %d slots taken, want 1", inUse())
	}
	rows.Close()
	if inUse() != 0 {
		t.Fatalf("closed rows: %d slots taken, want 0", inUse())
	}

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
	if inUse() != 1 {
		t.Fatalf("read-only transaction on the primary: %d slots taken, want 1", inUse())
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if inUse() != 0 {
		t.Fatalf("after commit: %d slots taken, want 0", inUse())
	}

	// Writes and hinted reads take no slot.
	release := HoldFallbacks(c, 1)
	defer release()
	mc.primary.ExpectExec(insertSQL).WithArgs(1)
	mc.primary.ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	if _, err := mc.db.Exec(insertSQL, int64(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := readOne(t, withPrimaryDB{mc.db}); err != nil {
		t.Fatal(err)
	}
	mc.verify(t)
}

// A replica that is unreachable is not a lag fallback: the read goes to
// the primary even with max_fallback taken.
func TestUnreachableIgnoresMaxFallback(t *testing.T) {
	mc := newFakeCluster(t, 1, "max_fallback=1 on_max_fallback=error")
	release := HoldFallbacks(mc.c, 1)
	defer release()
	mc.c.topo.replicas[0].markDown()
	mc.primary.ExpectQuery(selectSQL).WithArgs(7).WillReturnRows(valueRow(1))
	if _, err := readOne(t, mc.db); err != nil {
		t.Fatal(err)
	}
	mc.verify(t)
}

// BenchmarkPickMaxReplicaLag runs replica choice with and without
// max_replica_lag on the same replicas, alternating batches in one loop,
// and reports the bound's cost as a ratio. Neither allocates.
func BenchmarkPickMaxReplicaLag(b *testing.B) {
	mk := func(bound ReplicaLag) *topology {
		t := &topology{}
		t.lag.init(bound)
		now := time.Now().UnixNano()
		for i := 0; i < 3; i++ {
			n := &node{index: i}
			n.replay.update(lsn.LSN(uint64(0x3000000+i*16)), 0, true)
			t.replicas = append(t.replicas, n)
		}
		for i := int64(0); i < sampleRing; i++ {
			t.lag.samples.add(lsn.LSN(0x2000000+i*0x1000), now-(sampleRing-i)*int64(sampleInterval))
		}
		t.lag.samples.add(0x3000000, now)
		return t
	}
	plain, bounded := mk(ReplicaLag{}), mk(ReplicaLag{Duration: time.Hour})
	const batch = 64
	run := func(t *topology) time.Duration {
		start := time.Now()
		for k := 0; k < batch; k++ {
			if n, hopeless := t.pick(0x3000010, 0, time.Second); n == nil || hopeless {
				b.Fatal("no replica")
			}
		}
		return time.Since(start)
	}
	var tPlain, tBounded time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			tPlain += run(plain)
			tBounded += run(bounded)
		} else {
			tBounded += run(bounded)
			tPlain += run(plain)
		}
	}
	b.ReportMetric(float64(tPlain.Nanoseconds())/float64(b.N*batch), "plain-ns/pick")
	b.ReportMetric(float64(tBounded.Nanoseconds())/float64(b.N*batch), "bounded-ns/pick")
	b.ReportMetric(float64(tBounded)/float64(tPlain), "bounded/plain")
}
