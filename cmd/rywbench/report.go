package main

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// ratio compares pgryw with a baseline measured in the same run.
type ratio struct {
	key, label string
	value      float64
	ok         bool // both strategies ran and the baseline is not zero
}

func byName(sums []summary) map[string]summary {
	by := map[string]summary{}
	for _, s := range sums {
		by[s.Name] = s
	}
	return by
}

func ratios(sums []summary) []ratio {
	by := byName(sums)
	div := func(key, label, num, den string, pick func(summary) float64) ratio {
		r := ratio{key: key, label: label}
		a, okA := by[num]
		b, okB := by[den]
		if okA && okB && pick(b) > 0 && pick(a) > 0 {
			r.value, r.ok = pick(a)/pick(b), true
		}
		return r
	}
	read := func(s summary) float64 { return s.ReadP50 }
	write := func(s summary) float64 { return s.WriteP50 }
	return []ratio{
		div("pgryw_read_p50_over_spin_floor_read_p50", "pgryw read p50 / spin-floor read p50", pgrywName, spinFloor, read),
		div("pgryw_read_p95_over_spin_floor_read_p95", "pgryw read p95 / spin-floor read p95", pgrywName, spinFloor, func(s summary) float64 { return s.ReadP95 }),
		div("pgryw_session_read_p50_over_spin_floor_read_p50", "pgryw-session read p50 / spin-floor read p50", pgrywSession, spinFloor, read),
		div("pgryw_session_read_p95_over_spin_floor_read_p95", "pgryw-session read p95 / spin-floor read p95", pgrywSession, spinFloor, func(s summary) float64 { return s.ReadP95 }),
		div("pgryw_read_p50_over_naive_read_p50", "pgryw read p50 / naive-replica read p50", pgrywName, naiveReplica, read),
		div("pgryw_write_p50_over_naive_write_p50", "pgryw write p50 / naive-replica write p50", pgrywName, naiveReplica, write),
		div("pgryw_read_p50_over_sticky_read_p50", "pgryw read p50 / sticky-primary read p50", pgrywName, stickyPrimary, read),
	}
}

// target is one of the benchmark targets (BENCHMARKS.md), judged on this run.
type target struct {
	Name   string        `json:"target"`
	Status string        `json:"status"` // PASS, FAIL, n/a when a strategy it needs did not run, info for a floor (no limit)
	Ratios []targetRatio `json:"ratios,omitempty"`
	Note   string        `json:"note,omitempty"`
}

type targetRatio struct {
	Label string  `json:"label"`
	Value float64 `json:"value"` // with -repeat: the median of the runs'
	Limit float64 `json:"limit"` // 0 on an info line
	// With -repeat: the runs' least and greatest, and how many there were.
	Min  float64 `json:"min,omitempty"`
	Max  float64 `json:"max,omitempty"`
	Runs int     `json:"runs,omitempty"`
}

// readLimit is the read-after-write target's bound, p50 and p95: WAIT FOR
// (PostgreSQL 19) lets the server wake the read; polling gets more room.
func readLimit(serverVersionNum int) float64 {
	if serverVersionNum >= 190000 {
		return 1.10
	}
	return 1.20
}

// targets judges the benchmark targets (BENCHMARKS.md) on a run's
// summaries: latency at p50 and p95, and the servers' CPU per operation
// where it was measured. lagged says the replicas were run behind
// (-delay): a read after a write is then held to a read that slept the
// lag, not to a naive read.
func targets(sums []summary, serverVersionNum int, lagged bool) []target {
	by := byName(sums)
	p50r := func(s summary) float64 { return s.ReadP50 }
	p95r := func(s summary) float64 { return s.ReadP95 }
	p50w := func(s summary) float64 { return s.WriteP50 }
	p95w := func(s summary) float64 { return s.WriteP95 }
	cpu := func(f func(c *costSummary) *float64) func(summary) float64 {
		return func(s summary) float64 {
			if s.Cost == nil || f(s.Cost) == nil {
				return 0
			}
			return *f(s.Cost)
		}
	}
	replCPU := cpu(func(c *costSummary) *float64 { return c.ReplicaBackendCPU })
	primCPU := cpu(func(c *costSummary) *float64 { return c.PrimaryBackendCPU })
	type part struct {
		label string
		pick  func(summary) float64
		limit float64
	}
	judge := func(name, num, den string, parts ...part) target {
		t := target{Name: fmt.Sprintf("%s (%s / %s)", name, num, den), Status: "PASS"}
		a, okA := by[num]
		b, okB := by[den]
		if !okA || !okB {
			t.Status, t.Note = "n/a", "needs -strategies to include "+num+" and "+den
			return t
		}
		for _, p := range parts {
			if p.pick(b) <= 0 || p.pick(a) <= 0 {
				t.Status, t.Note = "n/a", "no samples (server CPU is measured on a local cluster)"
				return t
			}
			r := targetRatio{Label: p.label, Value: p.pick(a) / p.pick(b), Limit: p.limit}
			t.Ratios = append(t.Ratios, r)
			if r.Value > r.Limit {
				t.Status = "FAIL"
			}
		}
		if a.Stale > 0 || a.Errors > 0 {
			t.Status = "FAIL"
			t.Note = fmt.Sprintf("%s had %d stale reads and %d errors", num, a.Stale, a.Errors)
		}
		return t
	}
	lim := readLimit(serverVersionNum)
	// One list per front end: database/sql's against pgx stdlib, and pgx's
	// (the Pool, -strategies pgx) against pgxpool, under the same names.
	front := func(label, base string, name func(string) string) []target {
		// The loop's baseline: pgx's insert and read at the pace pgryw's
		// loop runs. Behind, that is sleep-replica's (a write every lag):
		// a primary backend idle for 50 ms between writes costs twice the
		// CPU per insert of one kept busy.
		loop := name(naiveReplica)
		repl := judge(label+"replica CPU per read after write ≤ 1.5x a naive read", name(pgrywName), loop,
			part{"CPU", replCPU, 1.5})
		if lagged {
			loop = name(sleepReplica)
			repl = judge(label+"replica CPU per read after write ≤ 2x a read that slept the lag", name(pgrywName), loop,
				part{"CPU", replCPU, 2})
		}
		alone := func(t target, kind string) target {
			if others := scopeSharers(by, kind); len(others) > 0 && t.Status != "n/a" {
				note := "shares a cluster scope with " + strings.Join(others, ", ") +
					": one watermark, and capture=auto's pause after a miss; run " + kind + " without them for this line"
				if t.Note != "" {
					note = t.Note + "; " + note
				}
				t.Note = note
			}
			return t
		}
		return []target{
			judge(fmt.Sprintf("%sread after write ≤ %.2fx the spin floor", label, lim), name(pgrywName), name(spinFloor),
				part{"p50", p50r, lim}, part{"p95", p95r, lim}),
			judge(label+"write in the write-then-read loop ≤ 1.10x a plain insert there", name(pgrywName), loop,
				part{"p50", p50w, 1.10}, part{"p95", p95w, 1.10}),
			alone(judge(label+"write in a write-only loop ≤ 1.05x a plain insert", name(pgrywWrite), name(plainWrite),
				part{"p50", p50w, 1.05}, part{"p95", p95w, 1.05}), name(pgrywWrite)),
			alone(judge(label+"primary CPU per write ≤ 1.10x a plain insert", name(pgrywWrite), name(plainWrite),
				part{"CPU", primCPU, 1.10}), name(pgrywWrite)),
			judge(label+"primary CPU per write and read ≤ 1.10x a plain insert and read", name(pgrywName), loop,
				part{"CPU", primCPU, 1.10}),
			repl,
			alone(judge(label+"read with no pending watermark ≤ 1.05x a plain replica read", name(pgrywRead), name(replicaRead),
				part{"p50", p50r, 1.05}, part{"p95", p95r, 1.05}), name(pgrywRead)),
			judge(label+"no-replica mode ≤ 1.03x "+base, name(pgrywNoReplica), name(stickyPrimary),
				part{"write p50", p50w, 1.03}, part{"write p95", p95w, 1.03}, part{"read p50", p50r, 1.03}, part{"read p95", p95r, 1.03}),
		}
	}
	ts := append(front("", "pgx stdlib", func(k string) string { return k }), front("pgx: ", "pgxpool", pgxKind)...)
	ts = append(ts, target{Name: "cached routing 0 allocations", Status: "n/a", Note: "not measured by rywbench: make allocs"})

	// Floors: what pgryw's message patterns cost with no Go code in between
	// (the wire models), against the same baselines; printed when the
	// models ran, never judged.
	info := func(name, num, den string, parts ...part) {
		if _, ok := by[num]; !ok {
			return
		}
		t := judge(name, num, den, parts...)
		if t.Status == "n/a" {
			return // not measured: not worth a line
		}
		t.Status = "info"
		for i := range t.Ratios {
			t.Ratios[i].Limit = 0
		}
		ts = append(ts, t)
	}
	floor := func(name, num, den string, parts ...part) { info("floor: "+name, num, den, parts...) }
	// The loop's rhythm: naive-replica's read does not wait, so its next
	// insert follows at once, on servers still busy with the last one;
	// spin-floor's insert is as plain, in a loop whose read waits for the
	// row, as pgryw's does. What the two inserts differ by is the rhythm's,
	// not any driver's.
	loopParts := []part{{"write p50", p50w, 0}, {"write p95", p95w, 0}, {"primary CPU", primCPU, 0}, {"replica CPU", replCPU, 0}}
	info("rhythm: a plain insert in a loop whose read waits, against one whose read does not", spinFloor, naiveReplica, loopParts...)
	info("beside the spin floor: the write in the loop, and the servers' CPU", pgrywName, spinFloor, loopParts...)
	floor("primary CPU per insert with the fast-path capture behind it", wireFastCap, wireInsert, part{"CPU", primCPU, 0})
	floor("primary CPU per insert with the capture after its COMMIT, one Sync", wireOneSync, wireInsert, part{"CPU", primCPU, 0})
	floor("primary CPU per insert with the prepared capture behind it", wireCapture, wireInsert, part{"CPU", primCPU, 0})
	floor("read after write, the poll and read by hand", wirePollTrail, spinFloor, part{"p50", p50r, 0}, part{"p95", p95r, 0})
	floor("replica CPU per read after write, the poll and read by hand", wirePollTrail, naiveReplica, part{"CPU", replCPU, 0})
	floor("primary CPU per write and read, by hand", wirePollTrail, naiveReplica, part{"CPU", primCPU, 0})
	return ts
}

func printTargets(w io.Writer, ts []target, e *env, workers int, over string) {
	if over == "" {
		over = "same run, rounds interleaved"
	}
	fmt.Fprintf(w, "\nTargets (PostgreSQL %s, %d workers; %s):\n", e.serverVersion, workers, over)
	for _, t := range ts {
		var parts []string
		for _, r := range t.Ratios {
			part := fmt.Sprintf("%s %.3fx", r.Label, r.Value)
			if r.Runs > 1 {
				part += fmt.Sprintf(" (%.2f–%.2f)", r.Min, r.Max)
			}
			parts = append(parts, part)
		}
		line := fmt.Sprintf("  %-4s  %s", t.Status, t.Name)
		if len(parts) > 0 {
			line += ": " + strings.Join(parts, ", ")
		}
		if t.Note != "" {
			line += " [" + t.Note + "]"
		}
		fmt.Fprintln(w, line)
	}
}

func printText(w io.Writer, cfg *config, e *env, sums []summary, runs [][]target, elapsed, setup time.Duration) {
	where, delay := "local cluster", cfg.delay.String()
	if e.cluster == nil {
		where, delay = "given servers", "as configured there"
	}
	fmt.Fprintf(w, "rywbench: %s\n", machine(e))
	mode := "the user's loop: one strategy at a time"
	if cfg.mix {
		mode = "strategies mixed iteration by iteration (-mix)"
	}
	fmt.Fprintf(w, "%d replica(s) (%s), apply delay %s, budget %v, sleep %v; %d workers x %d iterations per strategy in %d rounds, %s\n\n",
		cfg.replicas, where, delay, cfg.budget, cfg.sleep, cfg.workers, cfg.iterations, cfg.rounds, mode)

	const row = "%-18s %-11s %6s %6s %6s %8s %9s %9s %9s %10s %10s %6s\n"
	fmt.Fprintf(w, row, "strategy", "does", "reads", "stale", "errors", "replica", "read p50", "read p95", "read p99", "write p50", "write p95", "tries")
	for _, s := range sums {
		share, tries := "-", "-"
		if s.Reads > 0 {
			share = fmt.Sprintf("%.1f%%", 100*s.ReplicaShare)
			tries = "1"
		}
		if s.TriesPerRead > 0 {
			tries = fmt.Sprintf("%.2f", s.TriesPerRead)
		}
		fmt.Fprintf(w, row, s.Name, s.Shape, fmt.Sprint(s.Reads), fmt.Sprint(s.Stale), fmt.Sprint(s.Errors), share,
			fmtMS(s.ReadP50), fmtMS(s.ReadP95), fmtMS(s.ReadP99), fmtMS(s.WriteP50), fmtMS(s.WriteP95), tries)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "replica = share of reads served by a replica (by inet_server_port(), through rywbench_port()); read = the read call")
	fmt.Fprintln(w, "(spin-floor: from the write's return to the first read that found the row; two-round-trip: with")
	fmt.Fprintln(w, "its LSN fetch and wait; sleep-replica: with the sleep); write = the insert (pgryw: with its capture")
	fmt.Fprintln(w, "of the primary's position); tries = reads sent per read (spin-floor, the polling models).")
	for _, s := range sums {
		if s.EarlyP50 > 0 {
			fmt.Fprintf(w, "%s: the insert's own answer (before the capture's) p50 %s, p95 %s\n", s.Name, fmtMS(s.EarlyP50), fmtMS(s.EarlyP95))
		}
	}
	printCost(w, sums, e.meter)

	for _, s := range sums {
		if s.FirstError != "" {
			fmt.Fprintf(w, "\n%s: %d errors; first: %s\n", s.Name, s.Errors, s.FirstError)
		}
		if s.PgrywStats != nil {
			st := s.PgrywStats
			fmt.Fprintf(w, "\n%s Stats over the measured iterations: ReplicaReads=%d PrimaryReads=%d Fallbacks=%d StaleReads=%d BehindErrors=%d\n"+
				"  Waits=%d WaitTimeouts=%d Captures=%d CaptureFailures=%d\n",
				s.Name, st.ReplicaReads, st.PrimaryReads, st.Fallbacks, st.StaleReads, st.BehindErrors,
				st.Waits, st.WaitTimeouts, st.Captures, st.CaptureFailures)
			if s.Scope != "" {
				fmt.Fprintf(w, "  (its pool named the writer %s", s.Scope)
				if others := scopeSharers(byName(sums), s.Name); len(others) > 0 {
					fmt.Fprintf(w, ", as %s did: one cluster scope)\n", strings.Join(others, ", "))
				} else {
					fmt.Fprintf(w, ": a cluster scope of its own)\n")
				}
			}
		}
	}

	var lines []string
	for _, r := range ratios(sums) {
		if r.ok {
			lines = append(lines, fmt.Sprintf("  %-48s %.2fx", r.label+":", r.value))
		}
	}
	if len(lines) > 0 {
		fmt.Fprintf(w, "\nRatios (same run):\n%s\n", strings.Join(lines, "\n"))
		by := byName(sums)
		if s, ok := by[naiveReplica]; ok && s.Stale > 0 && ratios(sums)[4].ok {
			fmt.Fprintf(w, "  (naive-replica never waits, and %.0f%% of its reads were stale: its read p50 is not a like-for-like baseline; spin-floor is)\n",
				100*float64(s.Stale)/float64(s.Reads))
		}
	}
	if !cfg.demo {
		if len(runs) > 1 {
			fmt.Fprintf(w, "\n(The tables above are the last of %d runs.)", len(runs))
		}
		printTargets(w, targets(sums, e.serverVersionNum, cfg.delay > 0), e, cfg.workers, "")
		if len(runs) > 1 {
			printTargets(w, mergeTargets(runs), e, cfg.workers, fmt.Sprintf("%d runs: each ratio's median, judged, and its range", len(runs)))
		}
	}

	if cfg.demo {
		if text := demoText(cfg, sums); text != "" {
			fmt.Fprintf(w, "\n%s\n", wrap(text, 78))
		}
	}
	fmt.Fprintf(w, "\nTook %v (of which starting and preparing the servers %v).\n", elapsed.Round(100*time.Millisecond), setup.Round(100*time.Millisecond))
}

// printCost prints the server cost table, when anything was measured.
func printCost(w io.Writer, sums []summary, m *costMeter) {
	any, evicted := false, false
	for _, s := range sums {
		if s.Cost != nil {
			any = true
			evicted = evicted || s.Cost.StatementsEvicted
		}
	}
	if !any {
		return
	}
	f := func(v *float64, prec int) string {
		if v == nil {
			return "-"
		}
		return strconv.FormatFloat(*v, 'f', prec, 64)
	}
	fmt.Fprintln(w, "\nServer cost per op (op = one iteration: a write and its read, or the strategy's one call):")
	const row = "%-18s %11s %13s %13s %11s %13s %13s\n"
	fmt.Fprintf(w, row, "strategy", "repl stmts", "repl CPU µs", "repl all µs", "prim stmts", "prim CPU µs", "prim all µs")
	for _, s := range sums {
		c := s.Cost
		if c == nil {
			continue
		}
		fmt.Fprintf(w, row, s.Name, f(c.ReplicaStatements, 2), f(c.ReplicaBackendCPU, 1), f(c.ReplicaAllCPU, 1),
			f(c.PrimaryStatements, 2), f(c.PrimaryBackendCPU, 1), f(c.PrimaryAllCPU, 1))
	}
	fmt.Fprintln(w, "stmts = pg_stat_statements calls (all replicas summed; pgryw's fast-path captures on the primary, FunctionCall")
	fmt.Fprintln(w, "messages, are not statements to it, and count only in CPU); CPU = client backends' time on CPU, all = the")
	fmt.Fprintln(w, "whole postmaster tree (replay, WAL sender/receiver, background processes) from /proc.")
	if bg := m.bg; bg.measured {
		fmt.Fprintf(w, "Less the background, measured for 1s with every pool open and idle (the pgryw pools' replica monitors\n"+
			"poll every 100ms): replicas %.1f stmts/s, CPU %.2f ms/s (all %.2f); primary %.1f stmts/s, CPU %.2f ms/s (all %.2f).\n",
			bg.replCalls, bg.replBack/1e6, bg.replAll/1e6, bg.primCalls, bg.primBack/1e6, bg.primAll/1e6)
	}
	if evicted {
		fmt.Fprintln(w, "WARNING: pg_stat_statements evicted entries during the run; statement counts are too low.")
	}
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
	return text + " Run without -demo to compare all the strategies."
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
		Mix        bool     `json:"mix"`
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
	Targets        []target           `json:"targets"`
	Runs           [][]target         `json:"runs,omitempty"` // with -repeat: each run's, Targets being their medians
	ElapsedSeconds float64            `json:"elapsed_seconds"`
}

func printJSON(w io.Writer, cfg *config, e *env, sums []summary, runs [][]target, elapsed time.Duration) error {
	var r jsonReport
	s := &r.Settings
	s.Workers, s.Iterations, s.Rounds, s.Replicas = cfg.workers, cfg.iterations, cfg.rounds, cfg.replicas
	s.Delay, s.Budget, s.Sleep = cfg.delay.String(), cfg.budget.String(), cfg.sleep.String()
	s.Strategies, s.Demo, s.Mix = cfg.strategies, cfg.demo, cfg.mix
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
	r.Targets = targets(sums, e.serverVersionNum, cfg.delay > 0)
	if len(runs) > 1 {
		r.Targets, r.Runs = mergeTargets(runs), runs
	}
	r.ElapsedSeconds = elapsed.Seconds()
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
