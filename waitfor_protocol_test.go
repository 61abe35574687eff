package pgryw_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/pgryw/pgryw"
)

// PostgreSQL 19.0's refusals of WAIT FOR, on the wire. A wait that raises
// instead of answering with a status makes the server skip the read
// chained behind it; pgryw reads the SQLSTATE alone:
//   - 55000 (the session holds a lock, or a snapshot): the node cannot
//     wait here now; the read goes to the next node or the primary, the
//     node is not marked down, the replica connection is closed (releasing
//     whatever it held), and Stats.WaitRefusals counts it;
//   - 57014 (a cancel, which on 19.0 wins over an expired TIMEOUT, or the
//     session's statement_timeout): routed like a 'timeout' row, by
//     on_timeout.
//
// No 55000 or 57014 of a wait reaches the caller.
func TestProtocolWaitForRefused(t *testing.T) {
	for _, tc := range []struct {
		name, code, extra string
		want              string // the caller's row; "" for ErrReplicaBehind
		check             func(pgryw.Stats) bool
	}{
		{"lock rule", "55000", "", "writer", func(st pgryw.Stats) bool {
			return st.WaitRefusals == 1 && st.Fallbacks == 1 && st.WaitTimeouts == 0
		}},
		{"lock rule, on_timeout=error", "55000", "on_timeout=error", "writer", func(st pgryw.Stats) bool {
			return st.WaitRefusals == 1 && st.BehindErrors == 0 // not behind: another node serves it
		}},
		{"cancel over timeout", "57014", "", "writer", func(st pgryw.Stats) bool {
			return st.WaitTimeouts == 1 && st.Fallbacks == 1 && st.WaitRefusals == 0
		}},
		{"cancel over timeout, on_timeout=error", "57014", "on_timeout=error", "", func(st pgryw.Stats) bool {
			return st.WaitTimeouts == 1 && st.BehindErrors == 1
		}},
		{"cancel over timeout, on_timeout=stale", "57014", "on_timeout=stale", "old", func(st pgryw.Stats) bool {
			return st.WaitTimeouts == 1 && st.StaleReads == 1
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc := newProtoCluster(t, "19devel", "wait_timeout=200ms "+tc.extra)
			warmReplica(t, pc)
			conns := poolConns(pc.replica)
			pc.r.replays(protoBehind)
			pc.r.mu.Lock()
			pc.r.waitErr = tc.code
			pc.r.mu.Unlock()
			var v string
			err := pc.db.QueryRow(protoRead, 7).Scan(&v)
			if tc.want == "" {
				if !errors.Is(err, pgryw.ErrReplicaBehind) {
					t.Fatalf("read: %v; want ErrReplicaBehind", err)
				}
			} else if err != nil || v != tc.want {
				t.Fatalf("read: %q, %v; want %q (no error of the wait's)", v, err, tc.want)
			}
			if st := pc.c.Stats(); !tc.check(st) {
				t.Errorf("stats %+v", st)
			}
			ns := pc.c.NodeStats()[1]
			if ns.Health != pgryw.HealthUp {
				t.Errorf("replica health %v after a %s: the node is fine", ns.Health, tc.code)
			}
			if tc.code == "55000" && ns.Misses[pgryw.FallbackCannotWait] != 1 {
				t.Errorf("replica misses %v; want one %q", ns.Misses, pgryw.FallbackCannotWait)
			}
			// The next read, once the replica has caught up, is served by it:
			// on a new connection after a refusal.
			pc.r.mu.Lock()
			pc.r.waitErr = ""
			pc.r.mu.Unlock()
			pc.r.replays(protoLSN)
			if err := pc.db.QueryRow(protoRead, 7).Scan(&v); err != nil || v != "new" {
				t.Fatalf("next read: %q, %v", v, err)
			}
			opened := poolConns(pc.replica) - conns
			if want := map[string]int{"55000": 1, "57014": 0}[tc.code]; opened != want {
				t.Errorf("%d replica connections opened; want %d", opened, want)
			}
		})
	}
}

// TIMEOUT is whole milliseconds within what the caller's context has left,
// never 0 (which would wait for ever): with less than a millisecond left
// (0.4 ms, which PostgreSQL 19 would round to 0) it is '1ms'.
func TestProtocolWaitForTimeoutWithinDeadline(t *testing.T) {
	pc := newProtoCluster(t, "19devel", "wait_timeout=1s")
	warmReplica(t, pc)
	pc.r.replays(protoLSN)
	for _, left := range []time.Duration{3 * time.Millisecond, 1500 * time.Microsecond, 400 * time.Microsecond} {
		if _, err := pc.db.Exec(protoInsert, 1); err != nil {
			t.Fatal(err)
		}
		pc.r.mu.Lock()
		before := len(pc.r.waits)
		pc.r.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), left)
		var v string
		pc.db.QueryRowContext(ctx, protoRead, 7).Scan(&v) // may fail: the deadline is short
		cancel()
		pc.r.mu.Lock()
		waits := pc.r.waits[before:]
		pc.r.mu.Unlock()
		for _, w := range waits {
			m := waitForRE.FindStringSubmatch(w)
			if m == nil {
				t.Fatalf("wait %q", w)
			}
			if ms, _ := strconv.Atoi(m[2]); ms < 1 || int64(ms) > max(1, left.Milliseconds()) {
				t.Errorf("TIMEOUT %sms with %v left", m[2], left)
			}
		}
	}
}

// On PostgreSQL 19 the monitor reads pg_stat_recovery: the timeline shows
// in NodeStats, and a pending promotion takes the replica out of reads. A
// role without pg_read_all_stats gets no row from the view: the functions
// answer for the position, and nothing else changes.
func TestProtocolMonitorReadsStatRecovery(t *testing.T) {
	for _, tc := range []struct {
		name, tli, promoting string
		health               pgryw.Health
		timeline             uint32
	}{
		{"timeline", "3", "f", pgryw.HealthUp, 3},
		{"no pg_read_all_stats", "", "", pgryw.HealthUp, 0},
		{"promotion pending", "3", "t", pgryw.HealthNotStandby, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc := newProtoCluster(t, "19devel", "")
			pc.r.mu.Lock()
			pc.r.tli, pc.r.promoting = tc.tli, tc.promoting
			pc.r.mu.Unlock()
			var v string
			if err := pc.db.QueryRow(protoRead, 7).Scan(&v); err != nil { // starts the monitor
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				ns := pc.c.NodeStats()[1]
				if ns.Health == tc.health && ns.Timeline == tc.timeline && (ns.Position != 0 || tc.health != pgryw.HealthUp) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("replica %+v; want health %v, timeline %d", ns, tc.health, tc.timeline)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
