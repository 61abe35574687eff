package pgryw_test

// Per-node stats and the served-by hook against real replicas: waits and
// their histogram, fallbacks and stale reads by on_timeout, measured lag,
// node state changes in the log, and the stats of a sql.Open pool.

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
)

type servedReports struct {
	mu  sync.Mutex
	got []pgryw.ServedBy
}

func (r *servedReports) hook(_ context.Context, s pgryw.ServedBy) {
	r.mu.Lock()
	r.got = append(r.got, s)
	r.mu.Unlock()
}

func (r *servedReports) all() []pgryw.ServedBy {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]pgryw.ServedBy(nil), r.got...)
}

// replicaSums adds up the replicas' counters.
type replicaSums struct {
	reads, stale, waits, timeouts, histCount int64
	histSum                                  time.Duration
	misses                                   pgryw.FallbackCounts
}

func sumReplicas(t *testing.T, ns []pgryw.NodeStats) (primary pgryw.NodeStats, r replicaSums) {
	t.Helper()
	if len(ns) != 3 || ns[0].Role != pgryw.RolePrimary {
		t.Fatalf("NodeStats %+v", ns)
	}
	for _, s := range ns[1:] {
		if s.Role != pgryw.RoleReplica {
			t.Fatalf("node %s: role %v", s.Addr, s.Role)
		}
		var count int64
		for _, c := range s.WaitTime.Counts {
			count += c
		}
		if count != s.WaitTime.Count || s.WaitTime.Count != s.Waits {
			t.Errorf("node %s: histogram counts %v (count %d) for %d waits", s.Addr, s.WaitTime.Counts, s.WaitTime.Count, s.Waits)
		}
		r.reads += s.Reads
		r.stale += s.StaleReads
		r.waits += s.Waits
		r.timeouts += s.WaitTimeouts
		r.histCount += s.WaitTime.Count
		r.histSum += s.WaitTime.Sum
		for i, m := range s.Misses {
			r.misses[i] += m
		}
	}
	return ns[0], r
}

func TestIntegrationNodeStats(t *testing.T) {
	setDelay(t, 50*time.Millisecond)
	db, c := openDB(t, "wait_timeout=2s")
	table := newTable(t)
	var rep servedReports
	c.SetServedBy(rep.hook)
	const n = 20
	for i := 0; i < n; i++ {
		if _, err := db.Exec("INSERT INTO "+table+" VALUES ($1, 1)", i); err != nil {
			t.Fatal(err)
		}
		var k int
		if err := db.QueryRow("SELECT count(*) FROM "+table+" WHERE id = $1", i).Scan(&k); err != nil || k != 1 {
			t.Fatalf("read %d: %d rows, %v", i, k, err)
		}
	}
	st := c.Stats()
	primary, r := sumReplicas(t, c.NodeStats())
	t.Logf("stats %+v\nprimary %+v\nreplicas %+v", st, primary, r)

	// The hook saw every statement: n writes, n reads on replicas.
	var writes, reads, waited int
	var waitSum time.Duration
	for _, s := range rep.all() {
		switch {
		case s.Role == pgryw.RolePrimary && s.Route == pgryw.RouteWrite && s.Addr == cluster.Writer.Addr():
			writes++
		case s.Role == pgryw.RoleReplica && s.Route == pgryw.RouteReplica && s.Fallback == pgryw.FallbackNone && !s.Stale:
			reads++
		default:
			t.Errorf("unexpected report %+v", s)
		}
		if s.Wait > 0 {
			waited++
			waitSum += s.Wait
		}
	}
	if writes != n || reads != n {
		t.Fatalf("%d writes and %d replica reads reported, want %d each", writes, reads, n)
	}
	// Per-node counters agree with the connector's and with the hook.
	if primary.Writes != n || primary.Statements != n || primary.Reads != 0 || primary.Fallbacks.Total() != 0 {
		t.Errorf("primary %+v", primary)
	}
	if r.reads != n || st.ReplicaReads != n {
		t.Errorf("replica reads %d, Stats.ReplicaReads %d, want %d", r.reads, st.ReplicaReads, n)
	}
	if r.waits != st.Waits || r.timeouts != st.WaitTimeouts || r.stale != st.StaleReads || r.timeouts != 0 {
		t.Errorf("per-node waits %d timeouts %d stale %d; Stats %+v", r.waits, r.timeouts, r.stale, st)
	}
	// Replicas 50 ms behind: reads right after their write wait (a
	// worker descheduled for 50 ms may find its replica there already).
	if r.waits < n/2 {
		t.Errorf("only %d of %d reads waited for replicas 50ms behind", r.waits, n)
	}
	if int64(waited) != r.waits || waitSum != r.histSum {
		t.Errorf("hook: %d waits, %v in all; histograms: %d waits, %v", waited, waitSum, r.waits, r.histSum)
	}
	// A wait for a replica 50 ms behind takes a while: most land in the
	// histogram's buckets above 10 ms.
	if r.histSum < time.Duration(r.waits)*10*time.Millisecond {
		t.Errorf("waits for replicas 50ms behind took %v in all, for %d waits", r.histSum, r.waits)
	}
	for _, s := range c.NodeStats() {
		if s.Health != pgryw.HealthUp || s.Position == 0 {
			t.Errorf("node %s: health %v, position %d", s.Addr, s.Health, s.Position)
		}
	}

	// Lag, as the monitor measures it: a replica whose replay is paused
	// falls behind the primary's latest position by the time since it.
	ctx := context.Background()
	if err := cluster.PauseReplay(ctx, 0); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cluster.ResumeReplay(ctx, 0); err != nil {
			t.Error(err)
		}
	}()
	written := time.Now()
	if _, err := db.Exec("INSERT INTO "+table+" VALUES ($1, 1)", n); err != nil {
		t.Fatal(err)
	}
	for {
		s := c.NodeStats()[1]
		if s.Lag >= 200*time.Millisecond {
			if s.Lag > time.Since(written)+time.Second || time.Since(s.LagAt) > 5*time.Second || s.Position >= c.NodeStats()[0].Position {
				t.Fatalf("replica %s: lag %v measured %v ago, position %d (primary %d), %v after the write",
					s.Addr, s.Lag, time.Since(s.LagAt), s.Position, c.NodeStats()[0].Position, time.Since(written))
			}
			break
		}
		if time.Since(written) > 10*time.Second {
			t.Fatalf("replica %s paused for %v: lag measured %v", s.Addr, time.Since(written), s.Lag)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// What on_timeout does when replicas are 100 ms behind and the budget is
// 10 ms, as each node and the hook count it.
func TestIntegrationNodeStatsOnTimeout(t *testing.T) {
	setDelay(t, 100*time.Millisecond)
	for _, onTimeout := range []string{"primary", "stale", "error"} {
		t.Run(onTimeout, func(t *testing.T) {
			db, c := openDB(t, "wait_timeout=10ms&on_timeout="+onTimeout)
			table := newTable(t)
			var rep servedReports
			c.SetServedBy(rep.hook)
			const n = 10
			var behindErrors int64
			for i := 0; i < n; i++ {
				if _, err := db.Exec("INSERT INTO "+table+" VALUES ($1, 1)", i); err != nil {
					t.Fatal(err)
				}
				var k int
				err := db.QueryRow("SELECT count(*) FROM "+table+" WHERE id = $1", i).Scan(&k)
				switch {
				case errors.Is(err, pgryw.ErrReplicaBehind) && onTimeout == "error":
					behindErrors++
				case err != nil:
					t.Fatal(err)
				}
			}
			st := c.Stats()
			primary, r := sumReplicas(t, c.NodeStats())
			t.Logf("stats %+v\nprimary %+v\nreplicas %+v", st, primary, r)
			var fallbacks, stale, onReplica int64
			for _, s := range rep.all() {
				switch {
				case s.Route == pgryw.RouteFallback:
					if s.Fallback != pgryw.FallbackBehind || s.Role != pgryw.RolePrimary {
						t.Errorf("fallback report %+v", s)
					}
					fallbacks++
				case s.Role == pgryw.RoleReplica:
					onReplica++
					if s.Stale {
						stale++
						if s.Fallback != pgryw.FallbackBehind {
							t.Errorf("stale report %+v", s)
						}
					}
				}
			}
			if fallbacks != st.Fallbacks || primary.Fallbacks[pgryw.FallbackBehind] != st.Fallbacks || primary.Fallbacks.Total() != st.Fallbacks {
				t.Errorf("fallbacks: %d reported, primary counts %v, Stats %d", fallbacks, primary.Fallbacks, st.Fallbacks)
			}
			if stale != st.StaleReads || r.stale != st.StaleReads {
				t.Errorf("stale reads: %d reported, replicas count %d, Stats %d", stale, r.stale, st.StaleReads)
			}
			if onReplica != st.ReplicaReads || r.reads != st.ReplicaReads {
				t.Errorf("replica reads: %d reported, replicas count %d, Stats %d", onReplica, r.reads, st.ReplicaReads)
			}
			if behindErrors != st.BehindErrors {
				t.Errorf("%d ErrReplicaBehind, Stats %d", behindErrors, st.BehindErrors)
			}
			if r.waits != st.Waits || r.timeouts != st.WaitTimeouts {
				t.Errorf("waits %d timeouts %d; Stats %+v", r.waits, r.timeouts, st)
			}
			// Each read that was not served in time was missed by a
			// replica that was behind.
			if r.misses[pgryw.FallbackBehind] < st.Fallbacks+st.StaleReads+st.BehindErrors || r.misses.Total() != r.misses[pgryw.FallbackBehind] {
				t.Errorf("replica misses %v; Stats %+v", r.misses, st)
			}
			// Only lucky reads (a worker descheduled for 100 ms) make it
			// in time.
			var missed int64
			switch onTimeout {
			case "primary":
				missed = st.Fallbacks
			case "stale":
				missed = st.StaleReads
			case "error":
				missed = st.BehindErrors
			}
			if missed < n/2 {
				t.Errorf("on_timeout=%s: only %d of %d reads missed replicas 100ms behind with a 10ms budget", onTimeout, missed, n)
			}
		})
	}
}

// waitLine waits up to 20 s for a line of h at or after index from that
// starts with prefix and names node, and returns its index.
func waitLine(t *testing.T, h *pgtest.Logs, from int, prefix, node string) int {
	t.Helper()
	i, ok := h.WaitFor(from, prefix, "node="+node+" ", 20*time.Second)
	if !ok {
		t.Fatalf("no line %q for %s in %q", prefix, node, h.Lines()[from:])
	}
	return i
}

// The monitor notices a replica going down and coming back, and says so at
// Warn and Info.
func TestIntegrationNodeStateLogged(t *testing.T) {
	db, c := openDB(t, "")
	var h pgtest.Logs
	c.SetLogger(slog.New(&h))
	if err := db.Ping(); err != nil { // starts the monitor
		t.Fatal(err)
	}
	addr := cluster.ReplicaAddrs()[1]
	i := waitLine(t, &h, 0, "INFO pgryw: node up", addr)
	if err := cluster.StopNode(1); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			if err := cluster.StartNode(1); err != nil {
				t.Error(err)
			}
		}
	}()
	i = waitLine(t, &h, i, "WARN pgryw: node down", addr)
	if s := c.NodeStats()[2]; s.Addr != addr || s.Health != pgryw.HealthDown && s.Health != pgryw.HealthUp {
		// Up only in the instant between a backoff's end and the next probe.
		t.Errorf("stopped replica: %+v", s)
	}
	if err := cluster.StartNode(1); err != nil {
		t.Fatal(err)
	}
	stopped = false
	waitLine(t, &h, i, "INFO pgryw: node up", addr)
	for _, l := range h.Lines() {
		if strings.Contains(l, "password") || strings.Contains(l, cluster.WriterDSN()) {
			t.Errorf("log line %q", l)
		}
	}
}

// A pool opened with sql.Open reaches its counters, and a pool of another
// driver says it is not pgryw's.
func TestIntegrationStatsOf(t *testing.T) {
	pgtest.Require(t, cluster)
	db, err := sql.Open("pgryw", cluster.WriterDSN()+"&replicas="+strings.Join(cluster.ReplicaAddrs(), ","))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v int
	for i := 0; i < 3; i++ {
		if err := db.QueryRow("SELECT 1").Scan(&v); err != nil {
			t.Fatal(err)
		}
	}
	st, err := pgryw.StatsOf(db)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := pgryw.NodeStatsOf(db)
	if err != nil {
		t.Fatal(err)
	}
	_, r := sumReplicas(t, ns)
	if st.ReplicaReads+st.PrimaryReads != 3 || r.reads != st.ReplicaReads {
		t.Errorf("Stats %+v, replica reads %d", st, r.reads)
	}
	c, err := pgryw.ConnectorOf(db)
	if err != nil || !reflect.DeepEqual(c.Stats(), st) {
		t.Errorf("ConnectorOf: %v, %+v", err, c)
	}

	other, err := sql.Open("pgx", cluster.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := pgryw.StatsOf(other); err == nil || !strings.Contains(err.Error(), "not pgryw") {
		t.Errorf("StatsOf a pgx pool: %v", err)
	}
	if _, err := pgryw.NodeStatsOf(other); err == nil {
		t.Error("NodeStatsOf a pgx pool: no error")
	}
}
