package pgrywprom_test

import (
	"context"
	"database/sql"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
	pgrywprom "github.com/pgryw/pgryw/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// TestScrape runs a workload on a real primary and a replica 100 ms
// behind (every read after a write waits for the replica), then stops the
// replica (reads fall back to the primary), scrapes the collector over
// HTTP and checks every counter against the connector's own NodeStats and
// Stats.
func TestScrape(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: no servers")
	}
	ctx := context.Background()
	cl, err := pgtest.Start(ctx, pgtest.Options{Replicas: 1, ApplyDelay: 100 * time.Millisecond})
	if err != nil {
		if pgtest.Required() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	defer cl.Close()
	db, err := sql.Open("pgryw", cl.WriterDSN()+"&wait_timeout=2s&replicas="+strings.Join(cl.ReplicaAddrs(), ","))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE scrape (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	read := func(i int) {
		t.Helper()
		var k int
		if err := db.QueryRow("SELECT count(*) FROM scrape WHERE id = $1", i).Scan(&k); err != nil || k != 1 {
			t.Fatalf("read %d: %d rows, %v", i, k, err)
		}
	}
	const n = 5
	for i := 0; i < n; i++ {
		if _, err := db.Exec("INSERT INTO scrape VALUES ($1)", i); err != nil {
			t.Fatal(err)
		}
		read(i)
	}
	if err := cl.StopNode(0); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		read(i)
	}

	// A connection pinned to the primary by an advisory lock it holds.
	held, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if _, err := held.ExecContext(context.Background(), "SELECT pg_advisory_lock(7)"); err != nil {
		t.Fatal(err)
	}

	c, err := pgryw.ConnectorOf(db)
	if err != nil {
		t.Fatal(err)
	}
	col := pgrywprom.NewCollector(c, pgrywprom.ConstLabels(prometheus.Labels{"pool": "test"}))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	if problems, err := testutil.CollectAndLint(col); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %+v", err, problems)
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	defer srv.Close()

	// Counters move only with statements, and none runs now.
	ns, st := c.NodeStats(), c.Stats()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	primary, replica := ns[0], ns[1]
	t.Logf("stats %+v\nprimary %+v\nreplica %+v", st, primary, replica)
	if st.Fallbacks != n || replica.Waits < n/2 || replica.WaitTimeouts != 0 || replica.Reads != n {
		t.Fatalf("%d reads of a replica 100ms behind, %d with it stopped: %+v", n, n, st)
	}

	// find returns the one sample of name whose labels include want.
	find := func(name string, want ...string) *dto.Metric {
		t.Helper()
		f := families[name]
		if f == nil {
			t.Fatalf("no metric %s in the scrape", name)
		}
		var found *dto.Metric
	metrics:
		for _, m := range f.Metric {
			have := map[string]string{}
			for _, l := range m.Label {
				have[l.GetName()] = l.GetValue()
			}
			if have["pool"] != "test" {
				t.Errorf("%s: labels %v lack pool=test", name, have)
			}
			for i := 0; i+1 < len(want); i += 2 {
				if have[want[i]] != want[i+1] {
					continue metrics
				}
			}
			if found != nil {
				t.Fatalf("%s%v: more than one sample", name, want)
			}
			found = m
		}
		if found == nil {
			t.Fatalf("%s%v: no sample", name, want)
		}
		return found
	}
	value := func(name string, want ...string) float64 {
		t.Helper()
		m := find(name, want...)
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		}
		t.Fatalf("%s%v: neither counter nor gauge", name, want)
		return 0
	}
	expect := func(name string, got float64, want int64) {
		t.Helper()
		if got != float64(want) {
			t.Errorf("%s = %v, want %d", name, got, want)
		}
	}
	for _, s := range ns {
		node := []string{"node", s.Addr, "role", s.Role.String()}
		expect("statements "+s.Addr, value("pgryw_node_statements_total", node...), s.Statements)
		expect("reads "+s.Addr, value("pgryw_node_reads_total", node...), s.Reads)
		expect("writes "+s.Addr, value("pgryw_node_writes_total", node...), s.Writes)
		expect("transactions "+s.Addr, value("pgryw_node_transactions_total", node...), s.Transactions)
		// The monitor keeps looking at the stopped replica: its state
		// may change between NodeStats and the scrape.
		var states float64
		for _, h := range []string{"unknown", "up", "down", "refused", "not_a_standby"} {
			states += value("pgryw_node_state", append(node, "state", h)...)
		}
		if states != 1 {
			t.Errorf("%s: %v states set", s.Addr, states)
		}
		if value("pgryw_node_wal_position_bytes", node...) == 0 {
			t.Errorf("%s: no WAL position", s.Addr)
		}
	}
	p := []string{"node", primary.Addr, "role", "primary"}
	expect("primary writes", value("pgryw_node_writes_total", p...), n+1) // and CREATE TABLE
	expect("primary up", value("pgryw_node_up", p...), 1)
	var fallbacks float64
	for r := pgryw.FallbackBehind; r <= pgryw.FallbackPositionLost; r++ {
		reason := strings.ReplaceAll(strings.TrimPrefix(r.String(), "replica "), " ", "_")
		v := value("pgryw_node_fallbacks_total", append(p, "reason", reason)...)
		expect("fallbacks "+reason, v, primary.Fallbacks[r])
		fallbacks += v
	}
	expect("fallbacks", fallbacks, st.Fallbacks)
	expect("primary reads", value("pgryw_node_reads_total", p...), st.Fallbacks+1) // and the lock
	expect("pinned by a lock", value("pgryw_pinned_connections", "reason", "advisory_lock"), 1)

	r := []string{"node", replica.Addr, "role", "replica"}
	expect("misses unreachable", value("pgryw_node_misses_total", append(r, "reason", "unreachable")...), replica.Misses[pgryw.FallbackUnreachable])
	expect("misses promoted", value("pgryw_node_misses_total", append(r, "reason", "promoted")...), 0)
	expect("replica reads", value("pgryw_node_reads_total", r...), n)
	expect("wait timeouts", value("pgryw_node_wait_timeouts_total", r...), replica.WaitTimeouts)
	expect("stale reads", value("pgryw_node_stale_reads_total", r...), 0)
	h := find("pgryw_node_wait_seconds", r...).Histogram
	if h == nil {
		t.Fatal("pgryw_node_wait_seconds is not a histogram")
	}
	expect("wait count", float64(h.GetSampleCount()), replica.Waits)
	if d := h.GetSampleSum() - replica.WaitTime.Sum.Seconds(); d > 1e-9 || d < -1e-9 {
		t.Errorf("wait sum %v, want %v", h.GetSampleSum(), replica.WaitTime.Sum.Seconds())
	}
	// The text format adds the +Inf bucket.
	if len(h.Bucket) != len(replica.WaitTime.Bounds)+1 {
		t.Fatalf("%d buckets, want %d", len(h.Bucket), len(replica.WaitTime.Bounds)+1)
	}
	var cum int64
	for i, b := range h.Bucket {
		cum += replica.WaitTime.Counts[i]
		le := math.Inf(1)
		if i < len(replica.WaitTime.Bounds) {
			le = replica.WaitTime.Bounds[i].Seconds()
		}
		if b.GetUpperBound() != le || b.GetCumulativeCount() != uint64(cum) {
			t.Errorf("bucket %d: le=%v count=%d, want le=%v count=%d", i, b.GetUpperBound(), b.GetCumulativeCount(), le, cum)
		}
	}
	// A wait for a replica 100 ms behind is not over in 10 ms.
	for _, b := range h.Bucket {
		if b.GetUpperBound() <= 0.010 && b.GetCumulativeCount() != 0 {
			t.Errorf("bucket le=%v holds %d waits for a replica 100ms behind", b.GetUpperBound(), b.GetCumulativeCount())
		}
	}
	if _, ok := families["pgryw_node_replay_lag_seconds"]; ok != !replica.LagAt.IsZero() {
		t.Errorf("replay lag exported: %v, measured at %v", ok, replica.LagAt)
	}
	expect("captures", value("pgryw_captures_total"), st.Captures)
	expect("behind errors", value("pgryw_behind_errors_total"), 0)
}
