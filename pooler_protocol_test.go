package pgryw_test

import (
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgfake"
	"github.com/pgryw/pgryw/internal/wire"
)

// Connections closed with pgryw's answers still due, and replicas whose
// address starts leading to another server: what is known of a replica
// belongs to the server instance that answered.

// heldPollReplica is a fake standby that answers a read at once and holds
// back the answer of the replay poll riding behind it (for holdFor, or for
// good when that is 0), as a busy server's second packet; it notes whether
// that answer had gone out when the connection's Terminate came.
type heldPollReplica struct {
	protoReplica
	holdFor time.Duration

	mu         sync.Mutex
	heldOn     map[int]bool // connections a poll answer was held back on
	held       int          // poll answers held back
	sent       int          // of those, sent
	terminated bool         // a Terminate arrived
	termAt     time.Time    // when
	termEarly  bool         // it arrived while an answer was held
}

func (r *heldPollReplica) handle(c *pgfake.Conn, b pgfake.Batch) []pgproto3.BackendMessage {
	for _, m := range b.Msgs {
		if _, ok := m.(*pgproto3.Terminate); ok {
			r.mu.Lock()
			defer r.mu.Unlock()
			if !r.heldOn[c.ID()] {
				return nil // another connection's (the monitor's, say)
			}
			r.terminated, r.termAt = true, time.Now()
			r.termEarly = r.termEarly || r.sent < r.held
			return nil
		}
	}
	out := r.protoReplica.handle(c, b)
	if !executes(c, b, protoRead) || !executes(c, b, protoPoll) {
		return out
	}
	for i, m := range out {
		if _, ok := m.(*pgproto3.ReadyForQuery); ok && i < len(out)-1 {
			rest := out[i+1:]
			r.mu.Lock()
			r.held++
			if r.heldOn == nil {
				r.heldOn = map[int]bool{}
			}
			r.heldOn[c.ID()] = true
			r.mu.Unlock()
			if r.holdFor == 0 {
				return out[:i+1] // never answered
			}
			go func() {
				time.Sleep(r.holdFor)
				r.mu.Lock() // a Terminate is looked at after the count
				c.Send(rest...)
				r.sent++
				r.mu.Unlock()
			}()
			return out[:i+1]
		}
	}
	return out
}

// fakeServer starts a fake server with cfg, closed with the test.
func fakeServer(t *testing.T, cfg pgfake.Config) *pgfake.Server {
	t.Helper()
	s, err := pgfake.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// fakeWriter starts a scripted fake writer (protoWriter).
func fakeWriter(t *testing.T) *pgfake.Server {
	w := &protoWriter{lsn: protoLSN, value: "writer"}
	return fakeServer(t, pgfake.Config{ServerVersion: "15.4", InHotStandby: "off", Handler: w.handle})
}

// twoHeldReplicas starts a fake writer and two held-poll standbys (two
// replicas: a poll rides behind every replica read) and opens a pool that
// keeps no idle connection, as database/sql does under churn.
func twoHeldReplicas(t *testing.T, holdFor time.Duration) (*sql.DB, []*heldPollReplica, []*pgfake.Server) {
	t.Helper()
	writer := fakeWriter(t)
	var rs []*heldPollReplica
	var srvs []*pgfake.Server
	var addrs []string
	for i := 0; i < 2; i++ {
		r := &heldPollReplica{protoReplica: protoReplica{replay: protoStart, status: "success"}, holdFor: holdFor}
		s := fakeServer(t, pgfake.Config{ServerVersion: "15.4", InHotStandby: "on", Handler: r.handle})
		rs, srvs, addrs = append(rs, r), append(srvs, s), append(addrs, s.Addr())
	}
	db, _ := openDSN(t, fmt.Sprintf("host=%s port=%d user=app password=secret dbname=app sslmode=disable connect_timeout=2 replicas=%s",
		writer.Host(), writer.Port(), strings.Join(addrs, ",")))
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(0)
	return db, rs, srvs
}

// A read whose trailing poll is still unanswered when database/sql closes
// its connection: the Terminate waits for the poll's answer, so nothing of
// pgryw's is in flight when the server connection is let go (a pooler
// would hand it, answer and all, to its next client).
func TestProtocolCloseDrainsRideAlong(t *testing.T) {
	db, rs, _ := twoHeldReplicas(t, 150*time.Millisecond)
	var v string
	if err := db.QueryRow(protoRead, 7).Scan(&v); err != nil || v != "old" {
		t.Fatalf("read: %q, %v", v, err)
	}
	db.Close() // and with it the replica connections given back
	deadline := time.Now().Add(3 * time.Second)
	for {
		var held, terminated, early int
		for _, r := range rs {
			r.mu.Lock()
			held += r.held
			if r.terminated {
				terminated++
			}
			if r.termEarly {
				early++
			}
			r.mu.Unlock()
		}
		if early > 0 {
			t.Fatal("the connection's Terminate came while pgryw's poll answer was still held back")
		}
		if held == 1 && terminated >= 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("held %d poll answers, %d Terminates", held, terminated)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// When the answer never comes, closing waits wire.DrainWait for it, then
// ends the connection anyway: a stalled server does not hold the caller.
func TestProtocolCloseGivesUpAfterDrainWait(t *testing.T) {
	t.Parallel()
	db, rs, _ := twoHeldReplicas(t, 0)
	var v string
	returned := time.Now() // (Scan closes the rows, and database/sql the connection, before it returns)
	if err := db.QueryRow(protoRead, 7).Scan(&v); err != nil || v != "old" {
		t.Fatalf("read: %q, %v", v, err)
	}
	deadline := returned.Add(5 * time.Second)
	for {
		var terminated bool
		var at time.Time
		for _, r := range rs {
			r.mu.Lock()
			if r.terminated {
				terminated, at = true, r.termAt
			}
			r.mu.Unlock()
		}
		if terminated {
			if d := at.Sub(returned); d < wire.DrainWait*8/10 || d > 3*time.Second {
				t.Errorf("Terminate %v after the read began; want about %v", d, wire.DrainWait)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the connection with an answer due was never ended")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// instanceReplica is a fake standby address behind which each server
// instance has replayed its own position: a connection reads the position
// of the instance it reached when it was opened (pgfake.Conn.Instance).
type instanceReplica struct {
	mu  sync.Mutex
	r   protoReplica
	pos map[string]string
	// cur: the instance new connections reach (point); opened: the one
	// each connection reached, for those that never asked (pooler=
	// transaction sends no identity query).
	cur    string
	opened map[int]string
}

func (ir *instanceReplica) handle(c *pgfake.Conn, b pgfake.Batch) []pgproto3.BackendMessage {
	ir.mu.Lock()
	defer ir.mu.Unlock()
	inst := c.Instance()
	if inst == "" {
		if _, ok := ir.opened[c.ID()]; !ok {
			ir.opened[c.ID()] = ir.cur
		}
		inst = ir.opened[c.ID()]
	}
	if p, ok := ir.pos[inst]; ok {
		ir.r.mu.Lock()
		ir.r.replay = p
		ir.r.mu.Unlock()
	}
	return ir.r.handle(c, b)
}

// point makes new connections to srv reach instance inst.
func (ir *instanceReplica) point(srv *pgfake.Server, inst string) {
	ir.mu.Lock()
	ir.cur = inst
	ir.mu.Unlock()
	srv.SetInstance(inst)
}

func (ir *instanceReplica) set(inst, pos string) {
	ir.mu.Lock()
	ir.pos[inst] = pos
	ir.mu.Unlock()
}

// instanceCluster starts a fake writer and one fake standby address (that
// looks like a pooler with pooled), and a pool on them with a short
// budget.
func instanceCluster(t *testing.T, pooled bool, extra ...string) (*sql.DB, *instanceReplica, *pgfake.Server, *pgryw.Connector) {
	t.Helper()
	writer := fakeWriter(t)
	ir := &instanceReplica{r: protoReplica{replay: protoStart, status: "success"}, pos: map[string]string{}, cur: "fake", opened: map[int]string{}}
	srv := fakeServer(t, pgfake.Config{ServerVersion: "15.4", InHotStandby: "on", Handler: ir.handle, Pooled: pooled})
	db, c := openDSN(t, fmt.Sprintf("host=%s port=%d user=app password=secret dbname=app sslmode=disable connect_timeout=2 wait_timeout=30ms replicas=%s %s",
		writer.Host(), writer.Port(), srv.Addr(), strings.Join(extra, " ")))
	db.SetMaxOpenConns(1)
	return db, ir, srv, c
}

func readOnce(t *testing.T, db *sql.DB, what string) string {
	t.Helper()
	var v string
	if err := db.QueryRow(protoRead, 7).Scan(&v); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// An address that starts leading to another standby (a DNS name moved, a
// TCP balancer's target changed) while connections to the old one stay
// up: what the old one replayed, seen by the pool's read and by the
// monitor's connection, says nothing of the new one, whose connections
// check again, in every pooler mode. Without the instance binding the new
// connection's read skipped its check and returned the row as it was
// before the write; with pooler=none the instance was not read at all
// (recorded as zero on both connections, and zero matched zero).
func TestProtocolAddressLeadsToAnotherInstance(t *testing.T) {
	for _, mode := range []string{"auto", "none", "session", "transaction"} {
		t.Run("pooler="+mode, func(t *testing.T) {
			db, ir, srv, c := instanceCluster(t, false, "pooler="+mode)
			ir.set("A", protoLSN)
			ir.point(srv, "A")
			if _, err := db.Exec(protoInsert, 1); err != nil {
				t.Fatal(err)
			}
			if v := readOnce(t, db, "read on A"); v != "new" {
				t.Fatalf("read on A: %q, want the write's row", v)
			}
			// B has not replayed the write; new connections reach B.
			ir.set("B", protoBehind)
			ir.point(srv, "B")
			db.SetMaxIdleConns(0) // the pool's connection goes,
			db.SetMaxIdleConns(2)
			pgryw.CloseIdleReplicaConns(c) // and the replica connection to A it gave back
			if v := readOnce(t, db, "read on B"); v == "old" {
				t.Fatal("the read on the other instance skipped its check and returned the row before the write")
			}
			if n := ir.polls(srv, "B"); n == 0 {
				t.Error("no check reached instance B")
			}
		})
	}
}

// Behind a transaction pooler (the fake's identity answer names another
// backend than its startup did) the server behind one client connection
// can change at any transaction's end: its replay position may go down
// while the connection stays up. Every replica read carries its check.
func TestProtocolPooledReplicaChecksEveryRead(t *testing.T) {
	db, ir, srv, _ := instanceCluster(t, true)
	ir.set("fake", protoLSN)
	if _, err := db.Exec(protoInsert, 1); err != nil {
		t.Fatal(err)
	}
	if v := readOnce(t, db, "first read"); v != "new" {
		t.Fatalf("first read: %q, want the write's row", v)
	}
	ir.set("fake", protoBehind) // repointed: the same client connection now reaches a standby behind
	if v := readOnce(t, db, "second read"); v == "old" {
		t.Fatal("the second read skipped its check and returned the row before the write")
	}
	checks := 0
	for _, c := range srv.Conns() {
		for _, b := range c.Batches() {
			syncs, poll := 0, false
			for _, m := range b.Msgs {
				switch m := m.(type) {
				case *pgproto3.Parse:
					if strings.HasPrefix(m.Name, "pgryw_") {
						t.Errorf("a named statement of pgryw's behind a pooler: %q", m.Name)
					}
					poll = poll || m.Query == protoCheck
				case *pgproto3.Sync:
					syncs++
				}
			}
			if poll {
				checks++
				if syncs != 1 {
					t.Errorf("the check went with %d Syncs in its flush, want 1 (chained into the read's transaction): %v",
						syncs, pgfake.Summary(b, c.Label("pgryw_")))
				}
			}
		}
	}
	if checks < 2 {
		t.Errorf("%d checks reached the replica, want one per read", checks)
	}
}

// polls counts the replay polls that reached instance inst on connections
// that ran a read (the pool's).
func polls(srv *pgfake.Server, inst string) int {
	return (&instanceReplica{}).polls(srv, inst)
}

// polls is polls, for connections that reached inst by what ir saw of
// them (pooler=transaction asks no identity).
func (ir *instanceReplica) polls(srv *pgfake.Server, inst string) int {
	n := 0
	for _, c := range srv.Conns() {
		got := c.Instance()
		if got == "" {
			ir.mu.Lock()
			got = ir.opened[c.ID()]
			ir.mu.Unlock()
		}
		if got != inst {
			continue
		}
		for _, b := range c.Batches() {
			if (executes(c, b, protoCheck) || executes(c, b, protoPoll)) && !monitorPoll(b) {
				n++
			}
		}
	}
	return n
}

// With pooler=session (a pooler that keeps one server connection per
// client, and may rewrite named statements: PgBouncer ≥ 1.21 with
// max_prepared_statements) pgryw's session-state read-back, riding behind
// DEALLOCATE ALL and a SET, is an unnamed statement parsed in the same
// flush: nothing of it depends on a name prepared earlier, which the
// pooler may have dropped or renamed.
func TestProtocolSessionPoolerReadBackUnnamed(t *testing.T) {
	handle := func(c *pgfake.Conn, b pgfake.Batch) []pgproto3.BackendMessage {
		return c.Answer(b, func(q pgfake.Query) pgfake.Result {
			switch {
			case strings.HasPrefix(q.SQL, "SET "), strings.HasPrefix(q.SQL, "DEALLOCATE"):
				return pgfake.Result{Tag: strings.Fields(q.SQL)[0]}
			case strings.Contains(q.SQL, "pg_listening_channels"):
				return pgfake.Result{Cols: []pgfake.Column{{Name: "a", OID: 20}, {Name: "b", OID: 20}, {Name: "c", OID: 20}, {Name: "d", OID: 20}, {Name: "e", OID: 20}, {Name: "f", OID: 25}},
					Rows: [][][]byte{{[]byte("0"), []byte("0"), []byte("0"), []byte("0"), []byte("0"), []byte(`[["search_path","public"]]`)}}}
			}
			return pgfake.Result{Err: pgfake.Error("42601", "unexpected "+q.SQL)}
		})
	}
	writer := fakeServer(t, pgfake.Config{ServerVersion: "15.4", InHotStandby: "off", Handler: handle})
	r := &protoReplica{replay: protoStart, status: "success"}
	replica := fakeServer(t, pgfake.Config{ServerVersion: "15.4", InHotStandby: "on", Handler: r.handle})
	db, _ := openDSN(t, fmt.Sprintf("host=%s port=%d user=app password=secret dbname=app sslmode=disable connect_timeout=2 pooler=session replicas=%s",
		writer.Host(), writer.Port(), replica.Addr()))
	db.SetMaxOpenConns(1)
	for _, q := range []string{"DEALLOCATE ALL", "SET search_path = public", "SET search_path = public"} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	readBacks := 0
	for _, c := range writer.Conns() {
		for _, b := range c.Batches() {
			var parsed, bound bool
			for _, m := range b.Msgs {
				switch m := m.(type) {
				case *pgproto3.Parse:
					if strings.Contains(m.Query, "pg_listening_channels") {
						parsed = true
						readBacks++
						if m.Name != "" {
							t.Errorf("read-back prepared as %q behind a pooler", m.Name)
						}
					}
				case *pgproto3.Bind:
					if parsed && m.PreparedStatement != "" {
						t.Errorf("read-back bound to %q behind a pooler", m.PreparedStatement)
					}
					bound = bound || parsed
				}
			}
			if parsed && !bound {
				t.Errorf("read-back parsed without its Bind in the same flush: %v", pgfake.Summary(b, c.Label("pgryw_")))
			}
		}
	}
	if readBacks < 2 {
		t.Errorf("%d read-backs, want one behind each SET", readBacks)
	}
}
