// Package pgrywprom exports a pgryw pool's statistics to Prometheus: per
// node (the primary and each replica) what it served, how long reads
// waited for it, why reads fell back to the primary, its state, WAL
// position and replay lag; and the connector's own counters.
//
//	c, err := pgryw.ConnectorOf(db) // or the *pgryw.Connector you built
//	prometheus.MustRegister(pgrywprom.NewCollector(c, pgrywprom.ConstLabels(prometheus.Labels{"pool": "orders"})))
//
// It lives in its own module so that pgryw itself depends on pgx alone.
// A scrape reads counters pgryw keeps anyway: it takes no connection and
// sends nothing to a server.
package pgrywprom

import (
	"strings"

	"github.com/pgryw/pgryw"
	"github.com/prometheus/client_golang/prometheus"
)

// Collector is a prometheus.Collector for one pgryw connector.
type Collector struct {
	c *pgryw.Connector

	statements, reads, writes, transactions, staleReads *prometheus.Desc
	waitSeconds, waitTimeouts, fallbacks, misses        *prometheus.Desc
	up, state, position, lag, lagTimestamp              *prometheus.Desc

	captures, captureFailures, behindErrors, tokensClamped, tokensRebased *prometheus.Desc
	snapshotMoves, pinned                                                 *prometheus.Desc
}

// Option configures NewCollector.
type Option func(*options)

type options struct {
	constLabels prometheus.Labels
}

// ConstLabels adds labels with fixed values to every metric, such as the
// name of the pool when a process has several.
func ConstLabels(l prometheus.Labels) Option {
	return func(o *options) { o.constLabels = l }
}

// NewCollector returns a collector for c's statistics.
func NewCollector(c *pgryw.Connector, opts ...Option) *Collector {
	var o options
	for _, f := range opts {
		f(&o)
	}
	node := []string{"node", "role"}
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("pgryw_"+name, help, labels, o.constLabels)
	}
	return &Collector{
		c:            c,
		statements:   desc("node_statements_total", "Statements the node ran for the application (not BEGIN, COMMIT or ROLLBACK of database/sql transactions).", node...),
		reads:        desc("node_reads_total", "Statements the node ran that wrote nothing (counted when the connector has replicas).", node...),
		writes:       desc("node_writes_total", "Statements the node ran that may have written (counted when the connector has replicas).", node...),
		transactions: desc("node_transactions_total", "database/sql transactions begun on the node.", node...),
		staleReads:   desc("node_stale_reads_total", "Reads a replica served without having replayed the session's watermark (on_timeout=stale).", node...),
		waitSeconds:  desc("node_wait_seconds", "Time reads waited for the replica to replay the session's watermark.", node...),
		waitTimeouts: desc("node_wait_timeouts_total", "Waits for the replica whose budget (wait_timeout) ran out.", node...),
		fallbacks:    desc("node_fallbacks_total", "Reads the primary served in place of a replica, by reason.", "node", "role", "reason"),
		misses:       desc("node_misses_total", "Reads a replica did not serve as asked, by reason.", "node", "role", "reason"),
		up:           desc("node_up", "1 when the node is answering, else 0.", node...),
		state:        desc("node_state", "The node's state as pgryw sees it: 1 for the current state, 0 for the others.", "node", "role", "state"),
		position:     desc("node_wal_position_bytes", "The node's last known WAL position: the primary's insert position, a replica's replay position.", node...),
		lag:          desc("node_replay_lag_seconds", "A replica's replay lag as last measured (a lower bound).", node...),
		lagTimestamp: desc("node_replay_lag_timestamp_seconds", "When a replica's replay lag was last measured, as a Unix time.", node...),

		captures:        desc("captures_total", "Primary WAL positions read after a commit."),
		captureFailures: desc("capture_failures_total", "Commits whose position could not be read."),
		behindErrors:    desc("behind_errors_total", "Reads that returned ErrReplicaBehind (on_timeout=error)."),
		tokensClamped:   desc("tokens_clamped_total", "Session positions beyond anything the primary had written, lowered to its position."),
		tokensRebased:   desc("tokens_rebased_total", "Session positions from another primary generation, moved to the current one."),
		snapshotMoves:   desc("snapshot_moves_total", "Read-only REPEATABLE READ transactions moved from a replica to the primary after their snapshot was taken."),
		pinned:          desc("pinned_connections", "Connections whose reads stay on the primary because of session state they hold, by reason (a connection may count under several).", "reason"),
	}
}

// Describe implements prometheus.Collector.
func (col *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		col.statements, col.reads, col.writes, col.transactions, col.staleReads,
		col.waitSeconds, col.waitTimeouts, col.fallbacks, col.misses,
		col.up, col.state, col.position, col.lag, col.lagTimestamp,
		col.captures, col.captureFailures, col.behindErrors, col.tokensClamped, col.tokensRebased,
		col.snapshotMoves, col.pinned,
	} {
		ch <- d
	}
}

// states are the values of the state label, in pgryw.Health's order.
var states = []pgryw.Health{pgryw.HealthUnknown, pgryw.HealthUp, pgryw.HealthDown, pgryw.HealthRefused, pgryw.HealthNotStandby}

// label turns pgryw's names ("replica behind", "not a standby") into label
// values ("behind", "not_a_standby").
func label(s string) string {
	return strings.ReplaceAll(strings.TrimPrefix(s, "replica "), " ", "_")
}

// Collect implements prometheus.Collector.
func (col *Collector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, s := range col.c.NodeStats() {
		node, role := s.Addr, s.Role.String()
		counter(col.statements, s.Statements, node, role)
		counter(col.reads, s.Reads, node, role)
		counter(col.writes, s.Writes, node, role)
		counter(col.transactions, s.Transactions, node, role)
		up := 0.0
		if s.Health == pgryw.HealthUp {
			up = 1
		}
		gauge(col.up, up, node, role)
		for _, h := range states {
			v := 0.0
			if s.Health == h {
				v = 1
			}
			gauge(col.state, v, node, role, label(h.String()))
		}
		gauge(col.position, float64(s.Position), node, role)
		if s.Role == pgryw.RolePrimary {
			for r := pgryw.FallbackNone + 1; int(r) < len(s.Fallbacks); r++ {
				counter(col.fallbacks, s.Fallbacks[r], node, role, label(r.String()))
			}
			continue
		}
		counter(col.staleReads, s.StaleReads, node, role)
		counter(col.waitTimeouts, s.WaitTimeouts, node, role)
		buckets := make(map[float64]uint64, len(s.WaitTime.Bounds))
		var cum uint64
		for i, b := range s.WaitTime.Bounds {
			cum += uint64(s.WaitTime.Counts[i])
			buckets[b.Seconds()] = cum
		}
		ch <- prometheus.MustNewConstHistogram(col.waitSeconds, uint64(s.WaitTime.Count), s.WaitTime.Sum.Seconds(), buckets, node, role)
		for r := pgryw.FallbackNone + 1; int(r) < len(s.Misses); r++ {
			counter(col.misses, s.Misses[r], node, role, label(r.String()))
		}
		if !s.LagAt.IsZero() {
			gauge(col.lag, s.Lag.Seconds(), node, role)
			gauge(col.lagTimestamp, float64(s.LagAt.UnixNano())/1e9, node, role)
		}
	}
	st := col.c.Stats()
	counter(col.captures, st.Captures)
	counter(col.captureFailures, st.CaptureFailures)
	counter(col.behindErrors, st.BehindErrors)
	counter(col.tokensClamped, st.TokensClamped)
	counter(col.tokensRebased, st.TokensRebased)
	counter(col.snapshotMoves, st.SnapshotMoves)
	for reason, n := range st.PinnedBy {
		gauge(col.pinned, float64(n), label(reason))
	}
}

var _ prometheus.Collector = (*Collector)(nil)
