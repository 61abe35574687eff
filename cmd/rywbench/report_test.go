package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgryw/pgryw/internal/lsn"
)

func cost(repl, prim float64) *costSummary {
	return &costSummary{ReplicaBackendCPU: &repl, PrimaryBackendCPU: &prim}
}

func sums() []summary {
	return []summary{
		{Name: spinFloor, Reads: 100, ReadP50: 0.20, ReadP95: 0.40},
		{Name: pgrywName, Reads: 100, ReadP50: 0.23, ReadP95: 0.46, WriteP50: 0.105, WriteP95: 0.21, Cost: cost(70, 60)},
		{Name: naiveReplica, Reads: 100, ReadP50: 0.10, ReadP95: 0.20, WriteP50: 0.10, WriteP95: 0.20, Cost: cost(50, 50)},
		{Name: sleepReplica, Reads: 100, ReadP50: 50, ReadP95: 51, WriteP50: 0.10, WriteP95: 0.20, Cost: cost(30, 50)},
		{Name: plainWrite, WriteP50: 0.10, WriteP95: 0.20, Cost: cost(0, 50)},
		{Name: pgrywWrite, WriteP50: 0.11, WriteP95: 0.23, Cost: cost(0, 55)},
		{Name: replicaRead, Reads: 100, ReadP50: 0.10, ReadP95: 0.20},
		{Name: pgrywRead, Reads: 100, ReadP50: 0.105, ReadP95: 0.20},
	}
}

func TestTargets(t *testing.T) {
	status := func(ts []target) map[string]string {
		m := map[string]string{}
		for _, x := range ts {
			name, _, _ := strings.Cut(x.Name, " (")
			if isInfoLine(name) {
				continue
			}
			m[name] = x.Status
		}
		return m
	}
	// PostgreSQL 15: the read may be 1.20x the floor; 1.15x passes. The
	// write-only loop's write is 1.10x and 1.15x: FAIL. The primary's CPU
	// per write is 1.10x alone, 1.20x with the read: PASS, FAIL.
	got := status(targets(sums(), 150018, false))
	want := map[string]string{
		"read after write ≤ 1.20x the spin floor":                        "PASS",
		"write in the write-then-read loop ≤ 1.10x a plain insert there": "PASS",
		"write in a write-only loop ≤ 1.05x a plain insert":              "FAIL",
		"primary CPU per write ≤ 1.10x a plain insert":                   "PASS",
		"primary CPU per write and read ≤ 1.10x a plain insert and read": "FAIL",
		"replica CPU per read after write ≤ 1.5x a naive read":           "PASS",
		"read with no pending watermark ≤ 1.05x a plain replica read":    "PASS",
		"no-replica mode ≤ 1.03x pgx stdlib":                             "n/a",
		"cached routing 0 allocations":                                   "n/a",
	}
	pgxWant := map[string]string{}
	for k := range want {
		if k != "cached routing 0 allocations" {
			pgxWant["pgx: "+strings.Replace(k, "pgx stdlib", "pgxpool", 1)] = "n/a" // no pgx- strategies in this run
		}
	}
	for k, v := range pgxWant {
		if got[k] != v {
			t.Errorf("PostgreSQL 15: %s: %s, want %s", k, got[k], v)
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("PostgreSQL 15: %s: %s, want %s (all: %v)", k, got[k], v, got)
		}
	}
	if len(got) != len(want)+len(pgxWant) {
		t.Errorf("targets %v, want %d", got, len(want)+len(pgxWant))
	}
	// The same figures under pgx's front end's names judge pgx's targets
	// the same way.
	var px []summary
	for _, x := range sums() {
		for _, k := range pgxStrategies {
			if sqlKind(k) == x.Name {
				x.Name = k
				px = append(px, x)
			}
		}
	}
	gotPgx := status(targets(px, 150018, false))
	for k, v := range want {
		if pk := "pgx: " + strings.Replace(k, "pgx stdlib", "pgxpool", 1); pgxWant[pk] != "" && gotPgx[pk] != v {
			t.Errorf("pgx's front end: %s: %s, want %s", pk, gotPgx[pk], v)
		}
	}
	// PostgreSQL 19: the same read is over 1.10x.
	if got := status(targets(sums(), 190000, false)); got["read after write ≤ 1.10x the spin floor"] != "FAIL" {
		t.Errorf("PostgreSQL 19: read after write: %v, want FAIL", got)
	}
	// Behind: the replica's CPU is held to a read that slept the lag, here
	// 2.33x it, and the loop's write to sleep-replica's (here the same as
	// naive-replica's).
	if got := status(targets(sums(), 150018, true)); got["replica CPU per read after write ≤ 2x a read that slept the lag"] != "FAIL" ||
		!strings.Contains(strings.Join(names(targets(sums(), 150018, true)), ","), "(pgryw / sleep-replica)") {
		t.Errorf("lagged: %v, want the replica CPU target FAIL, judged against sleep-replica", got)
	}
	// A stale read fails the read target whatever the ratios.
	s := sums()
	s[1].Stale = 1
	if got := status(targets(s, 150018, false)); got["read after write ≤ 1.20x the spin floor"] != "FAIL" {
		t.Errorf("with a stale pgryw read: %v, want FAIL", got)
	}
	// Without server CPU (given servers) the CPU targets are n/a.
	s = sums()
	for i := range s {
		s[i].Cost = nil
	}
	if got := status(targets(s, 150018, false)); got["primary CPU per write ≤ 1.10x a plain insert"] != "n/a" {
		t.Errorf("without CPU: %v, want n/a", got)
	}
}

func names(ts []target) []string {
	var n []string
	for _, t := range ts {
		n = append(n, t.Name)
	}
	return n
}

func TestTargetRatios(t *testing.T) {
	for _, x := range targets(sums(), 190000, false) {
		if !strings.HasPrefix(x.Name, "read after") {
			continue
		}
		if len(x.Ratios) != 2 || x.Ratios[0].Limit != 1.10 || x.Ratios[1].Limit != 1.10 {
			t.Fatalf("ratios %+v", x.Ratios)
		}
		if d := x.Ratios[0].Value - 1.15; d > 1e-9 || d < -1e-9 {
			t.Errorf("p50 ratio %v, want 1.15", x.Ratios[0].Value)
		}
		return
	}
	t.Fatal("no read-after-write target")
}

// pgryw's strategies in one process share a cluster scope: the lines
// that need a pgryw pool alone (the write-only loop, a read with no
// watermark) say so when another pgryw strategy with replicas ran beside
// them, and not when none did (a pool without replicas does not count);
// a line's own note (stale reads) stays.
func TestTargetsSharedScope(t *testing.T) {
	notes := func(ss []summary) map[string]string {
		m := map[string]string{}
		for _, x := range targets(ss, 150018, false) {
			name, _, _ := strings.Cut(x.Name, " (")
			m[name] = x.Note
		}
		return m
	}
	const writeOnly, noWatermark = "write in a write-only loop ≤ 1.05x a plain insert", "read with no pending watermark ≤ 1.05x a plain replica read"
	got := notes(sums())
	for _, line := range []string{writeOnly, "primary CPU per write ≤ 1.10x a plain insert", noWatermark} {
		if !strings.Contains(got[line], "shares a cluster scope with pgryw") {
			t.Errorf("%s: note %q, want the shared scope named", line, got[line])
		}
	}
	if !strings.Contains(got[writeOnly], pgrywRead) {
		t.Errorf("note %q leaves out the read-only strategy, whose reads count as uses of the watermark", got[writeOnly])
	}
	var alone []summary
	for _, s := range sums() {
		switch s.Name {
		case pgrywName, pgrywRead:
		default:
			alone = append(alone, s)
		}
	}
	alone = append(alone, summary{Name: pgrywNoReplica, Reads: 100, ReadP50: 0.1, ReadP95: 0.2})
	if got := notes(alone); got[writeOnly] != "" {
		t.Errorf("beside a pool without replicas alone: note %q", got[writeOnly])
	}
	// Each pool named the writer by an address of its own (scopes.go):
	// no line needs a note.
	own := sums()
	for i := range own {
		own[i].Scope = fmt.Sprintf("127.0.0.%d", i+1)
	}
	for line, note := range notes(own) {
		if strings.Contains(note, "shares a cluster scope") {
			t.Errorf("scopes of their own: %s: note %q", line, note)
		}
	}
	// Two of three on one address: those two are named.
	two := sums()
	for i := range two {
		switch two[i].Name {
		case pgrywWrite:
			two[i].Scope = "127.0.0.2"
		default:
			two[i].Scope = "127.0.0.1"
		}
	}
	got = notes(two)
	if got[writeOnly] != "" {
		t.Errorf("write-only pool on an address of its own: note %q", got[writeOnly])
	}
	if !strings.Contains(got[noWatermark], "shares a cluster scope with pgryw") || strings.Contains(got[noWatermark], pgrywWrite) {
		t.Errorf("read-only pool sharing the loop's address: note %q, want pgryw named and not %s", got[noWatermark], pgrywWrite)
	}
	stale := sums()
	for i := range stale {
		if stale[i].Name == pgrywRead {
			stale[i].Stale = 3
		}
	}
	if got := notes(stale); !strings.Contains(got[noWatermark], "3 stale reads") || !strings.Contains(got[noWatermark], "shares a cluster scope") {
		t.Errorf("stale reads and a shared scope: note %q, want both", got[noWatermark])
	}
}

func TestIsClientTitle(t *testing.T) {
	for title, want := range map[string]bool{
		"postgres: replica0: postgres postgres 127.0.0.1(41234) idle":          true,
		"postgres: writer: postgres postgres [local] idle":                     true,
		"postgres: writer: walsender postgres 127.0.0.1(37012) streaming 0/30": false,
		"postgres: replica0: startup recovering 000000010000000000000003":      false,
		"postgres: replica0: walreceiver streaming 0/3000148":                  false,
		"postgres: writer: checkpointer ":                                      false,
		"postgres: writer: autovacuum launcher (x)":                            false,
	} {
		if got := isClientTitle(title); got != want {
			t.Errorf("isClientTitle(%q) = %v, want %v", title, got, want)
		}
	}
}

// TestTreeCPU reads this process's own tree: it has burnt some CPU.
func TestTreeCPU(t *testing.T) {
	if _, err := os.Stat("/proc/self/schedstat"); err != nil {
		t.Skip("no /proc/self/schedstat here")
	}
	all, _, err := treeCPU(os.Getpid(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if all <= 0 {
		t.Errorf("treeCPU(self) = %v, want > 0", all)
	}
}

func TestCostDeltaBackground(t *testing.T) {
	m := &costMeter{stmts: true, cpu: true, replicas: []*nodeMeter{{}, {}},
		bg: costRate{replCalls: 10, replAll: 1e6, measured: true}}
	var d costDelta
	before := costSnap{replicas: nodeSnap{calls: 100, all: 0}, primary: nodeSnap{calls: 5}}
	after := costSnap{replicas: nodeSnap{calls: 100 + 2 + 50 + 5, all: 3 * time.Millisecond}, primary: nodeSnap{calls: 5 + 1 + 20}}
	d.add(m, before, after, 500*time.Millisecond)
	// 57 calls on the replicas, less one snapshot each, less 10/s for 0.5s.
	if d.replCalls != 50 || d.primCalls != 20 {
		t.Errorf("calls: replicas %v, primary %v; want 50, 20", d.replCalls, d.primCalls)
	}
	c := d.summarize(10)
	if *c.ReplicaStatements != 5 || *c.ReplicaAllCPU != 250 {
		t.Errorf("per op: %v statements, %v µs; want 5, 250", *c.ReplicaStatements, *c.ReplicaAllCPU)
	}
}

func TestModelSQL(t *testing.T) {
	target := lsn.LSN(0x3000148)
	if got := waitForModelSQL(target, 0); !strings.Contains(got, "'0/03000148'") || !strings.Contains(got, "TIMEOUT '1ms'") {
		t.Errorf("waitForModelSQL: %s", got)
	}
	got := doWaitSQL(target, 500*time.Millisecond)
	for _, part := range []string{"'0/03000148'::pg_lsn", "COMMIT;", "interval '500 milliseconds'", "ERRCODE = '" + doTimeoutState + "'"} {
		if !strings.Contains(got, part) {
			t.Errorf("doWaitSQL lacks %q:\n%s", part, got)
		}
	}
}

func TestLoadTargets(t *testing.T) {
	res := []*loadResult{
		{Name: loadPerNode, OpsPerSec: 1000},
		{Name: pgrywName, OpsPerSec: 950, ReadingMax: 18, Conns: []connStats{{Node: "primary", HeldMax: 32}, {Node: "replica0", HeldMax: 33, BusyMax: 2}}},
		{Name: pgrywSession, OpsPerSec: 950, Stale: 1, ReadingMax: 3, Conns: []connStats{{Node: "replica0", HeldMax: 5, BusyMax: 1}}},
	}
	var got []string
	for _, j := range loadTargets(res) {
		got = append(got, j.status+" "+j.text)
	}
	want := []string{
		"PASS pgryw throughput ≥ 90% of per-node-pools, 0 stale: 95% (0 stale)",
		"FAIL pgryw server connections on replica0 ≤ peak reads in flight + 2: held 33, reads in flight peak 18 (busy peak 2)",
		"FAIL pgryw-session throughput ≥ 90% of per-node-pools, 0 stale: 95% (1 stale)",
		"PASS pgryw-session server connections on replica0 ≤ peak reads in flight + 2: held 5, reads in flight peak 3 (busy peak 1)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestScopeHosts: each pgryw strategy with replicas gets a writer address
// of its own, as far as the addresses can be bound; the rest share
// 127.0.0.1; the DSN names the address.
func TestScopeHosts(t *testing.T) {
	kinds := scopedKinds([]string{spinFloor, pgrywName, pgrywNoReplica, pgrywWrite, naiveReplica, pgrywRead, pgrywName})
	if want := []string{pgrywName, pgrywWrite, pgrywRead}; !slices.Equal(kinds, want) {
		t.Fatalf("scopedKinds: %v, want %v", kinds, want)
	}
	by, hosts := scopeHosts(kinds, func(string) bool { return true })
	if by[pgrywName] != "127.0.0.1" || by[pgrywWrite] != "127.0.0.2" || by[pgrywRead] != "127.0.0.3" || len(hosts) != 3 {
		t.Errorf("all bindable: %v, listening on %v", by, hosts)
	}
	if l := listenLine(hosts); l != "listen_addresses = '127.0.0.1,127.0.0.2,127.0.0.3'" {
		t.Errorf("listen line %q", l)
	}
	by, hosts = scopeHosts(kinds, func(h string) bool { return h == "127.0.0.2" })
	if by[pgrywName] != "127.0.0.1" || by[pgrywWrite] != "127.0.0.2" || by[pgrywRead] != "127.0.0.1" || len(hosts) != 2 {
		t.Errorf("127.0.0.3 not bindable: %v, listening on %v", by, hosts)
	}
	by, hosts = scopeHosts(kinds, func(string) bool { return false })
	if by[pgrywWrite] != "127.0.0.1" || len(hosts) != 1 {
		t.Errorf("none bindable: %v, listening on %v", by, hosts)
	}

	e := &env{primaryDSN: "postgres://postgres@127.0.0.1:5433/postgres?sslmode=disable", scopeHost: map[string]string{pgrywName: "127.0.0.1", pgrywWrite: "127.0.0.2"}}
	if d := e.pgrywDSN(pgrywWrite); d != "postgres://postgres@127.0.0.2:5433/postgres?sslmode=disable" {
		t.Errorf("pgrywDSN(%s) = %q", pgrywWrite, d)
	}
	for _, k := range []string{pgrywName, pgrywRead} {
		if d := e.pgrywDSN(k); d != e.primaryDSN {
			t.Errorf("pgrywDSN(%s) = %q, want the writer's DSN", k, d)
		}
	}
	e.primaryDSN = "postgres://u@db.example:5432/app"
	if d := e.pgrywDSN(pgrywWrite); d != e.primaryDSN {
		t.Errorf("given servers: pgrywDSN = %q, want the DSN as it is", d)
	}
}

// -repeat judges each target line on the median of the runs' ratios and
// keeps their range; a run with a stale read fails the line whatever the
// medians; n/a in any run is n/a.
func TestMergeTargets(t *testing.T) {
	run := func(p50 float64, stale int) []target {
		s := sums()
		s[1].ReadP50 = 0.20 * p50
		s[1].Stale = stale
		return targets(s, 150018, false)
	}
	find := func(ts []target, prefix string) target {
		for _, x := range ts {
			if strings.HasPrefix(x.Name, prefix) {
				return x
			}
		}
		t.Fatalf("no line %q", prefix)
		return target{}
	}
	const line = "read after write ≤ 1.20x"
	// Two of three runs within 1.20x: the median (1.15) passes.
	m := mergeTargets([][]target{run(1.10, 0), run(1.40, 0), run(1.15, 0)})
	got := find(m, line)
	if got.Status != "PASS" || got.Ratios[0].Runs != 3 {
		t.Fatalf("%+v", got)
	}
	if r := got.Ratios[0]; fmt.Sprintf("%.2f %.2f %.2f", r.Value, r.Min, r.Max) != "1.15 1.10 1.40" {
		t.Fatalf("median and range %+v", r)
	}
	// Two of three over it: FAIL.
	if got := find(mergeTargets([][]target{run(1.30, 0), run(1.40, 0), run(1.15, 0)}), line); got.Status != "FAIL" {
		t.Fatalf("%+v", got)
	}
	// Every ratio within, but one run had a stale read: FAIL, with its note.
	got = find(mergeTargets([][]target{run(1.10, 0), run(1.10, 2)}), line)
	if got.Status != "FAIL" || !strings.Contains(got.Note, "2 stale reads") {
		t.Fatalf("%+v", got)
	}
	if got := find(mergeTargets([][]target{run(1.10, 0), run(1.10, 0)}), "no-replica mode"); got.Status != "n/a" {
		t.Fatalf("%+v", got)
	}
	if median([]float64{4, 1, 3, 2}) != 2.5 {
		t.Fatal("median of an even count")
	}
}

// The wire models' floors are printed beside the targets when the models
// ran, never judged.
func TestFloorLines(t *testing.T) {
	s := append(sums(),
		summary{Name: wireInsert, WriteP50: 0.09, Cost: cost(0, 40)},
		summary{Name: wireFastCap, WriteP50: 0.09, Cost: cost(0, 48)},
	)
	var floors []target
	for _, x := range targets(s, 150018, false) {
		if strings.HasPrefix(x.Name, "floor: ") {
			floors = append(floors, x)
		}
	}
	if len(floors) != 1 || floors[0].Status != "info" || fmt.Sprintf("%.2f", floors[0].Ratios[0].Value) != "1.20" || floors[0].Ratios[0].Limit != 0 {
		t.Fatalf("floors %+v", floors)
	}
	for _, x := range targets(sums(), 150018, false) {
		if strings.HasPrefix(x.Name, "floor: ") {
			t.Fatalf("a floor line without the models: %+v", x)
		}
	}
}

// isInfoLine: a line targets prints beside the targets, never judged.
func isInfoLine(name string) bool {
	for _, p := range []string{"rhythm: ", "beside the spin floor: ", "floor: "} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// The rhythm and spin-floor lines print when their strategies ran, as info.
func TestRhythmLines(t *testing.T) {
	s := sums()
	s[0].WriteP50, s[0].WriteP95, s[0].Cost = 0.13, 0.25, cost(60, 57)
	n := 0
	for _, x := range targets(s, 150018, false) {
		if strings.HasPrefix(x.Name, "rhythm: ") || strings.HasPrefix(x.Name, "beside the spin floor: ") {
			n++
			if x.Status != "info" || len(x.Ratios) != 4 {
				t.Fatalf("%+v", x)
			}
		}
		if strings.HasPrefix(x.Name, "rhythm: ") && fmt.Sprintf("%.2f", x.Ratios[0].Value) != "1.30" {
			t.Fatalf("rhythm write p50 %+v", x.Ratios[0])
		}
	}
	if n != 2 {
		t.Fatalf("%d rhythm lines", n)
	}
}
