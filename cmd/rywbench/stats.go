package main

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/pgryw/pgryw"
)

// sample is one measured iteration: an insert and the read that follows it
// (or only one of them, by the strategy's shape).
type sample struct {
	write, read time.Duration
	early       time.Duration // wire-capture: the insert's own answer
	hasWrite    bool
	hasRead     bool
	tries       int   // reads the read took (spin-floor, polling models)
	stale       bool  // row missing or carrying the wrong value
	onReplica   bool  // inet_server_port() differed from the primary's
	err         error // the iteration failed; no latency is counted
}

// result accumulates one strategy's samples over all rounds.
type result struct {
	name      string
	shape     shape
	ops       int // iterations, failed ones included (the cost's divisor)
	reads     int
	writes    int
	stale     int
	onReplica int
	errors    int
	tries     int
	firstErr  error
	readLat   []time.Duration
	writeLat  []time.Duration
	earlyLat  []time.Duration
	cost      costDelta    // server cost over the measured slices
	pgrywDiff *pgryw.Stats // pgryw pools only: Stats over the measured iterations
	scope     string       // pgryw pools only: the writer address named (scopes.go)
}

func (r *result) add(s sample) {
	r.ops++
	if s.err != nil {
		r.errors++
		if r.firstErr == nil {
			r.firstErr = s.err
		}
		return
	}
	if s.hasWrite {
		r.writes++
		r.writeLat = append(r.writeLat, s.write)
		if s.early > 0 {
			r.earlyLat = append(r.earlyLat, s.early)
		}
	}
	if !s.hasRead {
		return
	}
	r.reads++
	r.tries += s.tries
	if s.stale {
		r.stale++
	}
	if s.onReplica {
		r.onReplica++
	}
	r.readLat = append(r.readLat, s.read)
}

// summary is what the table and the JSON report show for one strategy.
// Latencies are in milliseconds; 0 means the strategy does not make that
// call.
type summary struct {
	Name         string       `json:"strategy"`
	Scope        string       `json:"cluster_scope,omitempty"` // pgryw: the writer address its pool named (scopes.go)
	Shape        string       `json:"shape"`                   // insert+read, insert, read
	Reads        int          `json:"reads"`
	Writes       int          `json:"writes"`
	Stale        int          `json:"stale"`
	Errors       int          `json:"errors"`
	FirstError   string       `json:"first_error,omitempty"`
	ReplicaShare float64      `json:"replica_share"`
	ReadP50      float64      `json:"read_p50_ms"`
	ReadP95      float64      `json:"read_p95_ms"`
	ReadP99      float64      `json:"read_p99_ms"`
	WriteP50     float64      `json:"write_p50_ms"`
	WriteP95     float64      `json:"write_p95_ms"`
	EarlyP50     float64      `json:"write_own_answer_p50_ms,omitempty"`
	EarlyP95     float64      `json:"write_own_answer_p95_ms,omitempty"`
	TriesPerRead float64      `json:"tries_per_read,omitempty"`
	Cost         *costSummary `json:"server_cost,omitempty"`
	PgrywStats   *pgryw.Stats `json:"pgryw_stats,omitempty"`
}

func (sh shape) String() string {
	switch sh {
	case insertOnly:
		return "insert"
	case readOnly:
		return "read"
	}
	return "insert+read"
}

func (r *result) summarize() summary {
	s := summary{Name: r.name, Scope: r.scope, Shape: r.shape.String(), Reads: r.reads, Writes: r.writes, Stale: r.stale, Errors: r.errors, PgrywStats: r.pgrywDiff}
	if r.firstErr != nil {
		s.FirstError = r.firstErr.Error()
	}
	if r.reads > 0 {
		s.ReplicaShare = float64(r.onReplica) / float64(r.reads)
		if r.tries > r.reads {
			s.TriesPerRead = float64(r.tries) / float64(r.reads)
		}
	}
	slices.Sort(r.readLat)
	slices.Sort(r.writeLat)
	slices.Sort(r.earlyLat)
	s.ReadP50 = ms(percentile(r.readLat, 0.50))
	s.ReadP95 = ms(percentile(r.readLat, 0.95))
	s.ReadP99 = ms(percentile(r.readLat, 0.99))
	s.WriteP50 = ms(percentile(r.writeLat, 0.50))
	s.WriteP95 = ms(percentile(r.writeLat, 0.95))
	s.EarlyP50 = ms(percentile(r.earlyLat, 0.50))
	s.EarlyP95 = ms(percentile(r.earlyLat, 0.95))
	s.Cost = r.cost.summarize(r.ops)
	return s
}

// percentile returns the nearest-rank p-quantile of sorted durations (0 for
// none).
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// fmtMS formats milliseconds for the table ("-" for a call not made).
func fmtMS(v float64) string {
	if v == 0 {
		return "-"
	}
	if v >= 100 {
		return fmt.Sprintf("%.0fms", v)
	}
	return fmt.Sprintf("%.2fms", v)
}

// statsDiff returns a - b, field by field.
func statsDiff(a, b pgryw.Stats) pgryw.Stats { return statsPlus(a, b, -1) }

// addStats adds d to *s, field by field.
func addStats(s *pgryw.Stats, d pgryw.Stats) { *s = statsPlus(*s, d, 1) }

// statsPlus returns a + k·b for the counters rywbench reports.
func statsPlus(a, b pgryw.Stats, k int64) pgryw.Stats {
	return pgryw.Stats{
		ReplicaReads:    a.ReplicaReads + k*b.ReplicaReads,
		PrimaryReads:    a.PrimaryReads + k*b.PrimaryReads,
		Fallbacks:       a.Fallbacks + k*b.Fallbacks,
		StaleReads:      a.StaleReads + k*b.StaleReads,
		BehindErrors:    a.BehindErrors + k*b.BehindErrors,
		Waits:           a.Waits + k*b.Waits,
		WaitTimeouts:    a.WaitTimeouts + k*b.WaitTimeouts,
		Captures:        a.Captures + k*b.Captures,
		CaptureFailures: a.CaptureFailures + k*b.CaptureFailures,
	}
}
