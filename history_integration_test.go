package pgryw_test

// TestHistory is a randomized history checker for pgryw's session
// guarantees, in the spirit of Jepsen's Elle: concurrent sessions run a
// seeded mix of reads and writes of many shapes against the real primary and
// replicas while a fault goroutine pauses replay, stops replicas, adds apply
// delay, repoints a replica's address at the other standby while the
// connections it had live on, and cuts, resets and stalls connections
// (internal/faultnet under pgryw's wire layer); some reads run with a
// deadline shorter than wait_timeout. Every op is recorded; at the end the primary's rows,
// with their commit timestamps, are the ground truth the history is checked
// against: no duplicated effects, outcomes that match, read-your-writes,
// monotonic reads per connection, plausible values, DDL that does not
// break the reads after it, and reads that fall back rather than fail when
// the caller's deadline is shorter than the wait.
//
//	go test -run TestHistory -args -seed=N   # replay a schedule
//	PGRYW_HISTORY_OPS=20000 / PGRYW_HISTORY_DURATION=10m   # bigger runs (make check-long)
//	PGRYW_HISTORY_SEED=N            # same as -seed
//	PGRYW_HISTORY_DSN=read_your_writes=off   # extra DSN keys (that one must make it fail)
//	PGRYW_HISTORY_REPORTS=-1        # print every violation (default: 12 per property, all counted)

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/faultnet"
	"github.com/pgryw/pgryw/internal/pgtest"
)

var historySeed = flag.Int64("seed", 0, "TestHistory: seed of the op and fault schedule (0: $PGRYW_HISTORY_SEED, else random)")

const (
	histKeys     = 16
	histSessions = 6 // two on each pool: session_scope=conn, session_scope=db, and session_scope=conn over one replica
	// histMargin: an op whose outcome is unknown but that committed at Tc is
	// in a read's scope when Tc+histMargin <= the read's start. Tc is the
	// commit timestamp, taken before the commit record is written and the
	// transaction leaves the proc array: on a loaded two-core machine a
	// commit was seen still invisible to reads on the primary 54 ms after
	// it (seed 6827965806948319), so the margin is well past that.
	histMargin     = 250 * time.Millisecond
	histDefaultOps = 7000
	histOpTimeout  = 30 * time.Second // an op taking longer is reported as hung
	histMaxReports = 12               // violations printed per property
	histSideCols   = 1000             // ADD COLUMN up to this many, then ALTER COLUMN TYPE
	histHangDump   = 10 * time.Second // an op running this long gets the goroutines dumped
	// histWaitTimeout is every pool's wait_timeout. Some autocommit reads
	// run with a deadline of histShortMin..histShortMax, well below it:
	// with on_timeout=primary such a read must still be answered (by the
	// primary when the replicas are behind), as pgx on the primary would
	// answer it in a millisecond or two. histShortMin keeps the fallback's
	// share of the deadline (at least a fifth of it, plan.go's reserve)
	// far above a primary read on a loaded two-core machine under -race.
	histWaitTimeout = 2 * time.Second
	histShortMin    = 100 * time.Millisecond
	histShortMax    = 600 * time.Millisecond
	histShortPct    = 15 // of the autocommit reads that get no other deadline
	// histRestart: a replica stopped is taken to disturb reads until
	// this long after it was started again (a short-deadline read that
	// failed meanwhile is not judged).
	histRestart = time.Second
)

type histOutcome uint8

const (
	outOK        histOutcome = iota // returned without error
	outFail                         // definite failure: the shape says nothing committed
	outCommitErr                    // returned an error, but the shape says the write committed
	outIndet                        // unknown: context, connection or other errors
)

func (o histOutcome) String() string {
	return [...]string{"ok", "fail", "committed-with-error", "indeterminate"}[o]
}

type histWrite struct {
	id  int64
	k   int
	ret int64 // the new value the op returned (RETURNING), or -1
}

type histRead struct {
	ts   int64   // visibility time, unix µs: the statement's start, or its transaction's BEGIN
	at   int64   // the statement's start
	vals []int64 // by key; -1: not read
	port int     // inet_server_port() of the node that answered
	inRW bool    // inside a read-write transaction (on the primary)
	// served is pgryw's report of the statement (the watermark a replica
	// read answered to, whether a check rode with it, the wait), for the
	// description of a violation.
	served pgryw.ServedBy
}

type histOp struct {
	idx    int
	slot   int
	sess   int // *sql.Conn session; -1 for ops run on the *sql.DB
	pool   int
	kind   string
	detail string
	start  int64 // unix µs
	end    int64
	writes []histWrite
	reads  []histRead
	out    histOutcome
	err    error
	// Errors that are violations by themselves.
	ddlErr   error  // the read after a DDL statement failed
	readErr  error  // an autocommit read or a read-only BEGIN failed with a server error
	swallow  bool   // a string ending in SELECT 1/0 returned no error
	incompl  string // a whole-table read missed rows
	note     string // counted, not a violation
	faults   []string
	checkVal bool     // the conn must be checked (and dropped if broken) after the op
	armed    bool     // maybeFault armed a fault for this op
	met      bool     // a fault fired in one of the op's reads or writes (listed in faults)
	dialed   []string // the connections the op dialed, by node
	// dialedPrimary: one of them was to the primary.
	dialedPrimary bool
	// failServed is what pgryw reported of a read that then failed (zero:
	// nothing, it failed before choosing where to run).
	failServed pgryw.ServedBy
	// short is the op's deadline when it is below wait_timeout
	// (histShortMin..histShortMax), 0 otherwise; shortErr, the error of
	// an autocommit read under it that ended by the deadline (context
	// deadline exceeded, driver.ErrBadConn): with on_timeout=primary a
	// violation unless a fault may explain it (see check).
	short    time.Duration
	shortErr error
}

type histEvent struct {
	at   int64
	what string
}

type histPool struct {
	idx    int
	scope  string
	pooler string // the pooler DSN key, "" under PGRYW_PGBOUNCER
	db     *sql.DB
	c      *pgryw.Connector
	pgx    *pgryw.Pool // pgx's front end on the same DSN: the sessions in odd slots use it
	// idle: the servers' idle_session_timeout for this pool's
	// connections (its DSN's), 0 when none; its sessions' read-span ops
	// read for longer than it (see histIdleTimeouts).
	idle time.Duration
}

// histIdleTimeouts: one pool, by the seed, has the servers end its
// sessions after one of these of idleness (idle_session_timeout in its
// DSN, which reaches every node): its sessions' read-span ops read on
// replicas for longer than that, leaving their primary connection idle,
// and the write after finds it ended unless pgryw kept or replaced it. A
// 57P05 the caller sees is a violation (see check). Both are longer than
// pgryw's idleLook (100 ms) plus the longest stall the faults inject
// (205 ms): a connection used within idleLook, then stalled on the way to
// the server, is ended by a shorter one for the network's idleness, not
// the caller's. histIdleSpans bounds the spans per session, each about
// the timeout long: the run's ops are shared, so they cost its length
// little.
var histIdleTimeouts = []time.Duration{500 * time.Millisecond, 800 * time.Millisecond}

const histIdleSpans = 3

type histRun struct {
	// pgx: the sessions in odd slots, and their pools' ops, run through
	// pgx's front end (a Pool of their pool's DSN) rather than
	// database/sql; PGRYW_HISTORY_FRONT=sql runs every session on
	// database/sql.
	pgx      bool
	repoints atomic.Int64 // bouncer repoints (PGRYW_PGBOUNCER)
	// addrs are the replica addresses the pools are given: a
	// pgtest.SwitchProxy's in front of each of cluster.ReplicaAddrs()
	// (proxies), which faultLoop repoints at the other standby now and
	// then, or, under PGRYW_PGBOUNCER, the bouncers' (no proxies: the
	// bouncers are repointed instead).
	addrs        []string
	proxies      []*pgtest.SwitchProxy
	proxyRepoint atomic.Int64
	t            *testing.T
	seed         int64
	t0           int64
	kv, ops      string
	side         string
	pools        []*histPool
	nw           *faultnet.Network
	ports        map[int]string
	replicas     []uint16

	nextID   atomic.Int64
	nextSess atomic.Int64
	sideCol  atomic.Int64
	left     atomic.Int64 // ops left; math.MaxInt64-ish when only a duration bounds the run
	deadline time.Time

	sql struct {
		cte, cteRet, upd, updRet, ins, readAll, readOne, side string
	}

	dumped atomic.Bool

	heldMu sync.Mutex
	heldBy map[*faultnet.Conn]bool // primary connections under sessions' *sql.Conns

	evMu   sync.Mutex
	events []histEvent
	// unquiet are the spans (unix µs) in which a replica was stopped, up
	// to histRestart after it was started again: a short-deadline read
	// that failed within one is not judged.
	unquiet [][2]int64
	// bySession: the sessions by goroutine id, for OnFire to tell whose
	// op a fault fired in (histSession.fired).
	bySession sync.Map

	notes map[string]int // counted, logged, not failed
}

func (h *histRun) now() int64 { return time.Now().UnixMicro() }

func (h *histRun) rel(us int64) string {
	return fmt.Sprintf("%.1fms", float64(us-h.t0)/1000)
}

func (h *histRun) event(format string, args ...any) {
	h.evMu.Lock()
	h.events = append(h.events, histEvent{h.now(), fmt.Sprintf(format, args...)})
	h.evMu.Unlock()
}

// disturbed marks from..to (unix µs) as a span in which reads may be held
// up by a replica's restart.
func (h *histRun) disturbed(from, to int64) {
	h.evMu.Lock()
	h.unquiet = append(h.unquiet, [2]int64{from, to})
	h.evMu.Unlock()
}

// quiet reports whether no replica was stopped or restarting between from
// and to (unix µs).
func (h *histRun) quiet(from, to int64) bool {
	h.evMu.Lock()
	defer h.evMu.Unlock()
	for _, u := range h.unquiet {
		if u[0] <= to && u[1] >= from {
			return false
		}
	}
	return true
}

// wrap is the pools' net hook: faultnet's, and a note in the op of the
// session whose goroutine dialed (a connection's setup is in its time).
func (h *histRun) wrap(port uint16, nc net.Conn) net.Conn {
	if s, ok := h.bySession.Load(goid()); ok {
		if op := s.(*histSession).cur; op != nil {
			op.dialed = append(op.dialed, h.node(int(port)))
			op.dialedPrimary = op.dialedPrimary || !slices.Contains(h.replicas, port)
		}
	}
	return h.nw.Wrap(port, nc)
}

func (h *histRun) hold(c *faultnet.Conn, on bool) {
	if c == nil {
		return
	}
	h.heldMu.Lock()
	if on {
		h.heldBy[c] = true
	} else {
		delete(h.heldBy, c)
	}
	h.heldMu.Unlock()
}

func (h *histRun) held(c *faultnet.Conn) bool {
	h.heldMu.Lock()
	defer h.heldMu.Unlock()
	return h.heldBy[c]
}

// dumpHang writes every goroutine's stack to a file, once per run, when an
// op has been running for histHangDump.
func (h *histRun) dumpHang(op *histOp) {
	if !h.dumped.CompareAndSwap(false, true) {
		return
	}
	name := fmt.Sprintf("%s/history_hang_%d.txt", os.TempDir(), h.seed)
	f, err := os.Create(name)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "history: seed %d: slot %d session %d op %s started at %s, running for %v\n\n",
		h.seed, op.slot, op.sess, op.kind, h.rel(op.start), histHangDump)
	pprof.Lookup("goroutine").WriteTo(f, 2)
	h.event("slot %d: op running for %v; goroutines dumped to %s", op.slot, histHangDump, name)
}

func (h *histRun) more() bool {
	if !h.deadline.IsZero() && time.Now().After(h.deadline) {
		return false
	}
	return h.left.Add(-1) >= 0
}

func histSeedValue(t *testing.T) int64 {
	if *historySeed != 0 {
		return *historySeed
	}
	if s := os.Getenv("PGRYW_HISTORY_SEED"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("PGRYW_HISTORY_SEED=%q: %v", s, err)
		}
		return v
	}
	return rand.Int64N(1<<53) + 1
}

func TestHistory(t *testing.T) {
	pgtest.Require(t, cluster)
	seed := histSeedValue(t)
	fmt.Fprintf(os.Stderr, "history: seed %d\n", seed)
	t.Logf("history: seed %d", seed)

	h := &histRun{t: t, seed: seed, nw: faultnet.New(), notes: map[string]int{}, heldBy: map[*faultnet.Conn]bool{}, pgx: os.Getenv("PGRYW_HISTORY_FRONT") != "sql"}
	opsN := int64(histDefaultOps)
	if s := os.Getenv("PGRYW_HISTORY_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("PGRYW_HISTORY_DURATION=%q: %v", s, err)
		}
		h.deadline = time.Now().Add(d)
		opsN = 1 << 62
	}
	if s := os.Getenv("PGRYW_HISTORY_OPS"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			t.Fatalf("PGRYW_HISTORY_OPS=%q: want a positive integer", s)
		}
		opsN = n
	}
	h.left.Store(opsN)
	h.ports = map[int]string{cluster.Writer.Port: "primary"}
	h.addrs = cluster.ReplicaAddrs()
	if cluster.Bouncers() == nil {
		// A SwitchProxy in front of each replica address, so that
		// faultLoop can make the address pgryw knows as replica i lead to
		// replica j for new connections while the ones it had live on.
		h.addrs = nil
		h.proxies = replicaProxies(t)
		for _, p := range h.proxies {
			h.addrs = append(h.addrs, p.Addr())
		}
	}
	for i, r := range cluster.Replicas {
		h.ports[r.Port] = fmt.Sprintf("replica%d", i)
		// The port pgryw dials (the switch proxy's, or the WAIT FOR
		// emulation's proxy, or the bouncer's), which faultnet knows
		// connections by. A switch proxy's is named for the address: it
		// leads to another standby while repointed.
		h.ports[addrPort(cluster.ReplicaAddrs()[i])] = fmt.Sprintf("replica%d", i)
		p := addrPort(h.addrs[i])
		if h.proxies != nil {
			h.ports[p] = fmt.Sprintf("replica%d-addr", i)
		}
		h.replicas = append(h.replicas, uint16(p))
	}
	h.nw.OnFire = func(c *faultnet.Conn, k faultnet.Kind) {
		what := fmt.Sprintf("fired %s on %s conn %s", k, h.ports[int(c.Port())], c.LocalAddr())
		h.event("%s", what)
		// A fault fires in the read or write that meets it, on the
		// goroutine that makes it: a session's, when its op ran into it.
		if s, ok := h.bySession.Load(goid()); ok {
			s.(*histSession).fired(what)
		}
	}
	h.setup()
	t.Cleanup(h.heal)

	// Pools: session_scope=conn and db over every replica, and one over a
	// single replica (replica0), where no replay poll rides behind reads
	// (a connection's reads stay on one replica connection; see trailPolls).
	// One of them, by the seed, reads no position behind its writes
	// (capture=on_read): every read after a write covers it with a fresh
	// capture, the path a run of writes takes with capture=auto.
	// Each pool's pooler mode comes from the seed too: what a read learns
	// of a replica's replay is bound to the server instance a connection
	// reached, which each mode learns its own way (pooler=none with a
	// round trip of its own at connect). Every run has none, on a pool
	// that changes with the seed, and two of the other three.
	u := uint64(h.seed)
	poolers := []string{"auto", "session", "transaction"}
	poolers = append([]string{"none"}, slices.Delete(poolers, int(u%3), int(u%3)+1)...)
	for i, scope := range []string{"conn", "db", "conn1"} {
		extra := fmt.Sprintf("wait_timeout=%v&session_scope=%s", histWaitTimeout, strings.TrimSuffix(scope, "1"))
		if (h.seed+int64(i))%3 == 0 {
			extra += "&capture=on_read"
			t.Logf("history: pool %s with capture=on_read", scope)
		}
		var idle time.Duration
		if ((h.seed/3+int64(i))%3+3)%3 == 0 {
			idle = histIdleTimeouts[((h.seed/9)%2+2)%2]
			extra += fmt.Sprintf("&idle_session_timeout=%dms", idle.Milliseconds())
			t.Logf("history: pool %s with idle_session_timeout=%v", scope, idle)
		}
		x := os.Getenv("PGRYW_HISTORY_DSN")
		var pooler string
		if cluster.Bouncers() == nil && !strings.Contains(x, "pooler=") {
			pooler = poolers[(int(u/3%3)+i)%len(poolers)]
			extra += "&pooler=" + pooler
			t.Logf("history: pool %s with pooler=%s", scope, pooler)
		}
		if x != "" {
			extra += "&" + x // e.g. read_your_writes=off, to see the checker fail
		}
		replicas := strings.Join(h.addrs, ",")
		if scope == "conn1" {
			replicas = h.addrs[0]
		}
		dsn := cluster.WriterDSN() + "&replicas=" + replicas + "&" + extra
		db, c := openDSN(t, dsn)
		pgryw.SetNetHook(c, h.wrap)
		db.SetMaxIdleConns(histSessions * 2)
		hp := &histPool{idx: i, scope: scope, pooler: pooler, db: db, c: c, idle: idle}
		if h.pgx {
			hp.pgx = openHistPool(t, h, dsn)
		}
		h.pools = append(h.pools, hp)
	}

	h.t0 = h.now()
	start := time.Now()
	stop := make(chan struct{})
	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
		h.faultLoop(rand.New(rand.NewPCG(uint64(seed), 1<<32)), stop)
	}()
	var wg sync.WaitGroup
	sessions := make([]*histSession, histSessions)
	for slot := range sessions {
		s := &histSession{h: h, slot: slot, pool: h.pools[slot*len(h.pools)/histSessions],
			rng: rand.New(rand.NewPCG(uint64(seed), uint64(slot)))}
		sessions[slot] = s
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.run()
		}()
	}
	wg.Wait()
	close(stop)
	<-faultsDone
	elapsed := time.Since(start)
	h.nw.DisarmAll()
	h.heal()

	var all []*histOp
	for _, s := range sessions {
		all = append(all, s.ops...)
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].start < all[j].start })
	for i, op := range all {
		op.idx = i
	}
	truth := h.groundTruth()
	h.summary(all, elapsed)
	h.check(all, truth)
}

// addrPort returns the port of a "host:port".
func addrPort(addr string) int {
	_, port, _ := strings.Cut(addr, ":")
	p, _ := strconv.Atoi(port)
	return p
}

// setup creates the run's tables on the primary and waits for the replicas.
func (h *histRun) setup() {
	t := h.t
	suffix := fmt.Sprintf("%d_%d", os.Getpid(), tableSeq.Add(1))
	h.kv, h.ops, h.side = "hist_kv_"+suffix, "hist_ops_"+suffix, "hist_side_"+suffix
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, cluster.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		fmt.Sprintf("CREATE TABLE %s (k int PRIMARY KEY, v bigint NOT NULL)", h.kv),
		fmt.Sprintf("INSERT INTO %s SELECT g, 0 FROM generate_series(0, %d) g", h.kv, histKeys-1),
		fmt.Sprintf("CREATE TABLE %s (op_id bigint NOT NULL, k int NOT NULL)", h.ops),
		fmt.Sprintf("CREATE TABLE %s (id int PRIMARY KEY)", h.side),
		fmt.Sprintf("INSERT INTO %s VALUES (1)", h.side),
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var on string
	if err := conn.QueryRow(ctx, "SHOW track_commit_timestamp").Scan(&on); err != nil || on != "on" {
		t.Fatalf("track_commit_timestamp is %q (%v): the checker needs commit timestamps", on, err)
	}
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	s := &h.sql
	s.cte = fmt.Sprintf("WITH u AS (UPDATE %s SET v = v + 1 WHERE k = $1 RETURNING v) INSERT INTO %s SELECT $2::bigint, $1::int FROM u", h.kv, h.ops)
	s.cteRet = s.cte + " RETURNING (SELECT v FROM u)"
	s.upd = fmt.Sprintf("UPDATE %s SET v = v + 1 WHERE k = $1", h.kv)
	s.updRet = s.upd + " RETURNING v"
	s.ins = fmt.Sprintf("INSERT INTO %s VALUES ($1, $2)", h.ops)
	s.readAll = fmt.Sprintf("SELECT k, v, "+nodePort+" FROM %s", h.kv)
	s.readOne = fmt.Sprintf("SELECT v, "+nodePort+" FROM %s WHERE k = $1", h.kv)
	s.side = fmt.Sprintf("SELECT * FROM %s WHERE id = $1", h.side)
}

// heal undoes every cluster fault: replay resumed, replicas started, no
// apply delay, replicas caught up.
func (h *histRun) heal() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := range cluster.Replicas {
		if err := cluster.StartNode(i); err != nil {
			h.t.Errorf("history: heal: %v", err)
		}
		if err := cluster.ResumeReplay(ctx, i); err != nil {
			h.t.Errorf("history: heal: %v", err)
		}
	}
	if err := cluster.SetApplyDelay(ctx, -1, 0); err != nil {
		h.t.Errorf("history: heal: %v", err)
	}
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		h.t.Errorf("history: heal: %v", err)
	}
}

// faultLoop injects cluster and network faults until stop is closed. Each
// action completes before the next starts, so a paused replica is never
// stopped and apply delays are never set on a stopped one.
func (h *histRun) faultLoop(rng *rand.Rand, stop <-chan struct{}) {
	ctx := context.Background()
	sleep := func(d time.Duration) bool {
		select {
		case <-stop:
			return false
		case <-time.After(d):
			return true
		}
	}
	dur := func(lo, hi int) time.Duration { return time.Duration(lo+rng.IntN(hi-lo+1)) * time.Millisecond }
	// Through bouncers (PGRYW_PGBOUNCER), one of them is sometimes
	// repointed at the other standby for a while, as an operator's RELOAD:
	// the address pgryw knows as replica i then leads to replica j.
	bouncers := cluster.Bouncers()
	var targets []string
	for _, b := range bouncers {
		targets = append(targets, b.Target())
	}
	for sleep(dur(100, 600)) {
		i := rng.IntN(len(cluster.Replicas))
		if len(bouncers) > len(cluster.Replicas) && len(cluster.Replicas) > 1 && rng.IntN(100) < 12 {
			j := (i + 1) % len(cluster.Replicas)
			d := dur(200, 1500)
			h.event("repoint replica%d's bouncer at replica%d for %v", i, j, d)
			h.repoints.Add(1)
			if err := bouncers[i+1].Repoint(targets[j+1]); err != nil {
				h.event("repoint: %v", err)
			}
			sleep(d)
			if err := bouncers[i+1].Repoint(targets[i+1]); err != nil {
				h.event("repoint back: %v", err)
			}
			h.event("repointed replica%d's bouncer back", i)
			continue
		}
		// pause pauses replay on replica i for d; with repoint, the other
		// replica's address leads to it meanwhile: behind what the other
		// replica, which that address's old connections reach, is seen
		// to have replayed.
		pause := func(i int, d time.Duration, repoint bool) {
			h.event("pause replay on replica%d for %v", i, d)
			if err := cluster.PauseReplay(ctx, i); err != nil {
				h.event("pause replica%d: %v", i, err)
			}
			back := func() {}
			if repoint {
				back = h.repointAddr(rng, (i+1)%len(h.proxies), i, d, " (paused)")
			}
			sleep(d)
			back()
			if err := cluster.ResumeReplay(ctx, i); err != nil {
				h.event("resume replica%d: %v", i, err)
			}
			h.event("resumed replay on replica%d", i)
		}
		switch x := rng.IntN(100); {
		case x < 18:
			pause(i, dur(200, 1500), len(h.proxies) > 1 && rng.IntN(3) < histPauseRepoint)
		case x < 26:
			d := dur(200, 1000)
			h.event("stop replica%d for %v", i, d)
			stopped := h.now()
			if err := cluster.StopNode(i); err != nil {
				h.event("stop replica%d: %v", i, err)
			}
			sleep(d)
			if err := cluster.StartNode(i); err != nil {
				h.event("start replica%d: %v", i, err)
			}
			h.event("started replica%d", i)
			h.disturbed(stopped, h.now()+histRestart.Microseconds())
		case x < 40:
			var d time.Duration
			if rng.IntN(5) >= 2 {
				d = dur(20, 50)
			}
			h.event("apply delay %v on all replicas", d)
			if err := cluster.SetApplyDelay(ctx, -1, d); err != nil {
				h.event("apply delay: %v", err)
			}
		case x < 50:
			d := dur(20, 400)
			n := h.nw.ArmAll(uint16(cluster.Writer.Port), faultnet.Fault{Kind: faultnet.Stall, Delay: d})
			h.event("primary stalled %v (%d conns)", d, n)
		case x < 58:
			port := h.replicas[i]
			n := h.nw.ArmAll(port, faultnet.Fault{Kind: faultnet.Stall, Delay: dur(20, 400)})
			h.event("replica%d stalled (%d conns)", i, n)
		default:
			f := randomFault(rng)
			cs := h.nw.Conns(0)
			sort.Slice(cs, func(a, b int) bool { return cs[a].LocalAddr().String() < cs[b].LocalAddr().String() })
			if len(cs) == 0 {
				continue
			}
			c := cs[rng.IntN(len(cs))]
			if rng.IntN(4) == 0 {
				h.event("reset %s conn %s", h.ports[int(c.Port())], c.LocalAddr())
				c.Reset()
				continue
			}
			c.Arm(f)
			h.event("armed %s on %s conn %s", faultString(f), h.ports[int(c.Port())], c.LocalAddr())
		}
	}
}

// histPauseRepoint: during this many in three of faultLoop's pauses of
// replay, the other replica's address is repointed at the paused one (the
// paused replica's own address still sees a plain pause), so that a read
// on a new connection there that skips its check misses the session's
// writes. A default run has some fifteen to twenty actions, three or four
// of them pauses, and one such repoint found class 2's defect (a read on a
// connection to the other standby spared its check) about half the time
// in a run's pool with pooler=none: with two in three, half the runs of
// the broken build passed. Riding on the pauses keeps the run time near
// where it was; repoints with 200-1500 ms pauses of their own, at 30% of
// the actions, made reads wait for replay and runs up to twice as long,
// and at 10% with 200-600 ms pauses, some 60% longer.
const histPauseRepoint = 3

// repointAddr makes the address pgryw knows as replica i lead to replica j
// (a DNS name moved, a balancer's target changed) while the connections it
// had live on, until the returned func leads it back: what pgryw learned
// of the node's replay through an old connection (to replica i) says
// nothing of a new one (to replica j), which must check. About half the
// connections to the address are reset, so that new ones are dialed while
// the rest live on (otherwise new replica connections come only with the
// run's churn; the address's connections belong to six connectors, and
// class 2's defect showed only in a pooler=none pool's). The connections
// opened meanwhile stay on replica j after the address leads back.
func (h *histRun) repointAddr(rng *rand.Rand, i, j int, d time.Duration, why string) (back func()) {
	h.proxyRepoint.Add(1)
	h.proxies[i].Repoint(cluster.ReplicaAddrs()[j])
	cs := h.nw.Conns(h.replicas[i])
	sort.Slice(cs, func(a, b int) bool { return cs[a].LocalAddr().String() < cs[b].LocalAddr().String() })
	n := 0
	for _, c := range cs {
		if rng.IntN(2) == 0 {
			c.Reset()
			n++
		}
	}
	h.event("repoint replica%d's address at replica%d%s for %v, %d of its %d conns reset", i, j, why, d, n, len(cs))
	return func() {
		h.proxies[i].Repoint(cluster.ReplicaAddrs()[i])
		h.event("repointed replica%d's address back", i)
	}
}

func randomFault(rng *rand.Rand) faultnet.Fault {
	switch rng.IntN(4) {
	case 0:
		return faultnet.Fault{Kind: faultnet.CutWrite, After: rng.IntN(320)}
	case 1:
		return faultnet.Fault{Kind: faultnet.CutRead, After: rng.IntN(480)}
	case 2:
		return faultnet.Fault{Kind: faultnet.Reset}
	}
	return faultnet.Fault{Kind: faultnet.Stall, Delay: time.Duration(5+rng.IntN(200)) * time.Millisecond}
}

func faultString(f faultnet.Fault) string {
	switch f.Kind {
	case faultnet.CutWrite, faultnet.CutRead:
		return fmt.Sprintf("%s@%d", f.Kind, f.After)
	case faultnet.Stall:
		return fmt.Sprintf("stall %v", f.Delay)
	}
	return f.Kind.String()
}

// histSession is one worker: it holds a *sql.Conn; when that connection
// breaks it takes another and becomes a new session.
type histSession struct {
	h     *histRun
	slot  int
	pool  *histPool
	rng   *rand.Rand
	conn  histConn
	wconn *faultnet.Conn // under the session's primary connection, if found
	id    int
	ops   []*histOp
	// readNext: the previous op wrote; bias the next one to a read.
	readNext bool
	spans    int // read-span ops run (histIdleSpans)
	// cur is the op running (nil between ops), for fired: touched only
	// on the session's goroutine.
	cur *histOp
}

// fired records, on the session's goroutine, that a fault fired in a read
// or write it made: the op it ran then met a fault of its own.
func (s *histSession) fired(what string) {
	if op := s.cur; op != nil {
		op.met = true
		op.faults = append(op.faults, what)
	}
}

// goid returns the calling goroutine's id, from the first line of its
// stack ("goroutine 123 [running]:"). Only OnFire and the sessions call
// it: it tells which session's op a fault fired in, where a time window
// would blame every op that ran meanwhile (faults fire tens of times a
// second).
func goid() uint64 {
	var buf [64]byte
	b := bytes.TrimPrefix(buf[:runtime.Stack(buf[:], false)], []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	n, _ := strconv.ParseUint(string(b), 10, 64)
	return n
}

func (s *histSession) run() {
	id := goid()
	s.h.bySession.Store(id, s)
	defer s.h.bySession.Delete(id)
	for s.h.more() {
		if s.conn == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			c, err := s.newConn(ctx)
			cancel()
			if err != nil {
				s.h.event("slot %d: new conn: %v", s.slot, err)
				time.Sleep(20 * time.Millisecond)
				continue
			}
			s.conn, s.id = c, int(s.h.nextSess.Add(1))
			s.findPrimaryConn()
		}
		s.step()
	}
	if s.conn != nil {
		s.h.hold(s.wconn, false)
		s.conn.close()
	}
}

// drop discards the session's connection (database/sql closes it) and ends
// the session.
func (s *histSession) drop() {
	s.h.hold(s.wconn, false)
	s.wconn = nil
	s.conn.drop()
	s.conn = nil
}

// valid reports whether the session's connection still works, as far as
// pgryw says (its primary connection is open).
func (s *histSession) valid() bool { return s.conn.valid() }

// findPrimaryConn finds the faultnet connection under the session's primary
// connection: the primary reports the client port (a primary read, so it runs
// once, when the session starts).
func (s *histSession) findPrimaryConn() {
	s.wconn = nil
	ctx, cancel := context.WithTimeout(pgryw.WithPrimary(context.Background()), 5*time.Second)
	defer cancel()
	var port int
	if err := s.conn.queryRow(ctx, "SELECT inet_client_port()").Scan(&port); err != nil {
		return
	}
	s.wconn = s.h.nw.Lookup(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
	s.h.hold(s.wconn, true)
}

// opCtx returns the op's context: usually just a safety timeout, sometimes a
// short deadline or a cancellation part-way; for an autocommit read
// (shortKinds), sometimes a deadline below wait_timeout but far above what
// a primary read takes (op.short).
func (s *histSession) opCtx(op *histOp) (context.Context, context.CancelFunc) {
	x := s.rng.IntN(100)
	d := time.Duration(1+s.rng.IntN(30)) * time.Millisecond
	base, cancel := context.WithTimeout(context.Background(), histOpTimeout)
	switch {
	case x < 4:
		op.faults = append(op.faults, fmt.Sprintf("deadline %v", d))
		ctx, c2 := context.WithTimeout(base, d)
		return ctx, func() { c2(); cancel() }
	case x < 7:
		op.faults = append(op.faults, fmt.Sprintf("cancel after %v", d))
		ctx, c2 := context.WithCancel(base)
		tm := time.AfterFunc(d, c2)
		return ctx, func() { tm.Stop(); c2(); cancel() }
	}
	if shortKinds[op.kind] && s.rng.IntN(100) < histShortPct {
		span := int64(histShortMax-histShortMin) / int64(time.Millisecond)
		op.short = histShortMin + time.Duration(s.rng.Int64N(span+1))*time.Millisecond
		op.faults = append(op.faults, fmt.Sprintf("deadline %v < wait_timeout", op.short))
		ctx, c2 := context.WithTimeout(base, op.short)
		return ctx, func() { c2(); cancel() }
	}
	return base, cancel
}

// shortKinds are the ops that may run with a deadline below wait_timeout:
// one autocommit read each, on the session's connection (a *sql.Conn or a
// *pgryw.PoolConn) or on its pool (a *sql.DB or a *pgryw.Pool).
var shortKinds = map[string]bool{"read-all": true, "read-one": true, "pool-read": true}

// maybeFault arms, with a small probability, a fault on the session's
// primary connection or on a replica connection.
func (s *histSession) maybeFault(op *histOp) {
	x := s.rng.IntN(1000)
	f := randomFault(s.rng)
	pick := s.rng.IntN(1 << 30)
	if strings.HasPrefix(op.kind, "pool-") {
		// The op runs on whatever connection the pool hands out: arm the
		// primary connections no session holds.
		if x < 100 {
			n := 0
			for _, c := range s.h.nw.Conns(uint16(cluster.Writer.Port)) {
				if !s.h.held(c) {
					c.Arm(f)
					n++
				}
			}
			op.armed = true
			op.faults = append(op.faults, fmt.Sprintf("%d pooled primary conns %s", n, faultString(f)))
		}
		return
	}
	switch {
	case x < 25:
		if c := s.wconn; c != nil {
			c.Arm(f)
			op.armed = true
			op.faults = append(op.faults, "primary "+faultString(f))
		}
	case x < 40:
		var cs []*faultnet.Conn
		for _, p := range s.h.replicas {
			cs = append(cs, s.h.nw.Conns(p)...)
		}
		if len(cs) > 0 {
			sort.Slice(cs, func(a, b int) bool { return cs[a].LocalAddr().String() < cs[b].LocalAddr().String() })
			c := cs[pick%len(cs)]
			c.Arm(f)
			op.armed = true
			op.faults = append(op.faults, s.h.ports[int(c.Port())]+" "+faultString(f))
		}
	}
}

var histKinds = []struct {
	name   string
	weight int
	read   bool
}{
	{"read-all", 14, true},
	{"read-one", 10, true},
	{"read-tx", 8, true},
	{"w-exec", 8, false},
	{"w-returning", 7, false},
	{"w-prepared", 6, false},
	{"w-block", 7, false},
	{"w-multi-fail", 3, false},
	{"w-multi-commit-fail", 4, false},
	{"w-multi-begin-commit-fail", 4, false},
	{"w-multi-ok", 3, false},
	{"w-tx", 10, false},
	{"ddl", 2, false},
	{"side-read", 3, true},
	{"pool-write", 3, false},
	{"pool-read", 3, true},
	{"pool-commit-fail", 1, false},
	// pgx's batches (database/sql's sessions run their statements one by
	// one): two reads in one batch, and a write in one.
	{"read-batch", 4, true},
	{"w-batch", 3, false},
	// Reads alone for longer than the pool's idle_session_timeout (a
	// read-one elsewhere): the session's primary connection sits idle.
	{"read-span", 2, true},
}

func (s *histSession) pickKind() string {
	total, readTotal := 0, 0
	for _, k := range histKinds {
		total += k.weight
		if k.read {
			readTotal += k.weight
		}
	}
	onlyReads := s.readNext && s.rng.IntN(2) == 0
	if onlyReads {
		total = readTotal
	}
	x := s.rng.IntN(total)
	for _, k := range histKinds {
		if onlyReads && !k.read {
			continue
		}
		if x < k.weight {
			return k.name
		}
		x -= k.weight
	}
	panic("unreachable")
}

func (s *histSession) step() {
	h := s.h
	op := &histOp{slot: s.slot, sess: s.id, pool: s.pool.idx}
	op.kind = s.pickKind()
	ctx, cancel := s.opCtx(op)
	s.maybeFault(op)
	op.start = h.now()
	s.cur = op
	watchdog := time.AfterFunc(histHangDump, func() { h.dumpHang(op) })
	switch op.kind {
	case "read-all":
		s.readAll(ctx, op, s.conn, op.start, false)
	case "read-one":
		s.readOne(ctx, op, s.conn, s.rng.IntN(histKeys), op.start, false)
	case "read-span":
		s.readSpan(ctx, op)
	case "read-tx":
		s.readTx(ctx, op)
	case "w-exec", "w-returning", "w-prepared":
		s.writeSingle(ctx, op)
	case "w-block":
		s.writeBlock(ctx, op)
	case "w-multi-fail", "w-multi-commit-fail", "w-multi-begin-commit-fail", "w-multi-ok", "pool-commit-fail":
		s.writeMulti(ctx, op)
	case "w-tx":
		s.writeTx(ctx, op)
	case "ddl", "side-read":
		s.ddl(ctx, op)
	case "pool-write":
		op.sess = -1
		s.writeSingle(ctx, op)
	case "pool-read":
		op.sess = -1
		s.readAll(ctx, op, s.poolQ(), op.start, false)
	case "read-batch":
		s.readBatch(ctx, op)
	case "w-batch":
		s.writeSingle(ctx, op)
	}
	op.end = h.now()
	s.cur = nil
	watchdog.Stop()
	ctxDone := ctx.Err() != nil
	timedOut := ctxDone && time.Duration(op.end-op.start)*time.Microsecond >= histOpTimeout
	cancel()
	if timedOut {
		op.err = fmt.Errorf("hung for %v, then returned %v", histOpTimeout, op.err)
	}
	s.ops = append(s.ops, op)
	s.readNext = len(op.writes) > 0
	if s.conn == nil {
		return
	}
	if (op.kind == "w-tx" || op.kind == "read-tx") && (ctxDone || op.err != nil) {
		// database/sql rolls a transaction whose context ends back from
		// its own goroutine, racing the next statement on the *sql.Conn
		// (plain pgx shows the same): that statement may run inside the
		// dying transaction. Start over with a new session instead.
		s.drop()
		return
	}
	if op.err != nil || op.checkVal {
		if !s.valid() {
			s.drop()
			return
		}
	}
	if s.rng.IntN(200) == 0 {
		s.drop() // retire: a fresh session now and then
	}
}

// readAll reads the whole kv table.
func (s *histSession) readAll(ctx context.Context, op *histOp, q histQ, ts int64, inRW bool) bool {
	at := s.h.now()
	var served pgryw.ServedBy
	ctx = pgryw.WithServedBy(ctx, func(_ context.Context, sb pgryw.ServedBy) { served = sb })
	rows, err := q.query(ctx, s.h.sql.readAll)
	if err != nil {
		op.failServed = served
		s.readFailed(ctx, op, err, !inRW && op.kind != "read-tx")
		return false
	}
	r := histRead{ts: ts, at: at, vals: make([]int64, histKeys), inRW: inRW, served: served}
	for i := range r.vals {
		r.vals[i] = -1
	}
	n, got := 0, 0
	for rows.Next() {
		got++
		var k, port int
		var v int64
		if err := rows.Scan(&k, &v, &port); err != nil {
			rows.Close()
			s.readFailed(ctx, op, err, false)
			return false
		}
		if k >= 0 && k < histKeys {
			r.vals[k] = v
			n++
		}
		r.port = port
	}
	err = rows.Err()
	rows.Close()
	if err != nil {
		if got > 0 {
			// docs/guarantees.md: once rows have reached the caller, a replica dying
			// before the end of the result fails the read. A backend
			// terminated (57P01) while it scans sends the rows it has and
			// its FATAL in one flush, after pgx has handed over the first.
			op.note = "read failed after rows reached the caller"
			op.detail += fmt.Sprintf(" [error after %d rows]", got)
			s.readFailed(ctx, op, err, false)
			return false
		}
		s.readFailed(ctx, op, err, !inRW && op.kind != "read-tx")
		return false
	}
	if n != histKeys {
		op.incompl = fmt.Sprintf("%d of %d rows", n, histKeys)
	}
	op.reads = append(op.reads, r)
	return true
}

func (s *histSession) readOne(ctx context.Context, op *histOp, q histQ, k int, ts int64, inRW bool) bool {
	at := s.h.now()
	var v int64
	var port int
	var served pgryw.ServedBy
	ctx = pgryw.WithServedBy(ctx, func(_ context.Context, sb pgryw.ServedBy) { served = sb })
	err := q.queryRow(ctx, s.h.sql.readOne, k).Scan(&v, &port)
	if err != nil {
		op.failServed = served
		s.readFailed(ctx, op, err, !inRW)
		return false
	}
	r := histRead{ts: ts, at: at, vals: make([]int64, histKeys), port: port, inRW: inRW, served: served}
	for i := range r.vals {
		r.vals[i] = -1
	}
	r.vals[k] = v
	op.reads = append(op.reads, r)
	return true
}

// readSpan reads one key at a time, every 100 ms, for longer than the
// pool's idle_session_timeout: pgx on the primary would use its one
// connection all along; pgryw's reads go to replicas and leave the
// session's primary connection idle. Without a timeout, or once the
// session has had its spans, it is one read-one.
func (s *histSession) readSpan(ctx context.Context, op *histOp) {
	idle := s.pool.idle
	if idle == 0 || s.spans >= histIdleSpans {
		s.readOne(ctx, op, s.conn, s.rng.IntN(histKeys), op.start, false)
		return
	}
	s.spans++
	op.detail = fmt.Sprintf("reads for %v", idle+200*time.Millisecond)
	for start := time.Now(); ; {
		if !s.readOne(ctx, op, s.conn, s.rng.IntN(histKeys), s.h.now(), false) {
			return
		}
		if time.Since(start) >= idle+200*time.Millisecond {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// readBatch reads two keys: through pgx's front end in one batch (one
// replica read, one wait), through database/sql one after the other.
func (s *histSession) readBatch(ctx context.Context, op *histOp) {
	keys := []int{s.rng.IntN(histKeys), s.rng.IntN(histKeys)}
	at := s.h.now()
	var served pgryw.ServedBy
	ctx = pgryw.WithServedBy(ctx, func(_ context.Context, sb pgryw.ServedBy) { served = sb })
	reads := make([]histRead, len(keys))
	err := s.conn.batchRead(ctx, s.h.sql.readOne, keys, func(i int, row histRow) error {
		r := histRead{ts: at, at: at, vals: make([]int64, histKeys)}
		for k := range r.vals {
			r.vals[k] = -1
		}
		var v int64
		if err := row.Scan(&v, &r.port); err != nil {
			return err
		}
		r.vals[keys[i]] = v
		reads[i] = r
		return nil
	})
	if err != nil {
		s.readFailed(ctx, op, err, true)
		return
	}
	for _, r := range reads {
		r.served = served
		op.reads = append(op.reads, r)
	}
}

// readFailed records a failed read. A server error on an autocommit read
// (or a read-only BEGIN) that the caller did not cause by cancelling is a
// violation of "failures fall back, not through", except the errors a
// replica may legitimately return (recovery conflict, statement cancelled).
//
// An autocommit read under a deadline below wait_timeout (op.short) that
// ended by that deadline, with context deadline exceeded or
// driver.ErrBadConn (database/sql's word for a *sql.Conn whose statement
// was cut short), is kept in op.shortErr: on_timeout=primary promises the
// primary's answer, which pgx gives in a millisecond or two.
func (s *histSession) readFailed(ctx context.Context, op *histOp, err error, autocommit bool) {
	if op.err == nil {
		op.err = err
	}
	op.out = outIndet
	if autocommit && op.short > 0 && errors.Is(ctx.Err(), context.DeadlineExceeded) &&
		(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, driver.ErrBadConn)) {
		op.shortErr = err
	}
	if !autocommit || ctx.Err() != nil {
		return
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code != "57014" && !(pe.Code == "40001" && strings.Contains(pe.Message, "recovery")) {
		op.readErr = err
	}
}

var roLevels = []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable}

func (s *histSession) readTx(ctx context.Context, op *histOp) {
	lvl := roLevels[s.rng.IntN(len(roLevels))]
	twice := s.rng.IntN(3) == 0
	op.detail = fmt.Sprintf("read-only %v", lvl)
	ts := s.h.now()
	tx, err := s.conn.begin(ctx, sql.TxOptions{ReadOnly: true, Isolation: lvl})
	if err != nil {
		s.readFailed(ctx, op, err, true)
		return
	}
	ok := s.readAll(ctx, op, tx, ts, false)
	if ok && twice {
		ok = s.readAll(ctx, op, tx, ts, false)
	}
	if !ok {
		tx.rollback()
		return
	}
	if err := tx.commit(); err != nil {
		op.err, op.out = err, outIndet
	}
}

// writeOutcome classifies an autocommit statement's error.
func writeOutcome(ctx context.Context, err error) histOutcome {
	if err == nil {
		return outOK
	}
	var pe *pgconn.PgError
	if ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		!errors.As(err, &pe) || pe.Severity == "FATAL" || pe.Severity == "PANIC" {
		return outIndet
	}
	return outFail
}

func (s *histSession) writeSingle(ctx context.Context, op *histOp) {
	h := s.h
	k := s.rng.IntN(histKeys)
	id := h.nextID.Add(1)
	w := histWrite{id: id, k: k, ret: -1}
	var err error
	switch op.kind {
	case "w-exec":
		err = s.conn.exec(ctx, h.sql.cte, k, id)
	case "w-batch":
		err = s.conn.batchExec(ctx, h.sql.cte, k, id)
	case "pool-write":
		err = s.poolQ().exec(ctx, h.sql.cte, k, id)
	case "w-returning":
		err = s.conn.queryRow(ctx, h.sql.cteRet, k, id).Scan(&w.ret)
	case "w-prepared":
		ret := s.rng.IntN(3) == 0
		q := h.sql.cte
		if ret {
			q = h.sql.cteRet
			op.detail = "RETURNING"
		}
		var st histStmt
		st, err = s.conn.prepare(ctx, q)
		if err == nil {
			if ret {
				err = st.queryRow(ctx, k, id).Scan(&w.ret)
			} else {
				err = st.exec(ctx, k, id)
			}
			st.close()
		}
	}
	op.writes = []histWrite{w}
	op.err = err
	op.out = writeOutcome(ctx, err)
	if op.out != outOK {
		w.ret = -1
		op.writes[0].ret = -1
	}
}

// rollback ends an Exec'd block that will not commit; if even that fails
// the session's connection is checked.
func (s *histSession) rollback(op *histOp) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.conn.exec(ctx, "ROLLBACK"); err != nil {
		// The block's state is unknown: start over with a new session.
		s.drop()
	}
}

func (s *histSession) writeBlock(ctx context.Context, op *histOp) {
	h := s.h
	k := s.rng.IntN(histKeys)
	id := h.nextID.Add(1)
	rr := s.rng.IntN(4) == 0
	retUpd := s.rng.IntN(2) == 0
	commit := s.rng.IntN(5) != 0
	steps := []string{"BEGIN"}
	if rr {
		steps = []string{"BEGIN ISOLATION LEVEL REPEATABLE READ", "SET LOCAL statement_timeout = '5s'"}
	}
	op.detail = strings.Join(steps, "; ")
	op.writes = []histWrite{{id: id, k: k, ret: -1}}
	fail := func(err error) {
		op.err, op.out = err, outFail // COMMIT never sent: nothing can commit
		s.rollback(op)
	}
	for _, q := range steps {
		if err := s.conn.exec(ctx, q); err != nil {
			fail(err)
			return
		}
	}
	var ret int64 = -1
	var err error
	if retUpd {
		err = s.conn.queryRow(ctx, h.sql.updRet, k).Scan(&ret)
	} else {
		err = s.conn.exec(ctx, h.sql.upd, k)
	}
	if err != nil {
		fail(err)
		return
	}
	if err := s.conn.exec(ctx, h.sql.ins, id, k); err != nil {
		fail(err)
		return
	}
	if !commit {
		op.detail += "; ROLLBACK"
		op.out = outFail
		s.rollback(op)
		return
	}
	op.detail += "; COMMIT"
	err = s.conn.exec(ctx, "COMMIT")
	op.err = err
	op.out = writeOutcome(ctx, err)
	if op.out == outOK {
		op.writes[0].ret = ret
	} else if s.valid() {
		// COMMIT may not have been sent (a context done before it): make
		// sure no block stays open; after a commit ROLLBACK does nothing.
		s.rollback(op)
	}
}

func (s *histSession) writeMulti(ctx context.Context, op *histOp) {
	h := s.h
	k := s.rng.IntN(histKeys)
	id := h.nextID.Add(1)
	upd := fmt.Sprintf("UPDATE %s SET v = v + 1 WHERE k = %d", h.kv, k)
	ins := fmt.Sprintf("INSERT INTO %s VALUES (%d, %d)", h.ops, id, k)
	var q string
	committed, wantErr := false, true
	switch op.kind {
	case "w-multi-fail":
		q = upd + "; " + ins + "; SELECT 1/0"
	case "w-multi-commit-fail", "pool-commit-fail":
		q = upd + "; " + ins + "; COMMIT; SELECT 1/0"
		committed = true
	case "w-multi-begin-commit-fail":
		q = "BEGIN; " + upd + "; " + ins + "; COMMIT; SELECT 1/0"
		committed = true
	case "w-multi-ok":
		wantErr = false
		if s.rng.IntN(2) == 0 {
			q = "BEGIN; " + upd + "; " + ins + "; COMMIT"
		} else {
			q = upd + "; " + ins
		}
	}
	op.detail = q
	op.writes = []histWrite{{id: id, k: k, ret: -1}}
	var err error
	if op.kind == "pool-commit-fail" {
		op.sess = -1
		err = s.poolQ().exec(ctx, q)
	} else {
		err = s.conn.exec(ctx, q)
	}
	op.err = err
	var pe *pgconn.PgError
	switch {
	case err == nil:
		op.out = outOK
		op.swallow = wantErr
	case ctx.Err() == nil && errors.As(err, &pe) && pe.Code == "22012" && wantErr:
		op.out = outFail
		if committed {
			op.out = outCommitErr
		}
	case committed:
		op.out = outIndet
	default:
		op.out = writeOutcome(ctx, err)
	}
	if op.kind == "w-multi-begin-commit-fail" || op.kind == "w-multi-ok" {
		op.checkVal = true // a cut part-way may leave the block open
	}
}

var rwLevels = []sql.IsolationLevel{sql.LevelDefault, sql.LevelReadUncommitted, sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable}

func (s *histSession) writeTx(ctx context.Context, op *histOp) {
	h := s.h
	lvl := rwLevels[s.rng.IntN(len(rwLevels))]
	readMode := s.rng.IntN(3) // 0: none, 1: whole table, 2: some keys
	readKeys := []int{s.rng.IntN(histKeys), s.rng.IntN(histKeys)}
	k1, k2 := s.rng.IntN(histKeys), s.rng.IntN(histKeys)
	keys := []int{k1}
	if k2 != k1 && s.rng.IntN(3) == 0 {
		keys = append(keys, k2)
	}
	sort.Ints(keys) // one lock order: no deadlocks
	commit := s.rng.IntN(6) != 0
	op.detail = fmt.Sprintf("BeginTx %v", lvl)
	for _, k := range keys {
		op.writes = append(op.writes, histWrite{id: h.nextID.Add(1), k: k, ret: -1})
	}
	ts := h.now()
	tx, err := s.conn.begin(ctx, sql.TxOptions{Isolation: lvl})
	if err != nil {
		op.err, op.out = err, outFail
		return
	}
	abort := func(err error) {
		op.err, op.out = err, outFail // never committed
		tx.rollback()
		op.checkVal = true
	}
	switch readMode {
	case 1:
		if !s.readAll(ctx, op, tx, ts, true) {
			abort(op.err)
			return
		}
	case 2:
		for _, k := range readKeys {
			if !s.readOne(ctx, op, tx, k, ts, true) {
				abort(op.err)
				return
			}
		}
	}
	for i := range op.writes {
		w := &op.writes[i]
		if err := tx.queryRow(ctx, h.sql.updRet, w.k).Scan(&w.ret); err != nil {
			abort(err)
			return
		}
		if err := tx.exec(ctx, h.sql.ins, w.id, w.k); err != nil {
			abort(err)
			return
		}
	}
	if !commit {
		op.detail += " rollback"
		op.out = outFail
		if err := tx.rollback(); err != nil {
			op.err = err
		}
		return
	}
	op.detail += " commit"
	err = tx.commit()
	op.err = err
	op.out = writeOutcome(ctx, err)
	if errors.Is(err, sql.ErrTxDone) {
		op.out = outIndet
	}
	if op.out != outOK {
		for i := range op.writes {
			op.writes[i].ret = -1
		}
	}
}

// ddl adds a column to the side table (or changes one's type), then reads
// the table, which must not fail; side-read only reads it, so that replica
// connections have the statement prepared from before the change.
func (s *histSession) ddl(ctx context.Context, op *histOp) {
	h := s.h
	if op.kind == "ddl" {
		n := h.sideCol.Add(1)
		q := fmt.Sprintf("ALTER TABLE %s ADD COLUMN c%d int", h.side, n)
		if n > histSideCols {
			typ := []string{"bigint", "int"}[(n/histSideCols)%2]
			q = fmt.Sprintf("ALTER TABLE %s ALTER COLUMN c%d TYPE %s", h.side, n%histSideCols+1, typ)
		}
		op.detail = q
		if err := s.conn.exec(ctx, q); err != nil {
			op.err, op.out = err, outIndet
			return
		}
	}
	rows, err := s.conn.query(ctx, h.sql.side, 1)
	if err == nil {
		for rows.Next() {
		}
		err = rows.Err()
		rows.Close()
	}
	if err != nil {
		op.err, op.out = err, outIndet
		var pe *pgconn.PgError
		if op.kind == "side-read" && errors.As(err, &pe) {
			op.note = "side-read failed after another session's DDL: " + pe.Code
		}
		if op.kind == "ddl" && ctx.Err() == nil && errors.As(err, &pe) && pe.Code != "57014" && !(pe.Code == "40001" && strings.Contains(pe.Message, "recovery")) {
			op.ddlErr = err
		}
	}
}

// concurrentDDL returns another session's DDL op that may have committed
// while op ran (it ended after op started), or nil.
func concurrentDDL(all []*histOp, op *histOp) *histOp {
	for _, o := range all {
		if o != op && o.kind == "ddl" && o.slot != op.slot && o.end >= op.start && o.start <= op.end {
			return o
		}
	}
	return nil
}

// --- ground truth and checks ---

type histTruth struct {
	rows  map[int64][]int64 // op_id -> commit timestamps (µs) of its rows
	keyOf map[int64]int
	rank  map[int64]int // op_id (present once) -> the value its commit left on its key
	count [histKeys]int
	final [histKeys]int64
	tcAt  [histKeys][]int64 // by key, the commit time of each version: tcAt[k][v-1] made v
}

func (h *histRun) groundTruth() *histTruth {
	t := h.t
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, cluster.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tr := &histTruth{rows: map[int64][]int64{}, keyOf: map[int64]int{}, rank: map[int64]int{}}
	type row struct {
		id int64
		k  int
		tc int64
	}
	var all []row
	rows, err := conn.Query(ctx, fmt.Sprintf("SELECT op_id, k, pg_xact_commit_timestamp(xmin) FROM %s", h.ops))
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var r row
		var tc *time.Time
		if err := rows.Scan(&r.id, &r.k, &tc); err != nil {
			t.Fatal(err)
		}
		if tc == nil {
			t.Fatalf("history: seed %d: op %d has no commit timestamp (track_commit_timestamp off?)", h.seed, r.id)
		}
		r.tc = tc.UnixMicro()
		all = append(all, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].tc < all[j].tc })
	for _, r := range all {
		if r.k < 0 || r.k >= histKeys {
			t.Fatalf("history: seed %d: ops row with key %d", h.seed, r.k)
		}
		tr.count[r.k]++
		tr.rows[r.id] = append(tr.rows[r.id], r.tc)
		tr.keyOf[r.id] = r.k
		tr.tcAt[r.k] = append(tr.tcAt[r.k], r.tc)
		tr.rank[r.id] = tr.count[r.k] // ties in Tc on one key cannot happen: the row lock orders them
	}
	krows, err := conn.Query(ctx, fmt.Sprintf("SELECT k, v FROM %s", h.kv))
	if err != nil {
		t.Fatal(err)
	}
	for krows.Next() {
		var k int
		var v int64
		if err := krows.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		tr.final[k] = v
	}
	if err := krows.Err(); err != nil {
		t.Fatal(err)
	}
	return tr
}

func (h *histRun) node(port int) string {
	if n, ok := h.ports[port]; ok {
		return n
	}
	return strconv.Itoa(port)
}

func (h *histRun) describe(op *histOp) string {
	var b strings.Builder
	who := fmt.Sprintf("sess %d", op.sess)
	if op.sess < 0 {
		who = "db"
	}
	fmt.Fprintf(&b, "#%d [slot %d %s pool=%s] %s", op.idx, op.slot, who, h.pools[op.pool].scope, op.kind)
	if op.detail != "" {
		fmt.Fprintf(&b, " (%s)", op.detail)
	}
	fmt.Fprintf(&b, " %s..%s", h.rel(op.start), h.rel(op.end))
	for _, w := range op.writes {
		fmt.Fprintf(&b, " write{op_id=%d k=%d", w.id, w.k)
		if w.ret >= 0 {
			fmt.Fprintf(&b, " returned v=%d", w.ret)
		}
		b.WriteString("}")
	}
	for _, r := range op.reads {
		var kv []string
		for k, v := range r.vals {
			if v >= 0 {
				kv = append(kv, fmt.Sprintf("%d:%d", k, v))
			}
		}
		rw := ""
		if r.inRW {
			rw = " in rw tx"
		}
		if sb := r.served; sb.Role == pgryw.RoleReplica {
			// The address the read went to, when it led to another
			// standby (repointed, or a connection opened while it was).
			if via := h.node(addrPort(sb.Addr)); strings.TrimSuffix(via, "-addr") != h.node(r.port) {
				rw += " via " + via
			}
			rw += fmt.Sprintf(" wm=%X/%X checked=%v wait=%v", sb.Watermark>>32, uint32(sb.Watermark), sb.Checked, sb.Wait)
		} else if sb.Role == pgryw.RolePrimary {
			rw += fmt.Sprintf(" route=%v fallback=%v", sb.Route, sb.Fallback)
		}
		fmt.Fprintf(&b, " read@%s{%s on %s%s}", h.rel(r.at), strings.Join(kv, " "), h.node(r.port), rw)
	}
	fmt.Fprintf(&b, " -> %s", op.out)
	if op.err != nil {
		fmt.Fprintf(&b, " (%v)", op.err)
	}
	if len(op.faults) > 0 {
		fmt.Fprintf(&b, " faults[%s]", strings.Join(op.faults, ", "))
	}
	if len(op.dialed) > 0 {
		fmt.Fprintf(&b, " dialed[%s]", strings.Join(op.dialed, ", "))
	}
	if sb := op.failServed; sb.Role != 0 {
		fmt.Fprintf(&b, " failed after pgryw reported %s route=%v fallback=%v wait=%v", h.node(int(sb.Port)), sb.Route, sb.Fallback, sb.Wait)
	}
	return b.String()
}

// before lists the n ops the same session ran before op.
func (h *histRun) before(all []*histOp, op *histOp, n int) string {
	if op.sess < 0 {
		return ""
	}
	var out []string
	for i := op.idx - 1; i >= 0 && len(out) < n; i-- {
		if o := all[i]; o.sess == op.sess && o.pool == op.pool {
			out = append(out, "    "+h.describe(o))
		}
	}
	if len(out) == 0 {
		return ""
	}
	slices.Reverse(out)
	return "\n  the session's previous ops:\n" + strings.Join(out, "\n")
}

// eventsBetween lists the fault log between from and to (µs).
func (h *histRun) eventsBetween(from, to int64) string {
	h.evMu.Lock()
	defer h.evMu.Unlock()
	var out []string
	for _, e := range h.events {
		if e.at >= from && e.at <= to {
			out = append(out, fmt.Sprintf("    %s %s", h.rel(e.at), e.what))
		}
	}
	if len(out) > 30 {
		out = append(out[:30], fmt.Sprintf("    ... %d more", len(out)-30))
	}
	return strings.Join(out, "\n")
}

// actionsBetween lists the fault log between from and to (µs), less the
// faults that fired on connections: what was done to the cluster.
func (h *histRun) actionsBetween(from, to int64) string {
	h.evMu.Lock()
	defer h.evMu.Unlock()
	var out []string
	for _, e := range h.events {
		if e.at >= from && e.at <= to && !strings.HasPrefix(e.what, "fired ") {
			out = append(out, fmt.Sprintf("    %s %s", h.rel(e.at), e.what))
		}
	}
	return strings.Join(out, "\n")
}

type histViolations struct {
	h     *histRun
	max   int // reported per property; the rest are counted
	count map[string]int
	order []string
}

func (v *histViolations) add(prop, format string, args ...any) {
	if v.count[prop] == 0 {
		v.order = append(v.order, prop)
	}
	v.count[prop]++
	if v.count[prop] <= v.max {
		v.h.t.Errorf("history: seed %d: %s: %s", v.h.seed, prop, fmt.Sprintf(format, args...))
	}
}

func (h *histRun) check(all []*histOp, tr *histTruth) {
	v := &histViolations{h: h, count: map[string]int{}, max: histMaxReports}
	if n, err := strconv.Atoi(os.Getenv("PGRYW_HISTORY_REPORTS")); err == nil {
		v.max = n // 0: count only
		if n < 0 {
			v.max = math.MaxInt
		}
	}
	primary := map[int64]*histOp{}
	for _, op := range all {
		for _, w := range op.writes {
			primary[w.id] = op
		}
	}

	// No duplicated effects.
	for id, tcs := range tr.rows {
		op := primary[id]
		switch {
		case op == nil:
			v.add("duplicated effects", "ops row with op_id %d that no op wrote", id)
		case len(tcs) > 1:
			var at []string
			for _, tc := range tcs {
				at = append(at, h.rel(tc))
			}
			v.add("duplicated effects", "op_id %d committed %d times (at %s) by %s", id, len(tcs), strings.Join(at, ", "), h.describe(op))
		}
	}
	for k := 0; k < histKeys; k++ {
		if tr.final[k] != int64(tr.count[k]) {
			v.add("duplicated effects", "key %d: final v=%d but %d ops rows", k, tr.final[k], tr.count[k])
		}
	}

	// Outcomes match ground truth; returned values match the commit order.
	for _, op := range all {
		for _, w := range op.writes {
			n := len(tr.rows[w.id])
			switch op.out {
			case outOK, outCommitErr:
				if n != 1 {
					v.add("outcome", "op_id %d present %d times, want 1: %s%s", w.id, n, h.describe(op), h.before(all, op, 3))
				}
			case outFail:
				if n != 0 {
					v.add("outcome", "op_id %d committed (at %s) although the op definitely failed: %s%s", w.id, h.rel(tr.rows[w.id][0]), h.describe(op), h.before(all, op, 3))
				}
			}
			if op.out == outOK && w.ret >= 0 && n == 1 && w.ret != int64(tr.rank[w.id]) {
				v.add("returned value", "op_id %d returned v=%d but its commit was #%d on key %d: %s", w.id, w.ret, tr.rank[w.id], w.k, h.describe(op))
			}
		}
		if op.note != "" {
			h.notes[op.note]++
		}
		if op.swallow {
			v.add("errors", "a string ending in SELECT 1/0 returned no error: %s", h.describe(op))
		}
		var pe *pgconn.PgError
		if errors.As(op.err, &pe) && pe.Code == "57P05" && len(op.faults) == 0 {
			if op.kind == "w-batch" {
				// A batch of pgx's front end returns before its answers:
				// one whose first answer was the idle timer's FATAL
				// cannot be sent again, and only the look in front of it
				// protects it (a limit: docs/guarantees.md#idle-sessions).
				h.notes["a write batch met the idle timer as it went out (a limit)"]++
			} else {
				// The session used its connection all along (a
				// read-span's reads on replicas): pgx's one connection
				// would not have been idle
				// (docs/guarantees.md#idle-sessions).
				v.add("idle timeout surfaced", "%s%s", h.describe(op), h.before(all, op, 2))
			}
		}
		if op.readErr != nil {
			v.add("read failed instead of falling back", "%s%s", h.describe(op), h.before(all, op, 4))
		}
		if op.shortErr != nil {
			// Not judged: a fault armed for the op or fired in it
			// (stalls reach 400 ms, wherever the read runs), a replica
			// stopped or restarting meanwhile, or a connection to the
			// primary set up within the deadline (pgx on a cold pool
			// pays that as well, and no reserve can be kept for it: on
			// a loaded machine, with every connector connecting at the
			// start of a run, a pool read failed so 146 ms in, seed
			// 7964058176119875, before the checker recorded dials).
			if op.armed || op.met || op.dialedPrimary || !h.quiet(op.start, op.end) {
				h.notes["read with a deadline below wait_timeout failed: a fault fired in it, a replica was down or it connected to the primary (not judged)"]++
			} else {
				msg := h.describe(op) + h.before(all, op, 4)
				// No fault fired in the op (faults lists what did): the
				// cluster's state is what explains it, replay paused above
				// all.
				if ev := h.actionsBetween(op.start-3_000_000, op.end); ev != "" {
					msg += "\n  fault actions:\n" + ev
				}
				v.add("read failed by a deadline below wait_timeout", "%s", msg)
			}
		}
		if op.ddlErr != nil {
			if other := concurrentDDL(all, op); other != nil {
				// Another session's ALTER landed between this one's and
				// its read (between pgx's prepare and execute, say):
				// plain pgx fails the same way.
				h.notes["read after own DDL failed, another session's DDL concurrent"]++
			} else {
				v.add("read after DDL failed", "%s%s", h.describe(op), h.before(all, op, 2))
			}
		}
		if op.incompl != "" {
			v.add("plausible values", "whole-table read returned %s: %s", op.incompl, h.describe(op))
		}
		if op.err != nil && strings.HasPrefix(op.err.Error(), "hung") {
			msg := h.describe(op)
			if ev := h.eventsBetween(op.start-100_000, op.start+2_000_000); ev != "" {
				msg += "\n  faults:\n" + ev
			}
			v.add("liveness", "%s", msg)
		}
		for _, r := range op.reads {
			for k, val := range r.vals {
				if val >= 0 && val > int64(tr.count[k]) {
					v.add("plausible values", "key %d read v=%d > final count %d: %s", k, val, tr.count[k], h.describe(op))
				}
			}
		}
	}

	h.checkRYW(all, tr, primary, v)
	h.checkMonotonic(all, tr, v)

	for n, c := range h.notes {
		h.t.Logf("history: note: %s: %d", n, c)
	}
	if len(v.order) > 0 {
		var parts []string
		for _, p := range v.order {
			parts = append(parts, fmt.Sprintf("%s: %d", p, v.count[p]))
		}
		h.t.Errorf("history: seed %d: violations: %s (replay: go test -run 'TestHistory$' -args -seed=%d)", h.seed, strings.Join(parts, ", "), h.seed)
	}
}

// A scope is a session (pool, sess) or, with session_scope=db, a whole pool
// (pool, -1).
type histScope struct{ pool, sess int }

type histVis struct {
	vt   int64 // from when a read must see it
	rank int
	op   *histOp
	id   int64
}

func (h *histRun) checkRYW(all []*histOp, tr *histTruth, primary map[int64]*histOp, v *histViolations) {
	lists := map[histScope]*[histKeys][]histVis{}
	add := func(sc histScope, k int, x histVis) {
		l := lists[sc]
		if l == nil {
			l = new([histKeys][]histVis)
			lists[sc] = l
		}
		l[k] = append(l[k], x)
	}
	for _, op := range all {
		for _, w := range op.writes {
			tcs := tr.rows[w.id]
			if len(tcs) != 1 {
				continue // reported above
			}
			var vt int64
			switch op.out {
			case outOK, outCommitErr:
				vt = op.end
			case outIndet:
				vt = max(op.end, tcs[0]+histMargin.Microseconds())
			default:
				continue // reported above
			}
			x := histVis{vt: vt, rank: tr.rank[w.id], op: op, id: w.id}
			if op.sess >= 0 {
				add(histScope{op.pool, op.sess}, w.k, x)
			}
			if h.pools[op.pool].scope == "db" {
				add(histScope{op.pool, -1}, w.k, x)
			}
		}
	}
	// Sort by vt; best[i] = the highest-ranked write among the first i+1.
	best := map[histScope]*[histKeys][]int{}
	for sc, l := range lists {
		b := new([histKeys][]int)
		for k := range l {
			sort.Slice(l[k], func(i, j int) bool { return l[k][i].vt < l[k][j].vt })
			b[k] = make([]int, len(l[k]))
			for i := range l[k] {
				b[k][i] = i
				if i > 0 && l[k][b[k][i-1]].rank > l[k][i].rank {
					b[k][i] = b[k][i-1]
				}
			}
		}
		best[sc] = b
	}
	for _, op := range all {
		var sc histScope
		switch {
		case h.pools[op.pool].scope == "db":
			sc = histScope{op.pool, -1}
		case op.sess >= 0:
			sc = histScope{op.pool, op.sess}
		default:
			continue
		}
		l, b := lists[sc], best[sc]
		if l == nil {
			continue
		}
		for _, r := range op.reads {
			for k, val := range r.vals {
				if val < 0 {
					continue
				}
				i := sort.Search(len(l[k]), func(i int) bool { return l[k][i].vt > r.ts }) - 1
				if i < 0 {
					continue
				}
				w := l[k][b[k][i]]
				if val >= int64(w.rank) {
					continue
				}
				why := "returned before the read"
				if w.op.out == outIndet {
					why = fmt.Sprintf("outcome unknown, committed at %s", h.rel(tr.rows[w.id][0]))
				}
				var between []string
				if w.op.sess == op.sess && op.sess >= 0 && w.op.idx < op.idx {
					for _, o := range all[w.op.idx+1 : op.idx] {
						if o.sess == op.sess && o.pool == op.pool {
							between = append(between, "    "+h.describe(o))
						}
					}
				}
				msg := fmt.Sprintf("key %d: read v=%d on %s, but write op_id %d (%s) left v=%d\n  write: %s\n  read:  %s",
					k, val, h.node(r.port), w.id, why, w.rank, h.describe(w.op), h.describe(op))
				if len(between) > 0 {
					msg += "\n  session ops in between:\n" + strings.Join(between, "\n")
				}
				if ev := h.eventsBetween(w.op.start-20_000, op.end); ev != "" {
					msg += "\n  faults:\n" + ev
				}
				prop := "read-your-writes"
				if w.op.out == outIndet {
					prop = "read-your-writes (indeterminate write)"
				}
				v.add(prop, "%s", msg)
			}
		}
	}
}

// checkMonotonic checks that each session's reads of a key never go back.
// A read on the primary that misses a version a replica already showed is
// PostgreSQL's doing, not pgryw's: the primary makes a commit visible only
// after its WAL is flushed, and a standby may replay it first. Those are
// counted and logged, not failed.
func (h *histRun) checkMonotonic(all []*histOp, tr *histTruth, v *histViolations) {
	type seen struct {
		v    int64
		op   *histOp
		port int
	}
	last := map[histScope]*[histKeys]seen{}
	for _, op := range all { // sorted by start; one session runs one op at a time
		if op.sess < 0 {
			continue
		}
		sc := histScope{op.pool, op.sess}
		m := last[sc]
		if m == nil {
			m = new([histKeys]seen)
			for k := range m {
				m[k].v = -1
			}
			last[sc] = m
		}
		for _, r := range op.reads {
			for k, val := range r.vals {
				if val < 0 {
					continue
				}
				if val < m[k].v {
					prev := m[k]
					msg := fmt.Sprintf("key %d: read v=%d on %s after v=%d on %s\n  earlier: %s\n  later:   %s",
						k, val, h.node(r.port), prev.v, h.node(prev.port), h.describe(prev.op), h.describe(op))
					if ev := h.eventsBetween(prev.op.start-20_000, op.end); ev != "" {
						msg += "\n  faults:\n" + ev
					}
					prop := "monotonic reads"
					if prev.port == cluster.Writer.Port {
						prop = "monotonic reads (earlier read on the primary)"
					}
					if r.port == cluster.Writer.Port && prev.v >= 1 && int(prev.v) <= len(tr.tcAt[k]) {
						gap := time.Duration(r.at-tr.tcAt[k][prev.v-1]) * time.Microsecond
						h.notes["primary read behind a replica's (commit visible on the standby first)"]++
						if gap < time.Second {
							continue
						}
						msg += fmt.Sprintf("\n  (the version missed committed %v before the primary read)", gap)
					}
					v.add(prop, "%s", msg)
					continue
				}
				m[k] = seen{val, op, r.port}
			}
		}
	}
}

func (h *histRun) summary(all []*histOp, elapsed time.Duration) {
	kinds := map[string]int{}
	outs := map[histOutcome]int{}
	nodes := map[string]int{}
	sessions := map[histScope]bool{}
	var reads int
	for _, op := range all {
		kinds[op.kind]++
		if len(op.writes) > 0 {
			outs[op.out]++
		}
		for _, r := range op.reads {
			nodes[h.node(r.port)]++
			reads++
		}
		if op.sess >= 0 {
			sessions[histScope{op.pool, op.sess}] = true
		}
	}
	var ks []string
	for k, n := range kinds {
		ks = append(ks, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(ks)
	h.evMu.Lock()
	nev := len(h.events)
	h.evMu.Unlock()
	h.t.Logf("history: seed %d: %d ops in %v (%d sessions), %d reads by node %v; write outcomes ok=%d fail=%d committed-with-error=%d indeterminate=%d; faults fired: cut-write=%d cut-read=%d reset=%d stall=%d; %d events",
		h.seed, len(all), elapsed.Round(time.Millisecond), len(sessions), reads, nodes,
		outs[outOK], outs[outFail], outs[outCommitErr], outs[outIndet],
		h.nw.Fired(faultnet.CutWrite), h.nw.Fired(faultnet.CutRead), h.nw.Fired(faultnet.Reset), h.nw.Fired(faultnet.Stall), nev)
	h.t.Logf("history: ops by kind: %s", strings.Join(ks, " "))
	if n := h.repoints.Load(); n > 0 {
		h.t.Logf("history: %d bouncer repoints", n)
	}
	if n := h.proxyRepoint.Load(); n > 0 {
		h.t.Logf("history: %d replica addresses repointed at the other standby", n)
		h.evMu.Lock()
		for _, e := range h.events {
			if strings.HasPrefix(e.what, "repoint replica") {
				h.t.Logf("history:   %s %s", h.rel(e.at), e.what)
			}
		}
		h.evMu.Unlock()
	}
	// The reads under a deadline below wait_timeout: how many, how many
	// the primary answered because the replicas were behind (the fallback
	// the deadline must leave time for), how many failed.
	// For those the fallback answered, what it took of the time the wait
	// left it (the op's time less the wait, over the deadline less the
	// wait): how near the deadline a fallback came, the checker's margin
	// against a loaded machine.
	var short, shortFell, shortFailed, shortByDeadline int
	var most float64
	var mostAt string
	for _, op := range all {
		if op.short == 0 {
			continue
		}
		short++
		if op.err != nil {
			shortFailed++
		}
		if op.shortErr != nil {
			shortByDeadline++
		}
		for _, r := range op.reads {
			if r.served.Role == pgryw.RolePrimary && r.served.Route == pgryw.RouteFallback {
				shortFell++
				took := time.Duration(op.end-op.start) * time.Microsecond
				if left := op.short - r.served.Wait; left > 0 {
					if f := float64(took-r.served.Wait) / float64(left); f > most {
						most = f
						mostAt = fmt.Sprintf("%v of %v (deadline %v, wait %v)", (took - r.served.Wait).Round(100*time.Microsecond),
							left.Round(100*time.Microsecond), op.short, r.served.Wait.Round(100*time.Microsecond))
					}
				}
				break
			}
		}
	}
	if short > 0 {
		h.t.Logf("history: %d reads with a deadline below wait_timeout: %d answered by the primary's fallback (the most of the time left it took: %s); %d failed, %d by the deadline",
			short, shortFell, mostAt, shortFailed, shortByDeadline)
	}
	for _, p := range h.pools {
		h.t.Logf("history: pool session_scope=%s stats %+v", p.scope, p.c.Stats())
	}
}
