package pgryw_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// The overload bounds against real servers, under load.

// pauseReplicas pauses replay on replica i (i<0: all) for one test, and
// resumes it and waits for the cluster to catch up afterwards.
func pauseReplicas(t *testing.T, i int) {
	t.Helper()
	ctx := context.Background()
	if err := cluster.PauseReplay(ctx, i); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.ResumeReplay(ctx, i); err != nil {
			t.Error(err)
		}
		if err := cluster.WaitCaughtUp(ctx); err != nil {
			t.Error(err)
		}
	})
}

// probeTag marks the test's reads, so that pg_stat_activity on the primary
// tells them from everything else.
const probeTag = "pgryw-overload-probe"

// activityPeak samples, from a plain pgx connection of its own, how many of
// the probe reads the primary is running at once, until stop is called,
// and returns the highest count. An entry counts only if its statement
// started before the sampling statement did: the view is not read in one
// instant, so a read that started while it was being read might be one
// that took the place of another read already counted as active.
// Entries that started earlier were all running when the sample began.
func activityPeak(t *testing.T) (stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, cluster.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	var peak, samples int
	var sampleErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			var n int
			err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE pid <> pg_backend_pid() AND state = 'active'
				AND query LIKE '%`+probeTag+`%' AND query_start <= statement_timestamp()`).Scan(&n)
			if err != nil {
				if ctx.Err() == nil {
					sampleErr = err
				}
				return
			}
			samples++
			peak = max(peak, n)
			time.Sleep(time.Millisecond)
		}
	}()
	return func() int {
		cancel()
		<-done
		conn.Close(context.Background())
		if sampleErr != nil {
			t.Fatalf("sampling pg_stat_activity: %v", sampleErr)
		}
		t.Logf("pg_stat_activity: %d samples, at most %d probe reads active on the primary", samples, peak)
		return peak
	}
}

// overloadRun is what 32 readers doing write-then-read saw.
type overloadRun struct {
	reads, onPrimary, onReplica, stale, errs atomic.Int64
	badErr                                   atomic.Value
	activity                                 int
	stats                                    pgryw.Stats
}

// overloadLoad runs readers workers, each inserting a row and at once
// reading it back iterations times, with every replica's replay paused,
// while pg_stat_activity on the primary is sampled.
func overloadLoad(t *testing.T, extra string, readers, iterations int) *overloadRun {
	t.Helper()
	table := newTable(t)
	pauseReplicas(t, -1)
	// pg_sleep makes each read last long enough to be seen; it is
	// volatile, so it is declared a read.
	db, c := openDB(t, "read_functions=pg_sleep&"+extra)
	db.SetMaxOpenConns(readers)
	db.SetMaxIdleConns(readers)
	query := "SELECT v, pg_sleep(0.02), " + nodePort + " FROM " + table + " WHERE id = $1 /* " + probeTag + " */"

	var r overloadRun
	stop := activityPeak(t)
	var wg sync.WaitGroup
	var id atomic.Int64
	for g := 0; g < readers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < iterations; i++ {
				k := id.Add(1)
				if _, err := db.Exec("INSERT INTO "+table+" (id, v) VALUES ($1, $2)", k, k); err != nil {
					t.Errorf("insert: %v", err)
					return
				}
				var v, port int
				err := db.QueryRow(query, k).Scan(&v, new(string), &port)
				r.reads.Add(1)
				var rbe *pgryw.ReplicaBehindError
				switch {
				case errors.Is(err, sql.ErrNoRows):
					r.stale.Add(1) // a paused replica served it
				case errors.As(err, &rbe) && rbe.Limit == "max_fallback=4":
					r.errs.Add(1)
				case err != nil:
					r.badErr.CompareAndSwap(nil, err)
				case port == cluster.Writer.Port:
					r.onPrimary.Add(1)
				default:
					r.onReplica.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	r.activity = stop()
	r.stats = c.Stats()
	t.Logf("reads=%d primary=%d replica=%d stale=%d errors=%d stats=%+v",
		r.reads.Load(), r.onPrimary.Load(), r.onReplica.Load(), r.stale.Load(), r.errs.Load(), r.stats)
	if err := r.badErr.Load(); err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
	return &r
}

// Every replica paused under 32 concurrent readers doing write-then-read:
// no replica can serve a read, so each falls back to the primary, where
// max_fallback=4 bounds how many run at once, both as pgryw counts them
// and as the primary's pg_stat_activity shows them; on_max_fallback decides
// for the rest. Without the bound (the control) the primary runs many
// more at once: the sampling can see a breach.
func TestIntegrationMaxFallback(t *testing.T) {
	const readers, iterations, bound = 32, 8, 4
	for _, tc := range []struct {
		name, extra string
		check       func(t *testing.T, r *overloadRun)
	}{
		{"wait", "max_fallback=4&wait_timeout=2s", func(t *testing.T, r *overloadRun) {
			// Everything on the primary, each read waiting its turn.
			if r.onPrimary.Load() != r.reads.Load() || r.stats.FallbackWaits == 0 || r.stats.FallbacksRefused != 0 {
				t.Fatal("on_max_fallback=wait: want every read on the primary, some after waiting")
			}
		}},
		{"error", "max_fallback=4&on_max_fallback=error&wait_timeout=100ms", func(t *testing.T, r *overloadRun) {
			if r.errs.Load() == 0 || r.errs.Load() != r.stats.FallbacksRefused || r.stale.Load() != 0 ||
				r.errs.Load()+r.onPrimary.Load() != r.reads.Load() {
				t.Fatal("on_max_fallback=error: want the reads over the bound to fail, the rest on the primary")
			}
		}},
		{"stale", "max_fallback=4&on_max_fallback=stale&wait_timeout=100ms", func(t *testing.T, r *overloadRun) {
			if r.stale.Load() == 0 || r.stale.Load() != r.stats.FallbacksRefused || r.stats.StaleReads != r.stale.Load() ||
				r.errs.Load() != 0 || r.stale.Load()+r.onPrimary.Load() != r.reads.Load() {
				t.Fatal("on_max_fallback=stale: want the reads over the bound served stale by a replica, the rest on the primary")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := overloadLoad(t, tc.extra, readers, iterations)
			if r.activity > bound || r.stats.FallbackPeak > bound {
				t.Fatalf("max_fallback=%d breached: %d fallback reads active on the primary at once, pgryw counted %d",
					bound, r.activity, r.stats.FallbackPeak)
			}
			if r.stats.FallbackPeak != bound || r.activity == 0 {
				t.Fatalf("the bound was never reached (pgryw counted %d at once, the primary showed %d): the load did not overload",
					r.stats.FallbackPeak, r.activity)
			}
			tc.check(t, r)
		})
	}
	t.Run("control", func(t *testing.T) {
		r := overloadLoad(t, "max_fallback=0&wait_timeout=100ms", readers, iterations)
		if r.activity <= bound || r.stats.FallbackPeak <= bound {
			t.Fatalf("without max_fallback the primary ran at most %d fallback reads at once (pgryw counted %d): the test cannot tell a breach",
				r.activity, r.stats.FallbackPeak)
		}
		if r.onPrimary.Load() != r.reads.Load() {
			t.Fatal("without max_fallback: want every read on the primary")
		}
	})
}

// max_waits: replicas 300ms behind and a 2s budget, so every read after a
// write waits on a replica; with max_waits=2, at most two reads wait on
// each at once (pgryw's count, and on PostgreSQL 19 the WAIT FOR
// statements the replicas show active), the others are not parked there,
// and every read still sees its own write. The control, without the bound,
// parks more.
func TestIntegrationMaxWaits(t *testing.T) {
	setDelay(t, 300*time.Millisecond)
	for _, tc := range []struct {
		name, extra string
		bound       int64
	}{{"bounded", "max_waits=2", 2}, {"control", "max_waits=0", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			table := newTable(t)
			db, c := openDB(t, "wait_timeout=2s&max_fallback=0&"+tc.extra)
			db.SetMaxOpenConns(16)
			stop := waitForPeaks(t)
			w := insertThenRead(t, db, table, 16, 4)
			active := stop()
			st := c.Stats()
			w.fresh(t, c)
			if tc.bound == 0 {
				if st.WaitPeak <= 2 {
					t.Fatalf("without max_waits at most %d reads waited on one replica at once: the test cannot tell", st.WaitPeak)
				}
				return
			}
			if st.WaitPeak > tc.bound || active[0] > tc.bound || active[1] > tc.bound {
				t.Fatalf("max_waits=%d breached: pgryw counted %d waiting on one replica, the replicas showed %v",
					tc.bound, st.WaitPeak, active)
			}
			if st.WaitPeak != tc.bound || st.WaitsRefused == 0 || st.Fallbacks == 0 {
				t.Fatalf("the bound was never reached: stats %+v", st)
			}
		})
	}
}

// waitForPeaks samples each replica's pg_stat_activity for active WAIT FOR
// LSN statements (PostgreSQL 19 waits there; polling leaves nothing
// running) until stop is called, and returns the most seen at once on
// each, counted as activityPeak counts.
func waitForPeaks(t *testing.T) (stop func() []int64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	peaks := make([]int64, len(cluster.Replicas))
	var wg sync.WaitGroup
	for i := range peaks {
		conn, err := pgx.Connect(ctx, cluster.ReplicaDSN(i))
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close(context.Background())
			for ctx.Err() == nil {
				var n int64
				if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE pid <> pg_backend_pid() AND state = 'active'
					AND query LIKE 'WAIT FOR LSN%' AND query_start <= statement_timestamp()`).Scan(&n); err != nil {
					return
				}
				peaks[i] = max(peaks[i], n)
				time.Sleep(time.Millisecond)
			}
		}()
	}
	return func() []int64 {
		cancel()
		wg.Wait()
		t.Logf("WAIT FOR LSN active at once on the replicas: %v", peaks)
		return peaks
	}
}

// max_replica_lag: a replica whose replay is paused gets no reads that
// carry no watermark once it is known to be further behind than the bound,
// with read_your_writes on or off; the other, caught-up replica serves
// them. The control: without the bound, the paused replica serves some.
func TestIntegrationMaxReplicaLag(t *testing.T) {
	pgtest.Require(t, cluster)
	ctx := context.Background()
	table := newTable(t)
	if _, err := pgxExec(ctx, "INSERT INTO "+table+" VALUES (1, 1)"); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, extra string
		control     bool
	}{
		{"read_your_writes=on", "max_replica_lag=1s", false},
		{"read_your_writes=off", "max_replica_lag=1s&read_your_writes=off", false},
		{"control", "read_your_writes=off", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, c := openDB(t, tc.extra)
			// Let the pool start (its monitor and sampler) while both
			// replicas are healthy.
			if err := db.PingContext(ctx); err != nil {
				t.Fatal(err)
			}
			pauseReplicas(t, 0)
			// The primary moves past what replica 0 replayed (not
			// through the pool: its reads must carry no watermark). From
			// then on the primary is never again at or below that
			// replica's position: once the bound has passed since, the
			// replica cannot be known to be within it.
			if _, err := pgxExec(ctx, "UPDATE "+table+" SET v = v + 1"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second + 100*time.Millisecond)

			served := map[int]int{}
			for i := 0; i < 40; i++ {
				var v, port int
				if err := db.QueryRowContext(ctx, "SELECT v, "+nodePort+" FROM "+table+" WHERE id = 1").Scan(&v, &port); err != nil {
					t.Fatal(err)
				}
				served[port]++
			}
			paused, live := cluster.Replicas[0].Port, cluster.Replicas[1].Port
			st := c.Stats()
			t.Logf("served by port %v (paused replica %d, live %d, primary %d); stats %+v", served, paused, live, cluster.Writer.Port, st)
			if tc.control {
				if served[paused] == 0 {
					t.Fatal("without max_replica_lag the paused replica served no read: the test cannot tell")
				}
				return
			}
			if served[paused] != 0 {
				t.Fatalf("the paused replica, more than 1s behind, served %d reads", served[paused])
			}
			if st.LagSkips == 0 {
				t.Error("no replica passed over counted")
			}
			// The caught-up replica stays known to be within the bound.
			if served[live] < 32 {
				t.Fatalf("the live replica served only %d of 40 reads", served[live])
			}
		})
	}
}

// pgxExec runs sql on the primary through a plain pgx connection.
func pgxExec(ctx context.Context, sql string) (int64, error) {
	conn, err := pgx.Connect(ctx, cluster.WriterDSN())
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	tag, err := conn.Exec(ctx, sql)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", sql, err)
	}
	return tag.RowsAffected(), nil
}
