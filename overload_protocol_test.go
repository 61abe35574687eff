package pgryw_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/pgryw/pgryw"
)

// max_waits on the wire: a read that finds every place on the replica taken
// does not wait there. It still gets a check that does not wait riding in
// front of it: a replay position poll, also on PostgreSQL 19 instead of
// WAIT FOR. If that finds the replica behind, the replica counts as behind
// and, with no other replica, on_timeout decides.
func TestProtocolMaxWaitsFull(t *testing.T) {
	for _, tc := range []struct {
		name, version, extra string
		caughtUp             bool   // the replica has the write when the read arrives
		want                 string // the caller's row; "" for ErrReplicaBehind
	}{
		{"poll behind", "15.4", "", false, "writer"},
		{"poll behind error", "15.4", "on_timeout=error", false, ""},
		{"poll behind stale", "15.4", "on_timeout=stale", false, "old"},
		{"poll caught up", "15.4", "", true, "new"},
		{"wait for behind", "19devel", "", false, "writer"},
		{"wait for caught up", "19devel", "", true, "new"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc := newProtoCluster(t, tc.version, "wait_timeout=1s max_waits=2 "+tc.extra)
			warmReplica(t, pc)
			if tc.caughtUp {
				pc.r.replays(protoLSN)
			} else {
				pc.r.replays(protoBehind)
				pc.r.mu.Lock()
				pc.r.status = "timeout"
				pc.r.mu.Unlock()
			}
			release := pgryw.HoldWaits(pc.c, 0, 2)
			defer release()
			before := len(flushes(pc.replica, false))

			var v string
			err := pc.db.QueryRow(protoRead, 7).Scan(&v)
			if tc.want == "" {
				var rbe *pgryw.ReplicaBehindError
				if !errors.Is(err, pgryw.ErrReplicaBehind) || !errors.As(err, &rbe) || rbe.Limit != "max_waits=2" ||
					!strings.Contains(err.Error(), "max_waits=2 reads were already waiting on it") {
					t.Fatalf("read: %v; want ErrReplicaBehind for max_waits=2", err)
				}
			} else if err != nil || v != tc.want {
				t.Fatalf("read: %q, %v; want %q", v, err, tc.want)
			}

			// One flush on the replica: the check and the read, no waiting.
			fs := flushes(pc.replica, false)[before:]
			if tc.name == "poll behind stale" {
				// The stale read is sent again, without a check.
				if len(fs) != 2 || !reflect.DeepEqual(fs[1].msgs, readExec) {
					t.Fatalf("%d replica flushes; want 2: the checked read, then the read alone", len(fs))
				}
				fs = fs[:1]
			}
			if len(fs) != 1 {
				t.Fatalf("read took %d flushes on the replica, want 1 (it waited there)", len(fs))
			}
			if msgs := fs[0].msgs; !reflect.DeepEqual(msgs, cat(parseCheck, checkMsgs, readExec)) {
				t.Fatalf("replica flush %q; want pgryw_check, the read", msgs)
			}
			pc.r.mu.Lock()
			waitFors := len(pc.r.waits)
			pc.r.mu.Unlock()
			st := pc.c.Stats()
			refused := int64(1)
			if tc.caughtUp && tc.version == "15.4" {
				refused = 0 // polling's first check needs no place; WAIT FOR asks for one first
			}
			if waitFors != 0 || st.WaitsRefused != refused || st.Waits != 0 || st.WaitTimeouts != 0 || st.WaitPeak != 0 {
				t.Errorf("stats %+v", st)
			}
			if tc.want == "writer" && (st.Fallbacks != 1 || st.FallbackPeak != 1) {
				t.Errorf("stats %+v", st)
			}
		})
	}
}
