package pgryw_test

import (
	"reflect"
	"testing"
)

// On PostgreSQL 15 and 18 the catch-up check (a replay position poll) goes
// in the read's own implicit transaction, without a Sync of its own, in
// front of an extended-protocol read: one ReadyForQuery, and one server
// flush, fewer. That is sound under READ COMMITTED, where the read takes its
// snapshot after the poll ran. Under a default of REPEATABLE READ (or
// SERIALIZABLE) the poll's parse takes the transaction's snapshot before it
// reads the replay position, so a position at the watermark says nothing
// of what the read sees. The check reads the transaction's isolation level
// too: under REPEATABLE READ its answer is not used, the read's is
// discarded, and the read goes again behind a check with a Sync of its own
// (its own transaction), as every later check on that connection does.
func TestProtocolCheckChainedOnlyUnderReadCommitted(t *testing.T) {
	t.Parallel()
	for _, iso := range []string{"read committed", "repeatable read", "serializable"} {
		t.Run(iso, func(t *testing.T) {
			pc := newProtoCluster(t, "15.4", "")
			pc.r.mu.Lock()
			pc.r.iso = iso
			pc.r.mu.Unlock()
			warmReplica(t, pc)
			pc.r.replays(protoLSN)
			before := len(flushes(pc.replica, false))
			var v string
			if err := pc.db.QueryRow(protoRead, 7).Scan(&v); err != nil || v != "new" {
				t.Fatalf("read: %q, %v", v, err)
			}
			// A second write, further on, and its read: a check again.
			pc.w.mu.Lock()
			pc.w.lsn = "0/3000200"
			pc.w.mu.Unlock()
			if _, err := pc.db.Exec(protoInsert, 2); err != nil {
				t.Fatal(err)
			}
			pc.r.replays("0/3000200")
			if err := pc.db.QueryRow(protoRead, 7).Scan(&v); err != nil || v != "new" {
				t.Fatalf("second read: %q, %v", v, err)
			}
			got := msgsOf(flushes(pc.replica, false)[before:])
			want := [][]string{cat(parseCheck, checkMsgs, readExec), cat(checkMsgs, readExec)}
			if iso != "read committed" {
				want = [][]string{
					cat(parseCheck, checkMsgs, readExec), // its answer not used,
					cat(parsePoll, pollMsgs, readExec),   // the read again, checked in a transaction of its own,
					cat(pollMsgs, readExec),              // and so is the next read's check
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("replica flushes\n %q\nwant\n %q", got, want)
			}
			pc.r.mu.Lock()
			reads := pc.r.reads
			pc.r.mu.Unlock()
			if wantReads := 1 + len(want); reads != wantReads { // and the warm-up's
				t.Errorf("%d executions of the read on the replica, want %d", reads, wantReads)
			}
		})
	}
}

// Behind a transaction pooler the check can only go in the read's own
// transaction. Under REPEATABLE READ it cannot check there: the read runs
// on the primary (FallbackCannotWait), and so do the connection's later
// reads that need a check, without trying the replica first.
func TestProtocolPooledCheckUnderRepeatableRead(t *testing.T) {
	db, ir, srv, c := instanceCluster(t, true)
	ir.r.iso = "repeatable read"
	ir.set("fake", protoLSN)
	for i := range 2 {
		if _, err := db.Exec(protoInsert, 1); err != nil {
			t.Fatal(err)
		}
		if v := readOnce(t, db, "read"); v != "writer" {
			t.Fatalf("read %d: %q, want the primary's answer", i, v)
		}
	}
	if n := polls(srv, "fake"); n != 1 {
		t.Errorf("%d checks reached the replica, want 1 (the first read's)", n)
	}
	if st := c.Stats(); st.Fallbacks != 2 || st.ReplicaReads != 0 {
		t.Errorf("stats %+v; want both reads on the primary", st)
	}
}

// A check chained in front of pgx's prepare alone (a statement's first run
// on a connection: Parse, Describe, Sync) runs in that flush's transaction,
// and the read in a later one, which takes its snapshot after: the check
// holds at any isolation level, and the read runs once.
func TestProtocolCheckWithPrepareHoldsUnderRepeatableRead(t *testing.T) {
	t.Parallel()
	pc := newProtoCluster(t, "15.4", "")
	pc.r.mu.Lock()
	pc.r.iso = "repeatable read"
	pc.r.mu.Unlock()
	if _, err := pc.db.Exec(protoInsert, 1); err != nil {
		t.Fatal(err)
	}
	pc.r.replays(protoLSN)
	before := len(flushes(pc.replica, false))
	var v string
	if err := pc.db.QueryRow(protoRead, 7).Scan(&v); err != nil || v != "new" {
		t.Fatalf("read: %q, %v", v, err)
	}
	got := msgsOf(flushes(pc.replica, false)[before:])
	want := [][]string{
		cat(parseCheck, checkMsgs, []string{"Parse " + protoRead, "Describe S " + protoRead, "Sync"}),
		readExec,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("replica flushes\n %q\nwant\n %q", got, want)
	}
	pc.r.mu.Lock()
	defer pc.r.mu.Unlock()
	if pc.r.reads != 1 {
		t.Errorf("%d executions of the read on the replica, want 1", pc.r.reads)
	}
}
