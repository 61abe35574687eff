package main

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"strings"
	"time"
)

// ratio compares pgryw with a baseline measured in the same run.
type ratio struct {
	key, label string
	value      float64
	ok         bool // both strategies ran and the baseline is not zero
}

func ratios(sums []summary) []ratio {
	by := map[string]summary{}
	for _, s := range sums {
		by[s.Name] = s
	}
	div := func(key, label, num, den string, pick func(summary) float64) ratio {
		r := ratio{key: key, label: label}
		a, okA := by[num]
		b, okB := by[den]
		if okA && okB && pick(b) > 0 && a.Reads > 0 {
			r.value, r.ok = pick(a)/pick(b), true
		}
		return r
	}
	read := func(s summary) float64 { return s.ReadP50 }
	write := func(s summary) float64 { return s.WriteP50 }
	return []ratio{
		div("pgryw_read_p50_over_naive_read_p50", "pgryw read p50 / naive-replica read p50", pgrywName, naiveReplica, read),
		div("pgryw_write_p50_over_naive_write_p50", "pgryw write p50 / naive-replica write p50", pgrywName, naiveReplica, write),
		div("pgryw_read_p50_over_sticky_read_p50", "pgryw read p50 / sticky-primary read p50", pgrywName, stickyPrimary, read),
	}
}

func printText(w io.Writer, cfg *config, e *env, sums []summary, elapsed, setup time.Duration) {
	where, delay := "local cluster", cfg.delay.String()
	if e.cluster == nil {
		where, delay = "given servers", "as configured there"
	}
	fmt.Fprintf(w, "rywbench: %s\n", machine(e))
	fmt.Fprintf(w, "%d replica(s) (%s), apply delay %s, budget %v, sleep %v; %d workers x %d iterations per strategy in %d rounds\n\n",
		cfg.replicas, where, delay, cfg.budget, cfg.sleep, cfg.workers, cfg.iterations, cfg.rounds)

	const row = "%-15s %6s %6s %6s %8s %9s %9s %9s %10s\n"
	fmt.Fprintf(w, row, "strategy", "reads", "stale", "errors", "replica", "read p50", "read p95", "read p99", "write p50")
	for _, s := range sums {
		fmt.Fprintf(w, row, s.Name, fmt.Sprint(s.Reads), fmt.Sprint(s.Stale), fmt.Sprint(s.Errors),
			fmt.Sprintf("%.1f%%", 100*s.ReplicaShare),
			fmtMS(s.ReadP50), fmtMS(s.ReadP95), fmtMS(s.ReadP99), fmtMS(s.WriteP50))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "replica = share of reads served by a replica (by inet_server_port()); read = the read call")
	fmt.Fprintln(w, "(two-round-trip: with its LSN fetch and wait; sleep-replica: with the sleep); write = the insert")
	fmt.Fprintln(w, "(pgryw: with its capture of the primary's position).")

	for _, s := range sums {
		if s.FirstError != "" {
			fmt.Fprintf(w, "\n%s: %d errors; first: %s\n", s.Name, s.Errors, s.FirstError)
		}
		if s.PgrywStats != nil {
			st := s.PgrywStats
			fmt.Fprintf(w, "\npgryw Stats over the measured iterations: ReplicaReads=%d PrimaryReads=%d Fallbacks=%d StaleReads=%d BehindErrors=%d\n"+
				"  Waits=%d WaitTimeouts=%d Captures=%d CaptureFailures=%d\n",
				st.ReplicaReads, st.PrimaryReads, st.Fallbacks, st.StaleReads, st.BehindErrors,
				st.Waits, st.WaitTimeouts, st.Captures, st.CaptureFailures)
		}
	}

	var lines []string
	for _, r := range ratios(sums) {
		if r.ok {
			lines = append(lines, fmt.Sprintf("  %-42s %.2fx", r.label+":", r.value))
		}
	}
	if len(lines) > 0 {
		fmt.Fprintf(w, "\nRatios (same run):\n%s\n", strings.Join(lines, "\n"))
		for _, s := range sums {
			if s.Name == naiveReplica && s.Stale > 0 && ratios(sums)[0].ok {
				fmt.Fprintf(w, "  (naive-replica never waits, and %.0f%% of its reads were stale: its read p50 is the floor, not a like-for-like baseline)\n",
					100*float64(s.Stale)/float64(s.Reads))
			}
		}
	}

	if cfg.demo {
		if text := demoText(cfg, sums); text != "" {
			fmt.Fprintf(w, "\n%s\n", wrap(text, 78))
		}
	}
	fmt.Fprintf(w, "\nTook %v (of which starting and preparing the servers %v).\n", elapsed.Round(100*time.Millisecond), setup.Round(100*time.Millisecond))
}

// demoText explains the demo's two rows in one paragraph.
func demoText(cfg *config, sums []summary) string {
	var naive, ryw *summary
	for i := range sums {
		switch sums[i].Name {
		case naiveReplica:
			naive = &sums[i]
		case pgrywName:
			ryw = &sums[i]
		}
	}
	if naive == nil || ryw == nil || naive.Reads == 0 || ryw.Reads == 0 {
		return ""
	}
	text := fmt.Sprintf("What this shows: each worker inserts a row on the primary and at once reads it back. "+
		"The replica applies WAL %v late (recovery_min_apply_delay), standing in for replication lag. "+
		"naive-replica reads the replica right away, and %d of its %d reads (%.0f%%) did not find the row the same worker had just written. "+
		"pgryw notes the primary's WAL position after each write and, before a replica read, waits (at most %v) until the replica has replayed past it: "+
		"%d of its %d reads were stale, and %.0f%% were still served by the replica. "+
		"The price is latency, not correctness: pgryw's read p50 of %s is mostly that wait, which the apply delay sets, against %s for the naive read that did not wait, "+
		"and its write p50 of %s against %s for a plain insert includes the position capture.",
		cfg.delay, naive.Stale, naive.Reads, 100*float64(naive.Stale)/float64(naive.Reads),
		cfg.budget, ryw.Stale, ryw.Reads, 100*ryw.ReplicaShare,
		fmtMS(ryw.ReadP50), fmtMS(naive.ReadP50), fmtMS(ryw.WriteP50), fmtMS(naive.WriteP50))
	if ryw.Stale > 0 || ryw.Errors > 0 {
		text += fmt.Sprintf(" NOTE: pgryw should show 0 stale reads and 0 errors here; it showed %d and %d.", ryw.Stale, ryw.Errors)
	}
	return text + " Run without -demo to compare all five strategies."
}

// wrap breaks text into lines of at most width columns at spaces.
func wrap(text string, width int) string {
	var b strings.Builder
	col := 0
	for _, word := range strings.Fields(text) {
		if col > 0 && col+1+len(word) > width {
			b.WriteByte('\n')
			col = 0
		} else if col > 0 {
			b.WriteByte(' ')
			col++
		}
		b.WriteString(word)
		col += len(word)
	}
	return b.String()
}

type jsonReport struct {
	Settings struct {
		Workers    int      `json:"workers"`
		Iterations int      `json:"iterations"`
		Rounds     int      `json:"rounds"`
		Replicas   int      `json:"replicas"`
		Delay      string   `json:"delay"` // "" with given servers
		Budget     string   `json:"budget"`
		Sleep      string   `json:"sleep"`
		Strategies []string `json:"strategies"`
		Cluster    string   `json:"cluster"` // "local" or "given"
		Demo       bool     `json:"demo"`
	} `json:"settings"`
	Machine struct {
		GOOS             string `json:"goos"`
		GOARCH           string `json:"goarch"`
		NumCPU           int    `json:"num_cpu"`
		GoVersion        string `json:"go_version"`
		ServerVersion    string `json:"server_version"`
		ServerVersionNum int    `json:"server_version_num"`
	} `json:"machine"`
	Results        []summary          `json:"results"`
	Ratios         map[string]float64 `json:"ratios"`
	ElapsedSeconds float64            `json:"elapsed_seconds"`
}

func printJSON(w io.Writer, cfg *config, e *env, sums []summary, elapsed time.Duration) error {
	var r jsonReport
	s := &r.Settings
	s.Workers, s.Iterations, s.Rounds, s.Replicas = cfg.workers, cfg.iterations, cfg.rounds, cfg.replicas
	s.Delay, s.Budget, s.Sleep = cfg.delay.String(), cfg.budget.String(), cfg.sleep.String()
	s.Strategies, s.Demo = cfg.strategies, cfg.demo
	s.Cluster = "local"
	if e.cluster == nil {
		s.Cluster, s.Delay = "given", "" // the servers' own setting, unknown here
	}
	m := &r.Machine
	m.GOOS, m.GOARCH, m.NumCPU, m.GoVersion = runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version()
	m.ServerVersion, m.ServerVersionNum = e.serverVersion, e.serverVersionNum
	r.Results = sums
	r.Ratios = map[string]float64{}
	for _, x := range ratios(sums) {
		if x.ok {
			r.Ratios[x.key] = x.value
		}
	}
	r.ElapsedSeconds = elapsed.Seconds()
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
