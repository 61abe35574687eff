package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pgryw/pgryw/internal/lsn"
)

func sums() []summary {
	return []summary{
		{Name: spinFloor, Reads: 100, ReadP50: 0.20, ReadP95: 0.40},
		{Name: pgrywName, Reads: 100, ReadP50: 0.24, ReadP95: 0.59},
		{Name: plainWrite, WriteP50: 0.10, WriteP95: 0.20},
		{Name: pgrywWrite, WriteP50: 0.11, WriteP95: 0.23},
		{Name: replicaRead, Reads: 100, ReadP50: 0.10, ReadP95: 0.20},
		{Name: pgrywRead, Reads: 100, ReadP50: 0.105, ReadP95: 0.20},
	}
}

func TestTargets(t *testing.T) {
	status := func(ts []target) map[string]string {
		m := map[string]string{}
		for _, x := range ts {
			m[strings.Fields(x.Name)[0]+" "+strings.Fields(x.Name)[1]] = x.Status
		}
		return m
	}
	// PostgreSQL 15: read p50 may be 1.25x the floor; 1.20x passes, and
	// p95 1.475x passes. The write's p95 is 1.15x: FAIL.
	got := status(targets(sums(), 150018))
	want := map[string]string{
		"write ≤":         "FAIL",
		"read after":      "PASS",
		"read with":       "PASS",
		"no-replica mode": "n/a",
		"cached routing":  "n/a",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("PostgreSQL 15: %s: %s, want %s (all: %v)", k, got[k], v, got)
		}
	}
	// PostgreSQL 19: the same read is over 1.10x.
	if got := status(targets(sums(), 190000)); got["read after"] != "FAIL" {
		t.Errorf("PostgreSQL 19: read after write %s, want FAIL", got["read after"])
	}
	// A stale read fails the read target whatever the ratios.
	s := sums()
	s[1].Stale = 1
	if got := status(targets(s, 150018)); got["read after"] != "FAIL" {
		t.Errorf("with a stale pgryw read: %s, want FAIL", got["read after"])
	}
}

func TestTargetRatios(t *testing.T) {
	for _, x := range targets(sums(), 190000) {
		if !strings.HasPrefix(x.Name, "read after") {
			continue
		}
		if len(x.Ratios) != 2 || x.Ratios[0].Limit != 1.10 || x.Ratios[1].Limit != 1.50 {
			t.Fatalf("ratios %+v", x.Ratios)
		}
		if d := x.Ratios[0].Value - 1.2; d > 1e-9 || d < -1e-9 {
			t.Errorf("p50 ratio %v, want 1.2", x.Ratios[0].Value)
		}
		return
	}
	t.Fatal("no read-after-write target")
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
