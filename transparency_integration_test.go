package pgryw_test

// TestTransparency is the differential checker of pgryw's second promise:
// apart from where its reads run, a program behaves exactly as it does on
// pgx's stdlib driver against the primary. Random programs, drawn from a
// grammar of what applications do with database/sql (autocommit reads and
// writes, multi-statement strings, Exec'd blocks, transactions at every
// isolation level and read-only flag, savepoints, SET/RESET/set_config
// literal, with parameters and inside functions, SET ROLE, advisory locks,
// temporary tables, PREPARE/EXECUTE, cursors WITH HOLD, LISTEN/NOTIFY,
// sequences, unlogged tables, views over volatile functions, node-identity
// functions and views, SHOW, db.Prepare, failing statements, DSN run-time
// parameters), run twice: through pgryw against the primary and two lagging
// replicas, and through pgx stdlib against the primary alone, each in a
// database of its own in the same cluster. Every step is compared
// (columns, rows, SQLSTATE, rows affected), and after each step the
// advisory locks a third session sees and the notifications it received;
// at the end, the tables' contents. During the pgryw run, faults hit the
// replicas: replay paused, replica connections cut, reset or stalled.
// Every step must return within its context's deadline plus 100 ms.
//
// Differences on the written list of intended ones (transparencyIntended,
// which docs/guarantees.md's limits repeat) are accepted; anything else fails the run,
// which prints its seed and a minimal program.
//
//	go test -run TestTransparency -args -tseed=N     replays a seed
//	PGRYW_TRANSPARENCY_PROGRAMS=N                    programs to run (CI: a few dozen)
//	PGRYW_TRANSPARENCY_DURATION=30m                  as long as asked (make check-long)

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
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
	"github.com/pgryw/pgryw/internal/sqlclass"
)

var transparencySeed = flag.Int64("tseed", 0, "TestTransparency: seed (0: $PGRYW_TRANSPARENCY_SEED, else random)")

const (
	tpSessions     = 3
	tpDefaultProgs = 20
	tpSteps        = 36
	tpStepTimeout  = 5 * time.Second
	tpLiveness     = 100 * time.Millisecond
	// tpIdleTimeout is the servers' idle_session_timeout in the programs
	// that have one (in their DSN, for pgx and pgryw alike), and
	// tpIdleSpan how long a span step reads, every tpIdleStep on each
	// session in turn: longer than the timeout, so that pgryw's primary
	// connections sit idle behind sessions in use (the reads go to
	// replicas), where pgx's one connection per session is used every
	// 3 × tpIdleStep. And longer than a second, after which pgx's stdlib
	// pings a pool's connection before handing it out again (pgryw looks
	// at its socket): the pool's idle connections are replaced on either
	// side.
	tpIdleTimeout = 800 * time.Millisecond
	tpIdleSpan    = 1200 * time.Millisecond
	tpIdleStep    = 100 * time.Millisecond
	tpChannel     = "tch"
)

// A step of a program.
type tpStep struct {
	sess int    // the session (a *sql.Conn); -1: the pool
	op   string // exec, query, begin, commit, rollback, prepare, sexec, squery, sclose; pgx's: batch, copy
	sql  string
	args []any
	tx   sql.TxOptions
	stmt int // prepared statement slot

	// deadline: the step runs with a context deadline this soon
	// (tpStepTimeout when 0), below pgryw's wait_timeout: a read waiting
	// on a replica behind must leave on_timeout=primary time to answer.
	deadline time.Duration

	batch []tpStep // batch: its statements (sql and args)
	cb    bool     // batch: read through the statements' callbacks, run by Close
	rows  [][]any  // copy: the rows copied into t
}

// timeout is how long the step has: its deadline, or tpStepTimeout.
func (s tpStep) timeout() time.Duration {
	if s.deadline > 0 {
		return s.deadline
	}
	return tpStepTimeout
}

// texts is the step's SQL, a batch's statements' joined.
func (s tpStep) texts() string {
	t := s.sql
	for _, b := range s.batch {
		t += "\n" + b.sql
	}
	return t
}

// tpOnlyNode reports whether every statement of step s reads node
// identity or node-local state, as pgryw's classifier sees it: no snapshot
// decides what such a step returns.
func tpOnlyNode(s tpStep) bool {
	if s.sql != "" && !sqlclass.Classify(s.sql).Node {
		return false
	}
	for _, b := range s.batch {
		if !sqlclass.Classify(b.sql).Node {
			return false
		}
	}
	return s.sql != "" || len(s.batch) > 0
}

func (s tpStep) String() string {
	if s.deadline > 0 {
		t := s
		t.deadline = 0
		return fmt.Sprintf("%s within %v", t, s.deadline)
	}
	who := "db"
	if s.sess >= 0 {
		who = fmt.Sprintf("s%d", s.sess)
	}
	switch s.op {
	case "begin":
		return fmt.Sprintf("%s.BeginTx(%s, read only %v)", who, sql.IsolationLevel(s.tx.Isolation), s.tx.ReadOnly)
	case "commit", "rollback":
		return fmt.Sprintf("%s.tx.%s()", who, s.op)
	case "sclose":
		return fmt.Sprintf("%s.stmt%d.Close()", who, s.stmt)
	case "sexec", "squery":
		return fmt.Sprintf("%s.stmt%d.%s(%v)", who, s.stmt, strings.TrimPrefix(s.op, "s"), s.args)
	case "prepare":
		return fmt.Sprintf("%s.stmt%d = Prepare(%q)", who, s.stmt, s.sql)
	case "batch":
		var qs []string
		for _, q := range s.batch {
			qs = append(qs, fmt.Sprintf("%q %v", q.sql, q.args))
		}
		return fmt.Sprintf("%s.SendBatch(%s)", who, strings.Join(qs, "; "))
	case "copy":
		return fmt.Sprintf("%s.CopyFrom(t, %v)", who, s.rows)
	case "span":
		return fmt.Sprintf("every session reads for %v", tpIdleSpan)
	}
	return fmt.Sprintf("%s.%s(%q, %v)", who, s.op, s.sql, s.args)
}

// tpResult is what a step showed the program, and the third session.
type tpResult struct {
	cols     []string
	rows     [][]string
	affected string
	err      string
	locks    string // advisory locks in the database, as the observer sees them
	notified string // notifications the observer received since the last step
	took     time.Duration
	// served: pgryw's reports of the statements of a step with a deadline
	// (ServedBy), for the description of a difference; not compared.
	served string
	// moved: on pgryw's side, the step moved a read-only transaction from
	// its replica to the primary after its snapshot was taken
	// (Stats.SnapshotMoves rose).
	moved bool
}

func (r tpResult) String() string {
	var b strings.Builder
	if r.err != "" {
		fmt.Fprintf(&b, "error %s", r.err)
	}
	if r.err == "" || len(r.cols) > 0 || len(r.rows) > 0 {
		if b.Len() > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "cols %v rows %v", r.cols, r.rows)
	}
	if r.affected != "" {
		fmt.Fprintf(&b, " affected %s", r.affected)
	}
	fmt.Fprintf(&b, "; locks [%s]; notified [%s]", r.locks, r.notified)
	if r.served != "" {
		fmt.Fprintf(&b, "; took %v, served %s", r.took.Round(time.Millisecond), r.served)
	}
	return b.String()
}

// same reports whether two results show the program the same thing.
func (r tpResult) same(o tpResult) bool {
	return r.err == o.err && slices.Equal(r.cols, o.cols) && slices.EqualFunc(r.rows, o.rows, slices.Equal[[]string]) &&
		r.affected == o.affected && r.locks == o.locks && r.notified == o.notified
}

// tpIntended is one intended difference between pgryw and pgx: accept
// reports that the two results of step i differ only that way.
type tpIntended struct {
	id, why string
	// accept reports that step i's results are this difference; before
	// are pgryw's results of the steps before it.
	accept func(prog []tpStep, before []tpResult, i int, pgx, ryw tpResult) bool
}

// transparencyIntended is the written list of intended differences. docs/guarantees.md
// ("What is guaranteed", its limits) says the same.
var transparencyIntended = []tpIntended{
	{
		id: "deallocate-all",
		why: "after DEALLOCATE ALL or DISCARD ALL, pgx fails the next execution of a statement it had prepared on that connection with 26000 " +
			"(aborting a transaction block); which statements pgx had prepared on pgryw's primary connection depends on which reads ran there, " +
			"and a read pgryw runs on a replica, whose connection it did not reach, succeeds",
		accept: func(prog []tpStep, _ []tpResult, i int, pgx, ryw tpResult) bool {
			if pgx.err != "SQLSTATE 26000" || ryw.err != "" {
				return false
			}
			for _, st := range prog[:i] {
				if st.sess == prog[i].sess && (strings.EqualFold(st.sql, "DEALLOCATE ALL") || strings.EqualFold(st.sql, "DISCARD ALL")) {
					return true
				}
			}
			return false
		},
	},
	{
		id:  "replica-fails-mid-result",
		why: "a read whose replica connection breaks after rows reached the caller fails, as it would on any server (docs/guarantees.md, Failures fall back)",
		accept: func(prog []tpStep, _ []tpResult, i int, pgx, ryw tpResult) bool {
			return pgx.err == "" && ryw.err != "" && !strings.HasPrefix(ryw.err, "SQLSTATE ") && prog[i].op == "query" && tpFaultsFired.Load() > 0 &&
				!tpWaitEnded(prog[i], ryw)
		},
	},
	{
		id: "snapshot-moved",
		why: "a read-only REPEATABLE READ transaction begun on a replica that must run a statement on the primary after its first statement " +
			"moves there, and the rest of it sees the primary's snapshot, taken at the move (docs/guarantees.md): it may see what other " +
			"sessions committed in between. Accepted only after pgryw counted such a move in that transaction (Stats.SnapshotMoves)",
		accept: func(prog []tpStep, before []tpResult, i int, pgx, ryw tpResult) bool {
			if pgx.err != "" || ryw.err != "" || !slices.Equal(pgx.cols, ryw.cols) || tpOnlyNode(prog[i]) {
				return false // a snapshot decides rows, not node state
			}
			if ryw.moved {
				return true // the statement that moved it, reading tables too
			}
			s := prog[i].sess
			for j := i - 1; j >= 0; j-- {
				st := prog[j]
				if st.sess != s {
					continue
				}
				if st.op == "begin" || st.op == "commit" || st.op == "rollback" {
					return false // the transaction began here, or none is open
				}
				if before[j].moved {
					return true
				}
			}
			return false
		},
	},
	{
		id: "aborted-batch-described",
		why: "in an aborted transaction pgx fails a batch before any callback when it must describe one of its statements first, and runs " +
			"the callbacks with 25P02 when it described them all on that connection before; which statements pgx described on pgryw's " +
			"primary connection depends on which reads ran there (read-only batches on replicas)",
		accept: func(prog []tpStep, _ []tpResult, i int, pgx, ryw tpResult) bool {
			const aborted = "SQLSTATE 25P02"
			if prog[i].op != "batch" || pgx.err != aborted || ryw.err != aborted || pgx.affected != ryw.affected {
				return false
			}
			onlyAborted := func(r tpResult) bool {
				for _, row := range r.rows {
					if len(row) != 1 || row[0] != "error "+aborted {
						return false
					}
				}
				return len(r.cols) == 0
			}
			return onlyAborted(pgx) && onlyAborted(ryw)
		},
	},
	{
		id:  "replica-killed",
		why: "not a difference of pgryw's: while the checker has a replica stopped, the primary's pg_stat_replication lists one standby fewer",
		accept: func(prog []tpStep, _ []tpResult, i int, pgx, ryw tpResult) bool {
			return tpKills.Load() > 0 && strings.Contains(prog[i].texts(), "pg_stat_replication") && pgx.err == "" && ryw.err == "" &&
				slices.Equal(pgx.cols, ryw.cols) && len(pgx.rows) == len(ryw.rows)
		},
	},
}

// tpKills counts the replicas the checker stopped in the pgryw run under
// way.
var tpKills, tpKillsTotal atomic.Int64

// tpWaitEnded reports that a read with a deadline failed as one its wait
// ended would (the context's end, or database/sql's bad connection): never
// an intended difference. pgx on the primary answers such a read well
// within its deadline, and on_timeout=primary promises pgryw does too.
func tpWaitEnded(st tpStep, ryw tpResult) bool {
	return st.deadline > 0 && (strings.Contains(ryw.err, "deadline exceeded") || strings.Contains(ryw.err, "bad connection"))
}

// tpRepoints counts the proxy repoints of the run (tpRun.proxies).
var tpRepoints atomic.Int64

// tpFaultsFired counts replica faults (connection faults, kills) that fired
// in the pgryw run under
// way (tpRun resets it per program).
var tpFaultsFired atomic.Int64

// tpSchema is created in both databases.
var tpSchema = []string{
	"CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL)",
	"CREATE SCHEMA s1",
	"CREATE TABLE s1.t (id int PRIMARY KEY, v int NOT NULL)",
	"CREATE UNLOGGED TABLE u (id int PRIMARY KEY)",
	"CREATE SEQUENCE s",
	"CREATE TABLE tenant_rows (tenant text NOT NULL, id int NOT NULL)",
	"INSERT INTO tenant_rows VALUES ('a', 1), ('a', 2), ('b', 3)",
	"CREATE VIEW my_rows AS SELECT id FROM tenant_rows WHERE tenant = current_setting('app.tenant', true)",
	"CREATE FUNCTION set_tenant(text) RETURNS void LANGUAGE plpgsql AS $$BEGIN PERFORM set_config('app.tenant', $1, false); END$$",
	"CREATE FUNCTION lock_it(bigint) RETURNS boolean LANGUAGE sql AS 'SELECT pg_try_advisory_lock($1)'",
	"CREATE FUNCTION make_temp() RETURNS void LANGUAGE plpgsql AS $$BEGIN CREATE TEMP TABLE IF NOT EXISTS ft (i int); END$$",
	"CREATE FUNCTION stable_sum() RETURNS bigint STABLE LANGUAGE sql AS 'SELECT coalesce(sum(v), 0) FROM t'",
	// Declared STABLE, it takes a lock through another function: what its
	// own text shows is nothing (write_functions must say).
	"CREATE FUNCTION lock_quietly(bigint) RETURNS boolean STABLE LANGUAGE sql AS 'SELECT lock_it($1)'",
	"CREATE TABLE j (id int PRIMARY KEY, doc json)",
	"CREATE FUNCTION public.f() RETURNS text STABLE LANGUAGE sql AS $$SELECT 'public'$$",
	"CREATE FUNCTION s1.f() RETURNS text STABLE LANGUAGE sql AS $$SELECT 's1'$$",
	"GRANT ALL ON ALL TABLES IN SCHEMA public, s1 TO ryw_t_role",
	"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO ryw_t_role",
	"GRANT USAGE ON SCHEMA s1 TO ryw_t_role",
}

// tpReset empties the tables between programs.
var tpReset = []string{
	"TRUNCATE t, s1.t, u, j",
	"ALTER SEQUENCE s RESTART",
}

// tpRun is one run of the checker: its two databases and the faults.
type tpRun struct {
	t      *testing.T
	native bool // pgx's front end: pgryw's Pool against pgxpool
	seed   int64
	dbs    [2]string // pgx's, pgryw's
	nw     *faultnet.Network
	faults bool
	ryw    string // DSN keys of pgryw's alone (write_functions=...)
	// proxies stand in front of the replicas on pgryw's side (none
	// through bouncers): a fault repoints one at the other standby while
	// the connections already made through it live on (tpRepoint).
	proxies []*pgtest.SwitchProxy
	// pooler: the pooler mode of the program under way, by its seed
	// (with proxies): the repoint must be caught in every mode.
	pooler string
	// quietSteps: a step with a deadline is running on pgryw's side, and
	// no network fault is armed meanwhile (quiet); lastStall: when a stall
	// last fired, unix ns.
	quietSteps atomic.Int32
	// cur: pgryw's connector of the program under way (its faults let
	// its idle replica connections go at a repoint).
	cur       atomic.Pointer[pgryw.Connector]
	lastStall atomic.Int64
	txOpen    atomic.Int32 // on the pgryw side: transactions open now
	// faultMu orders arming a fault against a transaction's start: a
	// fault armed before it must not fire inside it.
	faultMu sync.Mutex
}

// rywKeys are the DSN keys of pgryw's side for the program under way:
// the replicas (through the proxies, when there are), the pooler mode and
// r.ryw.
func (r *tpRun) rywKeys() string {
	addrs := cluster.ReplicaAddrs()
	if r.proxies != nil {
		addrs = nil
		for _, p := range r.proxies {
			addrs = append(addrs, p.Addr())
		}
	}
	keys := "&replicas=" + strings.Join(addrs, ",")
	if r.pooler != "" {
		keys += "&pooler=" + r.pooler
	}
	if r.ryw != "" {
		keys += "&" + r.ryw
	}
	return keys
}

// tpPoolers are the pooler modes programs run in, by their seeds: none
// twice, where nothing else tells one server instance from another.
var tpPoolers = []string{"auto", "none", "session", "transaction", "none"}

func tpSeedValue(t *testing.T) int64 {
	if *transparencySeed != 0 {
		return *transparencySeed
	}
	if s := os.Getenv("PGRYW_TRANSPARENCY_SEED"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("PGRYW_TRANSPARENCY_SEED=%q: %v", s, err)
		}
		return n
	}
	return time.Now().UnixNano() & (1<<53 - 1)
}

func TestTransparency(t *testing.T) {
	tpCheck(t, false, "PGRYW_TRANSPARENCY_PROGRAMS", tpDefaultProgs)
}

// tpCheck runs the checker: database/sql's front end against pgx's stdlib
// driver, or (native) pgx's, the Pool against pgxpool. progsEnv names the
// variable that sets how many programs run (def by default).
func tpCheck(t *testing.T, native bool, progsEnv string, def int) {
	pgtest.Require(t, cluster)
	seed := tpSeedValue(t)
	fmt.Fprintf(os.Stderr, "transparency: seed %d\n", seed)
	t.Logf("transparency: seed %d", seed)
	r := &tpRun{t: t, seed: seed, nw: faultnet.New(), faults: os.Getenv("PGRYW_TRANSPARENCY_FAULTS") != "off", native: native}
	r.nw.OnFire = func(c *faultnet.Conn, k faultnet.Kind) {
		if k == faultnet.Stall || k == faultnet.StallAfterReady {
			r.lastStall.Store(time.Now().UnixNano())
		}
		if c.Port() != tpPrimaryPort() {
			tpFaultsFired.Add(1) // a primary fault must not show at all
		}
	}
	r.setup()
	setDelay(t, 30*time.Millisecond)
	if cluster.Bouncers() == nil {
		r.proxies = replicaProxies(t)
	}

	progs := def
	var deadline time.Time
	if s := os.Getenv(progsEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("%s=%q: want a positive integer", progsEnv, s)
		}
		progs = n
	}
	if s := os.Getenv("PGRYW_TRANSPARENCY_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("PGRYW_TRANSPARENCY_DURATION=%q: %v", s, err)
		}
		deadline, progs = time.Now().Add(d), 1<<30
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 7))
	steps, idle := 0, 0
	for p := 0; p < progs && (deadline.IsZero() || time.Now().Before(deadline)); p++ {
		pseed := rng.Int64()
		prog, extra := tpGenerate(rand.New(rand.NewPCG(uint64(pseed), 1)), native)
		steps += len(prog)
		if strings.HasPrefix(extra, "idle_session_timeout=") {
			idle++
		}
		if i, pgx, ryw := r.compare(prog, extra, pseed); i >= 0 {
			min := r.minimize(prog, extra, pseed)
			var b strings.Builder
			fmt.Fprintf(&b, "transparency: seed %d, program %d (seed %d, DSN %q) differs at step %d: %s\n  pgx:   %s\n  pgryw: %s\nminimal program:\n",
				seed, p, pseed, extra, i, prog[i], pgx, ryw)
			for k, s := range min {
				fmt.Fprintf(&b, "  %2d %s\n", k, s)
			}
			if j, pgx, ryw := r.compare(min, extra, pseed); j >= 0 {
				fmt.Fprintf(&b, "which differs at step %d:\n  pgx:   %s\n  pgryw: %s\n", j, pgx, ryw)
			} else {
				// A difference that timing or faults decide: the whole
				// program up to it.
				fmt.Fprintf(&b, "which did not differ again; the program up to step %d:\n", i)
				for k, s := range prog[:i+1] {
					fmt.Fprintf(&b, "  %2d %s\n", k, s)
				}
			}
			t.Fatal(b.String())
		}
	}
	var fired []string
	for k := faultnet.CutWrite; k <= faultnet.StallAfterReady; k++ {
		fired = append(fired, fmt.Sprintf("%s %d", k, r.nw.Fired(k)))
	}
	t.Logf("transparency: %d steps, no difference (%d programs under idle_session_timeout); faults %v (fired: %s; replicas stopped %d; repoints %d)", steps, idle, r.faults, strings.Join(fired, ", "), tpKillsTotal.Load(), tpRepoints.Load())
}

// setup creates the two databases and the role.
func (r *tpRun) setup() {
	t := r.t
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, cluster.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ryw_t_role') THEN CREATE ROLE ryw_t_role; END IF; END$$`); err != nil {
		t.Fatal(err)
	}
	suffix := fmt.Sprintf("%d_%d", os.Getpid(), tableSeq.Add(1))
	r.dbs = [2]string{"ryw_tp_pgx_" + suffix, "ryw_tp_ryw_" + suffix}
	for _, db := range r.dbs {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+db); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			c, err := pgx.Connect(context.Background(), cluster.WriterDSN())
			if err == nil {
				c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
				c.Close(context.Background())
			}
		})
		dc, err := pgx.Connect(ctx, tpDSN(db, ""))
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range tpSchema {
			if _, err := dc.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		dc.Close(ctx)
	}
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
}

// tpDSN is the writer's URL for database db, with extra parameters.
func tpDSN(db, extra string) string {
	dsn := strings.Replace(cluster.WriterDSN(), "/postgres?", "/"+db+"?", 1)
	if extra != "" {
		dsn += "&" + extra
	}
	return dsn
}

// tpSide is one driver's side of a comparison.
type tpSide struct {
	db       *sql.DB
	c        *pgryw.Connector // nil for pgx
	obs      *pgx.Conn        // the third session, on the primary
	conns    [tpSessions]*sql.Conn
	txs      [tpSessions]*sql.Tx
	stmts    map[int]*sql.Stmt
	sentinel int
	txOpen   *atomic.Int32   // transactions and blocks open: no connection is cut meanwhile
	opening  func()          // counts a transaction about to open, and disarms pending faults (pgryw's side)
	poolExec func()          // runs before each of the pool's Execs (pgryw's side: may arm a primary fault)
	held     map[string]bool // the local addresses of the sessions' primary connections (pgryw's side)
	life     context.Context // the program's: transactions begin with it
	end      context.CancelFunc
	block    [tpSessions]bool

	native bool // pgx's front end: the fields below, not db, conns, txs, stmts
	tpNative
}

// open opens side i (0: pgx, 1: pgryw) for a program.
func (r *tpRun) open(i int, extra string) (*tpSide, error) {
	if r.native {
		return r.openNative(i, extra)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := r.dbs[i]
	err := tpResetTables(ctx, db, i)
	if err != nil {
		return nil, err
	}
	s := &tpSide{stmts: map[int]*sql.Stmt{}, txOpen: &r.txOpen}
	s.opening = func() { s.txOpen.Add(1) }
	if i == 1 {
		s.opening = func() {
			r.faultMu.Lock()
			r.txOpen.Add(1)
			for _, c := range r.nw.Conns(0) {
				if c.Port() != tpPrimaryPort() { // (the primary's faults cannot show)
					c.Disarm()
				}
			}
			r.faultMu.Unlock()
		}
	}
	s.life, s.end = context.WithCancel(context.Background())
	if i == 0 {
		s.db, err = sql.Open("pgx", tpDSN(db, extra))
	} else {
		var cfg *pgryw.Config
		dsn := tpDSN(db, extra) + "&wait_timeout=300ms" + r.rywKeys()
		cfg, err = pgryw.ParseDSN(dsn)
		if err == nil {
			s.c, err = pgryw.NewConnector(cfg)
		}
		if err == nil {
			pgryw.SetNetHook(s.c, r.nw.Wrap)
			s.db = sql.OpenDB(s.c)
		}
	}
	if err != nil {
		return nil, err
	}
	if s.obs, err = pgx.Connect(ctx, tpDSN(db, "")); err != nil {
		s.db.Close()
		return nil, err
	}
	if _, err := s.obs.Exec(ctx, "LISTEN "+tpChannel); err != nil {
		s.close()
		return nil, err
	}
	s.held = map[string]bool{}
	for k := range s.conns {
		if s.conns[k], err = s.db.Conn(ctx); err != nil {
			s.close()
			return nil, err
		}
		if i == 1 {
			s.conns[k].Raw(func(dc any) error {
				if a := pgryw.PrimaryAddr(dc.(*pgryw.Conn)); a != nil {
					s.held[a.String()] = true
				}
				return nil
			})
		}
	}
	return s, nil
}

// tpResetTables empties database db's tables (tpReset) for side i's next
// program, with a connection of its own. On pgryw's side (i == 1) it then
// waits until the replicas have replayed the reset: it is the checker's,
// not the program's, and a program's first read, with no write of its own
// before it, would otherwise see the previous program's rows on a replica
// still behind (30 ms of apply delay), where pgx on the primary sees the
// reset.
func tpResetTables(ctx context.Context, db string, i int) error {
	reset, err := pgx.Connect(ctx, tpDSN(db, ""))
	if err != nil {
		return err
	}
	for _, q := range tpReset {
		if _, err := reset.Exec(ctx, q); err != nil {
			reset.Close(ctx)
			return err
		}
	}
	reset.Close(ctx)
	if i != 1 {
		return nil
	}
	return cluster.WaitCaughtUp(ctx)
}

func (s *tpSide) close() {
	if s.native {
		s.closeNative()
		return
	}
	for _, st := range s.stmts {
		st.Close()
	}
	for k, tx := range s.txs {
		if tx != nil {
			tx.Rollback()
			s.txs[k] = nil
		}
	}
	s.txOpen.Store(0)
	for _, c := range s.conns {
		if c != nil {
			c.Close()
		}
	}
	s.db.Close()
	s.obs.Close(context.Background())
	s.end()
}

// querier is what a step runs on: a pool, a connection or a transaction.
type querier interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
	PrepareContext(context.Context, string) (*sql.Stmt, error)
}

func (s *tpSide) on(sess int) querier {
	if sess < 0 {
		return s.db
	}
	if tx := s.txs[sess]; tx != nil {
		return tx
	}
	return s.conns[sess]
}

// run runs one step and records what it showed.
func (s *tpSide) run(st tpStep) tpResult {
	if s.native {
		return s.runNative(st)
	}
	var res tpResult
	ctx, cancel := context.WithTimeout(s.servedCtx(st, &res), st.timeout())
	defer cancel()
	start := time.Now()
	q := s.on(st.sess)
	switch st.op {
	case "exec":
		ended := s.beforeExec(st, st.sess >= 0 && s.txs[st.sess] != nil)
		r, err := q.ExecContext(ctx, st.sql, st.args...)
		ended()
		res.err = errText(err)
		if err == nil {
			if n, err := r.RowsAffected(); err == nil {
				res.affected = strconv.FormatInt(n, 10)
			}
		}
	case "query":
		rows, err := q.QueryContext(ctx, st.sql, st.args...)
		res.readRows(rows, err)
	case "begin":
		if s.txs[st.sess] != nil {
			res.err = "skipped: in a transaction"
			break
		}
		// The transaction lives past this step: database/sql ends it
		// when the context given here ends.
		s.opening()
		tx, err := s.conns[st.sess].BeginTx(s.life, &st.tx)
		res.err = errText(err)
		if err == nil {
			s.txs[st.sess] = tx
		} else {
			s.txOpen.Add(-1)
		}
	case "commit", "rollback":
		tx := s.txs[st.sess]
		if tx == nil {
			res.err = "skipped: no transaction"
			break
		}
		s.txs[st.sess] = nil
		// Open until it has ended: no replica is stopped under a
		// COMMIT on its way.
		if st.op == "commit" {
			res.err = errText(tx.Commit())
		} else {
			res.err = errText(tx.Rollback())
		}
		s.txOpen.Add(-1)
	case "prepare":
		if old := s.stmts[st.stmt]; old != nil {
			old.Close()
		}
		delete(s.stmts, st.stmt)
		stmt, err := q.PrepareContext(ctx, st.sql)
		res.err = errText(err)
		if err == nil {
			s.stmts[st.stmt] = stmt
		}
	case "sexec", "squery":
		stmt := s.stmts[st.stmt]
		if stmt == nil {
			res.err = "skipped: no statement"
			break
		}
		if tx := s.txs[max(st.sess, 0)]; st.sess >= 0 && tx != nil {
			stmt = tx.StmtContext(ctx, stmt)
		}
		if st.op == "sexec" {
			r, err := stmt.ExecContext(ctx, st.args...)
			res.err = errText(err)
			if err == nil {
				if n, err := r.RowsAffected(); err == nil {
					res.affected = strconv.FormatInt(n, 10)
				}
			}
		} else {
			rows, err := stmt.QueryContext(ctx, st.args...)
			res.readRows(rows, err)
		}
	case "sclose":
		if stmt := s.stmts[st.stmt]; stmt != nil {
			res.err = errText(stmt.Close())
			delete(s.stmts, st.stmt)
		}
	case "span":
		res.err = s.span(ctx)
	}
	res.took = time.Since(start)
	s.observe(&res)
	return res
}

// servedCtx is the context a step starts from: on pgryw's side, for a step
// with a deadline, one that notes pgryw's reports of its statements in
// res.served.
func (s *tpSide) servedCtx(st tpStep, res *tpResult) context.Context {
	ctx := context.Background()
	if s.c == nil || st.deadline == 0 {
		return ctx
	}
	return pgryw.WithServedBy(ctx, func(_ context.Context, sb pgryw.ServedBy) {
		res.served += fmt.Sprintf("[%s %s %s wait %v checked %v]", sb.Role, sb.Route, sb.Fallback, sb.Wait.Round(time.Millisecond), sb.Checked)
	})
}

// span reads on each session in turn, every tpIdleStep, for tpIdleSpan
// (no session has a transaction open: see tpGen.span), and returns the
// first error's text. The rows are not compared: which of the other
// sessions' writes a replica read shows is not the point.
func (s *tpSide) span(ctx context.Context) string {
	for i, start := 0, time.Now(); time.Since(start) < tpIdleSpan; i++ {
		rows, err := s.conns[i%tpSessions].QueryContext(ctx, "SELECT count(*) FROM t")
		if err != nil {
			return errText(err)
		}
		rows.Close()
		time.Sleep(tpIdleStep)
	}
	return ""
}

// beforeExec does an Exec step's bookkeeping, before it runs: a block it
// opens or ends (inTx: the session has a transaction of the front end's
// open, which its statements run in), a fault on the pool's connections.
// It returns what to call once the Exec has returned.
func (s *tpSide) beforeExec(st tpStep, inTx bool) (ended func()) {
	ended = func() {}
	if st.sess >= 0 && !inTx {
		ended = s.noteBlock(st)
	}
	if st.sess < 0 && s.poolExec != nil {
		s.poolExec()
	}
	return ended
}

// noteBlock keeps count of Exec'd blocks opened and ended, for the faults:
// a block counts from before its BEGIN is sent until after its COMMIT or
// ROLLBACK returned (the caller calls ended then).
func (s *tpSide) noteBlock(st tpStep) (ended func()) {
	up := strings.ToUpper(st.sql)
	switch {
	case strings.HasPrefix(up, "BEGIN") && !s.block[st.sess]:
		s.block[st.sess] = true
		s.opening()
	case (strings.HasPrefix(up, "COMMIT") || strings.HasPrefix(up, "ROLLBACK")) && s.block[st.sess]:
		s.block[st.sess] = false
		return func() { s.txOpen.Add(-1) }
	}
	return func() {}
}

func (r *tpResult) readRows(rows *sql.Rows, err error) {
	if err != nil {
		r.err = errText(err)
		return
	}
	defer rows.Close()
	r.cols, _ = rows.Columns()
	for rows.Next() {
		vals := make([]any, len(r.cols))
		ptrs := make([]any, len(vals))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			r.err = errText(err)
			return
		}
		r.rows = append(r.rows, tpRow(vals))
	}
	r.err = errText(rows.Err())
}

// tpRow is a row's values as the checker compares them.
func tpRow(vals []any) []string {
	row := make([]string, len(vals))
	for i, v := range vals {
		switch v := v.(type) {
		case nil:
			row[i] = "NULL"
		case []byte:
			row[i] = string(v)
		case time.Time:
			row[i] = v.UTC().Format(time.RFC3339Nano)
		default:
			row[i] = fmt.Sprint(v)
		}
	}
	return row
}

// errText is what a program can tell of an error: a server error by its
// SQLSTATE (and, for the codes a standby also refuses statements with, its
// message: a standby's refusal is not the primary's error of the same
// code), another by its text.
func errText(err error) string {
	if err == nil {
		return ""
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "0A000", "25006", "55000":
			return "SQLSTATE " + pgErr.Code + ": " + pgErr.Message
		}
		return "SQLSTATE " + pgErr.Code
	}
	if errors.Is(err, driver.ErrBadConn) {
		return "driver: bad connection"
	}
	return err.Error()
}

// observe reads, as a third session on the primary, the advisory locks held
// in the database and the notifications sent since the last step (up to a
// notification of its own, which comes after every one committed before
// it).
func (s *tpSide) observe(res *tpResult) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.obs.QueryRow(ctx, `SELECT coalesce(string_agg(objid::text || ' ' || mode || ' ' || granted::text, ', ' ORDER BY objid, mode), '')
		FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&res.locks)
	if err != nil {
		res.locks = "observer: " + err.Error()
		return
	}
	s.sentinel++
	mark := fmt.Sprintf("sentinel %d", s.sentinel)
	if _, err := s.obs.Exec(ctx, "SELECT pg_notify($1, $2)", tpChannel, mark); err != nil {
		res.notified = "observer: " + err.Error()
		return
	}
	var got []string
	for {
		n, err := s.obs.WaitForNotification(ctx)
		if err != nil {
			res.notified = "observer: " + err.Error()
			return
		}
		if n.Payload == mark {
			break
		}
		got = append(got, n.Channel+":"+n.Payload)
	}
	res.notified = strings.Join(got, ", ")
}

// tpFinal reads database db's tables at the end of a program, with a
// connection of its own.
func tpFinal(db string) tpResult {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, tpDSN(db, ""))
	if err != nil {
		return tpResult{err: err.Error()}
	}
	defer conn.Close(ctx)
	var res tpResult
	for _, q := range []string{"SELECT 't', id, v FROM t", "SELECT 's1.t', id, v FROM s1.t", "SELECT 'u', id, 0 FROM u", "SELECT 's', last_value, is_called::int FROM s"} {
		rows, err := conn.Query(ctx, q+" ORDER BY 2")
		if err != nil {
			return tpResult{err: err.Error()}
		}
		for rows.Next() {
			var a string
			var b, c int64
			if err := rows.Scan(&a, &b, &c); err != nil {
				res.err = err.Error()
			}
			res.rows = append(res.rows, []string{a, strconv.FormatInt(b, 10), strconv.FormatInt(c, 10)})
		}
		rows.Close()
	}
	return res
}

// compare runs prog on both sides and returns the first step whose results
// differ (len(prog) for the final contents), or -1.
func (r *tpRun) compare(prog []tpStep, extra string, pseed int64) (int, tpResult, tpResult) {
	var results [2][]tpResult
	var finals [2]tpResult
	if r.proxies != nil {
		r.pooler = tpPoolers[uint64(pseed)%uint64(len(tpPoolers))]
	}
	for side := 0; side < 2; side++ {
		s, err := r.open(side, extra)
		if err != nil {
			r.t.Fatalf("transparency: open side %d: %v", side, err)
		}
		var stopFaults func()
		tpFaultsFired.Store(0)
		tpKills.Store(0)
		if side == 1 && r.faults {
			r.cur.Store(s.c)
			stopFaults = r.startFaults(pseed)
			rng := rand.New(rand.NewPCG(uint64(pseed), 7))
			s.poolExec = func() { r.armPoolFault(s, rng) }
		}
		for _, st := range prog {
			var moves int64
			if s.c != nil {
				moves = s.c.Stats().SnapshotMoves
			}
			var res tpResult
			if side == 1 && st.deadline > 0 {
				end := r.quiet()
				res = s.run(st)
				end()
			} else {
				res = s.run(st)
			}
			res.moved = s.c != nil && s.c.Stats().SnapshotMoves > moves
			results[side] = append(results[side], res)
			if dl := st.timeout(); res.took > dl+tpLiveness {
				r.t.Errorf("transparency: %s took %v on side %d, beyond its deadline %v + %v", st, res.took, side, dl, tpLiveness)
			}
		}
		if stopFaults != nil {
			stopFaults()
		}
		s.close()
		finals[side] = tpFinal(r.dbs[side])
	}
	for i := range prog {
		a, b := results[0][i], results[1][i]
		if a.same(b) {
			continue
		}
		if id := r.intended(prog, results[1][:i], i, a, b); id != "" {
			r.t.Logf("transparency: program seed %d, step %d (%s) differs as intended (%s)", pseed, i, prog[i], id)
			continue
		}
		return i, a, b
	}
	if !finals[0].same(finals[1]) {
		return len(prog), finals[0], finals[1]
	}
	return -1, tpResult{}, tpResult{}
}

// intended returns the id of the intended difference that step i's
// results are, or "".
func (r *tpRun) intended(prog []tpStep, before []tpResult, i int, a, b tpResult) string {
	for _, d := range transparencyIntended {
		if d.accept(prog, before, i, a, b) {
			return d.id
		}
	}
	return ""
}

// minimize drops steps from a failing program while it still fails.
func (r *tpRun) minimize(prog []tpStep, extra string, pseed int64) []tpStep {
	i, _, _ := r.compare(prog, extra, pseed)
	if i < 0 {
		return prog // did not fail again: print it whole
	}
	prog = prog[:min(i+1, len(prog))]
	for k := len(prog) - 2; k >= 0; k-- {
		try := slices.Delete(slices.Clone(prog), k, k+1)
		if j, _, _ := r.compare(try, extra, pseed); j >= 0 {
			prog = try[:min(j+1, len(try))]
			if k > len(prog)-1 {
				k = len(prog) - 1
			}
		}
	}
	return prog
}

// startFaults injects faults while a program runs on pgryw: replay paused
// and resumed, replicas killed (fast shutdown) and started again, replica
// connections cut, reset or stalled, primary connections stalled (at any
// time, or right after a ReadyForQuery, where a write's position answer
// comes). It returns a function that stops them and heals the cluster.
func (r *tpRun) startFaults(pseed int64) func() {
	rng := rand.New(rand.NewPCG(uint64(pseed), 99))
	stop := make(chan struct{})
	done := make(chan struct{})
	var ports []uint16
	addrs := cluster.ReplicaAddrs()
	if r.proxies != nil {
		addrs = nil // faultnet knows connections by the port pgryw dials
		for _, p := range r.proxies {
			addrs = append(addrs, p.Addr())
		}
	}
	for _, a := range addrs {
		_, p, _ := strings.Cut(a, ":")
		n, _ := strconv.Atoi(p)
		ports = append(ports, uint16(n))
	}
	go func() {
		defer close(done)
		ctx := context.Background()
		paused, killed, repointed := -1, -1, -1
		var killedAt, repointedAt time.Time
		for {
			select {
			case <-stop:
				if repointed >= 0 {
					r.proxies[repointed].Repoint(cluster.ReplicaAddrs()[repointed])
				}
				if paused >= 0 {
					cluster.ResumeReplay(ctx, paused)
				}
				if killed >= 0 {
					if err := cluster.StartNode(killed); err != nil {
						r.t.Errorf("transparency: restart replica %d: %v", killed, err)
					}
				}
				return
			case <-time.After(time.Duration(5+rng.IntN(40)) * time.Millisecond):
			}
			if repointed >= 0 && time.Since(repointedAt) > 400*time.Millisecond {
				r.proxies[repointed].Repoint(cluster.ReplicaAddrs()[repointed])
				if paused == (repointed+1)%len(r.proxies) {
					cluster.ResumeReplay(ctx, paused)
					paused = -1
				}
				repointed = -1
			}
			if killed >= 0 && time.Since(killedAt) > 150*time.Millisecond {
				if err := cluster.StartNode(killed); err != nil {
					r.t.Errorf("transparency: restart replica %d: %v", killed, err)
				}
				killed = -1
			}
			switch x := rng.IntN(14); {
			case x >= 12 && repointed < 0 && paused < 0 && killed < 0 && len(r.proxies) > 1:
				// An address that starts leading to the other standby
				// (a DNS name moved, a balancer's target changed) while
				// the connections made through it live on: what pgryw
				// learnt of the old one must not spare reads on new
				// connections their check. The other standby is paused
				// meanwhile (it falls behind what the old one replays);
				// the idle replica connections are let go, so that new
				// ones are made there while those in use (the monitor's,
				// the sessions') go on learning what the old standby
				// replays. (Nothing in use is cut: a cut under a batch's
				// results would fail it, as on any server.)
				repointed, repointedAt = rng.IntN(len(r.proxies)), time.Now()
				paused = (repointed + 1) % len(r.proxies)
				cluster.PauseReplay(ctx, paused)
				r.proxies[repointed].Repoint(cluster.ReplicaAddrs()[paused])
				tpRepoints.Add(1) // (no fault that may show: nothing of it may)
				if c := r.cur.Load(); c != nil {
					pgryw.CloseIdleReplicaConns(c)
				}
			case x < 2:
				if paused < 0 {
					if paused = rng.IntN(len(cluster.Replicas)); paused == killed {
						paused = -1
						break
					}
					cluster.PauseReplay(ctx, paused)
				} else {
					cluster.ResumeReplay(ctx, paused)
					paused = -1
				}
			case x < 5:
				// A transaction on a replica fails with its connection, as
				// one on any server does: cut nothing while one is open.
				f := randomFault(rng)
				r.faultMu.Lock()
				if r.quietSteps.Load() == 0 && (r.txOpen.Load() == 0 || f.Kind == faultnet.Stall) {
					if cs := r.nw.Conns(ports[rng.IntN(len(ports))]); len(cs) > 0 {
						cs[rng.IntN(len(cs))].Arm(f)
					}
				}
				r.faultMu.Unlock()
			case x < 7:
				// A stall, on the primary, changes nothing but when.
				f := faultnet.Fault{Kind: faultnet.Stall, Delay: time.Duration(5+rng.IntN(100)) * time.Millisecond}
				if rng.IntN(2) == 0 {
					f.Kind = faultnet.StallAfterReady
				}
				r.faultMu.Lock()
				if cs := r.nw.Conns(tpPrimaryPort()); len(cs) > 0 && r.quietSteps.Load() == 0 {
					cs[rng.IntN(len(cs))].Arm(f)
				}
				r.faultMu.Unlock()
			case x < 9 && killed < 0 && cluster.Bouncers() == nil:
				// Killed only while no transaction is open, as with cuts;
				// one that begins while it is down goes elsewhere.
				i := rng.IntN(len(cluster.Replicas))
				r.faultMu.Lock()
				if r.txOpen.Load() == 0 && r.quietSteps.Load() == 0 && i != paused {
					if err := cluster.StopNode(i); err != nil {
						r.t.Errorf("transparency: stop replica %d: %v", i, err)
					}
					killed, killedAt = i, time.Now()
					tpFaultsFired.Add(1)
					tpKills.Add(1)
					tpKillsTotal.Add(1)
				}
				r.faultMu.Unlock()
			}
		}
	}()
	return func() {
		close(stop)
		<-done
		r.nw.DisarmAll()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := cluster.WaitCaughtUp(ctx); err != nil {
			r.t.Errorf("transparency: heal: %v", err)
		}
	}
}

// tpStallMax is longer than any stall the checker arms lasts.
const tpStallMax = 350 * time.Millisecond

// quiet holds network faults off a step with a deadline on pgryw's side,
// until the returned function is called: what is armed is disarmed, nothing
// is armed meanwhile, and a stall that fired lately is let run out first. A
// stall makes a round trip slow and changes nothing else: under a deadline
// that is a time-out by design, which pgx, never stalled, would not meet.
// Replay pauses and repointed addresses go on (no replica is stopped
// meanwhile: on two cores, a server's shutdown and start take the CPU a
// read's round trip needs): what pgryw must answer within the deadline is
// a replica behind.
func (r *tpRun) quiet() (end func()) {
	r.faultMu.Lock()
	r.quietSteps.Add(1)
	r.nw.DisarmAll()
	r.faultMu.Unlock()
	if d := time.Until(time.Unix(0, r.lastStall.Load()).Add(tpStallMax)); d > 0 {
		time.Sleep(d)
	}
	return func() { r.quietSteps.Add(-1) }
}

// armPoolFault may arm, before one of the pool's Execs on pgryw's side, a
// cut or a stall right after the next ReadyForQuery on every primary
// connection that no session holds: a write's answer comes whole, and the
// position pgryw reads behind it is lost or late. database/sql discards a
// broken pool connection and tries another, so nothing of it may show: the
// write counts as done, and later reads still see it.
func (r *tpRun) armPoolFault(s *tpSide, rng *rand.Rand) {
	if rng.IntN(2) != 0 {
		return
	}
	f := faultnet.Fault{Kind: faultnet.CutAfterReady}
	if rng.IntN(3) == 0 {
		f = faultnet.Fault{Kind: faultnet.StallAfterReady, Delay: time.Duration(20+rng.IntN(300)) * time.Millisecond}
	}
	for _, c := range r.nw.Conns(tpPrimaryPort()) {
		if !s.held[c.LocalAddr().String()] {
			c.Arm(f)
		}
	}
}

// tpPrimaryPort is the port pgryw's primary connections go to (a bouncer's
// when the cluster has them).
var tpPrimaryPort = sync.OnceValue(func() uint16 {
	cfg, err := pgx.ParseConfig(cluster.WriterDSN())
	if err != nil {
		panic(err)
	}
	return cfg.Port
})

// The grammar.

// tpGen keeps what a program has done so far, so that its steps make sense
// (a COMMIT ends a transaction that is open) and cannot block one another
// (each session writes its own rows).
type tpGen struct {
	native bool // pgx's front end: batches and COPY too
	rng    *rand.Rand
	prog   []tpStep
	inTx   [tpSessions]bool
	roTx   [tpSessions]bool
	block  [tpSessions]bool // an Exec'd BEGIN is open
	nstmts int
	// idle: the program runs under idle_session_timeout (tpIdleTimeout)
	// and has span steps; spans counts them.
	idle  bool
	spans int
}

// tpGenerate draws a program and its DSN run-time parameters.
func tpGenerate(rng *rand.Rand, native bool) ([]tpStep, string) {
	g := &tpGen{rng: rng, native: native}
	// One database/sql program in ten runs under a server idle timeout,
	// with sessions reading alone for longer than it (one span: each
	// costs the run tpIdleSpan). Not through bouncers: PgBouncer refuses
	// idle_session_timeout as a startup parameter.
	g.idle = !native && rng.IntN(10) == 0 && cluster.Bouncers() == nil
	for len(g.prog) < tpSteps {
		g.step()
	}
	if g.idle && g.spans == 0 {
		g.span()
	}
	// End what is open, so the final contents say what committed.
	for s := 0; s < tpSessions; s++ {
		if g.inTx[s] {
			g.add(tpStep{sess: s, op: "commit"})
		}
		if g.block[s] {
			g.add(tpStep{sess: s, op: "exec", sql: "COMMIT"})
		}
	}
	params := [][]string{
		{},
		{"statement_timeout=4000"},
		{"application_name=ryw_tp"},
		{"search_path=public"},
		{"idle_in_transaction_session_timeout=60000", "lock_timeout=2000"},
		{"default_transaction_isolation=repeatable%20read"},
	}
	if g.idle {
		return g.prog, fmt.Sprintf("idle_session_timeout=%d", tpIdleTimeout.Milliseconds())
	}
	return g.prog, strings.Join(params[rng.IntN(len(params))], "&")
}

// span adds, when no session has a transaction open, a span step and
// then a write on each session: each finds its primary connection idle
// for longer than the servers' timeout (pgryw's; pgx's was used
// throughout).
func (g *tpGen) span() {
	for s := 0; s < tpSessions; s++ {
		if g.inTx[s] || g.block[s] {
			return
		}
	}
	g.spans++
	g.add(tpStep{sess: -1, op: "span"})
	for s := 0; s < tpSessions; s++ {
		g.write(s)
	}
}

func (g *tpGen) add(s tpStep) { g.prog = append(g.prog, s) }

// deadline draws a read's deadline: half of them get one below
// pgryw's wait_timeout (300 ms), far above what pgx on the primary takes.
func (g *tpGen) deadline() time.Duration {
	if g.rng.IntN(2) != 0 {
		return 0
	}
	return time.Duration(150+50*g.rng.IntN(3)) * time.Millisecond
}

// id is a row id of session s's own (the pool's for s < 0).
func (g *tpGen) id(s int) int64 { return int64((s+1)*10 + g.rng.IntN(4)) }

func (g *tpGen) pick(xs ...string) string { return xs[g.rng.IntN(len(xs))] }

var tpReads = []string{
	"SELECT id, v FROM t ORDER BY id",
	"SELECT count(*), coalesce(sum(v), 0) FROM t",
	"SELECT stable_sum()",
	"SELECT id FROM my_rows ORDER BY id",
	"SELECT current_setting('app.tenant', true)",
	"SHOW search_path",
	"SELECT current_user",
	"SELECT f()",
	"SELECT public.f()",
	"SELECT id, v FROM s1.t ORDER BY id",
	"SELECT last_value, is_called FROM s",
	"SELECT last_value FROM pg_sequences WHERE schemaname = 'public' AND sequencename = 's'",
	"SELECT count(*) FROM u",
	"SELECT pg_is_in_recovery()",
	"SHOW transaction_read_only",
	"SHOW in_hot_standby",
	"SELECT current_setting('transaction_read_only')",
	"SELECT inet_server_port()",
	"SELECT count(*) FROM pg_stat_replication",
	"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()",
	"SELECT count(*) FROM pg_stat_activity WHERE pid = pg_backend_pid() AND backend_type = 'client backend'",
	"SELECT pg_walfile_name(pg_current_wal_lsn()) IS NOT NULL",
	"SELECT count(*) FROM tt",
	"SELECT count(*) FROM ft",
	"SELECT currval('s')",
	"SELECT 1/0",
	"SELECT * FROM no_such_table",
	"SELECT name FROM pg_prepared_statements WHERE from_sql ORDER BY name",
	"SELECT name FROM pg_cursors WHERE is_holdable ORDER BY name",
	"SELECT pg_listening_channels()",
}

func (g *tpGen) step() {
	s := g.rng.IntN(tpSessions)
	x := g.rng.IntN(100)
	if g.idle && g.spans == 0 && g.rng.IntN(10) == 0 {
		g.span()
		return
	}
	switch {
	case x < 9: // the pool: stateless statements only
		if g.rng.IntN(2) == 0 {
			g.add(tpStep{sess: -1, op: "exec", sql: "INSERT INTO t VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET v = t.v + 1", args: []any{g.id(-1), int64(1)}})
		} else {
			g.add(tpStep{sess: -1, op: "query", sql: "SELECT id, v FROM t ORDER BY id", deadline: g.deadline()})
		}
	case x < 22:
		g.write(s)
	case x < 45:
		q := tpReads[g.rng.IntN(len(tpReads))]
		if g.idle && q == "SELECT currval('s')" {
			// A primary connection the server ended for idleness is
			// replaced with the session's settings, not its sequences'
			// currval (docs/guarantees.md#idle-sessions).
			q = "SELECT last_value, is_called FROM s"
		}
		g.add(tpStep{sess: s, op: "query", sql: q, deadline: g.deadline()})
	case x < 55:
		g.session(s)
	case x < 68:
		g.tx(s)
	case x < 74:
		g.blockStep(s)
	case x < 82:
		g.prepared(s)
	case g.native && x < 90:
		g.nativeStep(s)
	default:
		g.misc(s)
	}
}

func (g *tpGen) write(s int) {
	id, v := g.id(s), int64(g.rng.IntN(100))
	switch g.rng.IntN(9) {
	case 0:
		g.add(tpStep{sess: s, op: "exec", sql: "INSERT INTO t VALUES ($1, $2)", args: []any{id, v}})
	case 1:
		g.add(tpStep{sess: s, op: "exec", sql: "UPDATE t SET v = v + 1 WHERE id = $1", args: []any{id}})
	case 2:
		g.add(tpStep{sess: s, op: "exec", sql: "DELETE FROM t WHERE id = $1", args: []any{id}})
	case 3:
		g.add(tpStep{sess: s, op: "query", sql: "INSERT INTO t VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET v = excluded.v RETURNING id, v", args: []any{id, v}})
	case 4:
		g.add(tpStep{sess: s, op: "exec", sql: fmt.Sprintf("INSERT INTO t VALUES (%d, %d) ON CONFLICT DO NOTHING; UPDATE t SET v = v + 1 WHERE id = %d", id, v, id)})
	case 5:
		g.add(tpStep{sess: s, op: "exec", sql: "INSERT INTO u VALUES ($1) ON CONFLICT DO NOTHING", args: []any{id}})
	case 6:
		g.add(tpStep{sess: s, op: "query", sql: g.pick("SELECT nextval('s')", "SELECT setval('s', 100)")})
	case 7:
		g.add(tpStep{sess: s, op: "exec", sql: "INSERT INTO t VALUES ($1, NULL)", args: []any{id}}) // 23502
	default:
		g.add(tpStep{sess: s, op: "exec", sql: fmt.Sprintf("INSERT INTO s1.t VALUES (%d, %d) ON CONFLICT DO NOTHING", id, v)})
	}
}

func (g *tpGen) session(s int) {
	switch g.rng.IntN(12) {
	case 0:
		g.add(tpStep{sess: s, op: "exec", sql: g.pick("SET search_path = s1, public", "SET search_path = public", "RESET search_path")})
	case 1:
		g.add(tpStep{sess: s, op: "query", sql: "SELECT set_config('app.tenant', $1, false)", args: []any{g.pick("a", "b")}})
	case 2:
		g.add(tpStep{sess: s, op: "query", sql: "SELECT set_tenant($1)", args: []any{g.pick("a", "b")}})
	case 3:
		g.add(tpStep{sess: s, op: "exec", sql: g.pick("SET ROLE ryw_t_role", "RESET ROLE")})
	case 4:
		g.add(tpStep{sess: s, op: "query", sql: g.pick("SELECT pg_try_advisory_lock($1)", "SELECT pg_advisory_unlock($1)", "SELECT lock_it($1)"), args: []any{int64(1 + g.rng.IntN(3))}})
	case 5:
		g.add(tpStep{sess: s, op: "query", sql: "SELECT pg_advisory_unlock_all()"})
	case 6:
		g.add(tpStep{sess: s, op: "exec", sql: g.pick("CREATE TEMP TABLE tt (i int)", "INSERT INTO tt VALUES (1)", "DROP TABLE tt", "SELECT make_temp()", "DROP TABLE IF EXISTS ft")})
	case 7:
		// Not DEALLOCATE ALL: it leaves pgx's own cache of prepared
		// statements out of step with the server, and which of them fail
		// afterwards depends on what that connection ran before
		// (transparencyIntended, "deallocate-all").
		g.add(tpStep{sess: s, op: "exec", sql: g.pick("PREPARE p1 AS SELECT count(*) FROM t", "DEALLOCATE p1")})
	case 8:
		g.add(tpStep{sess: s, op: "query", sql: "EXECUTE p1"})
	case 9:
		g.add(tpStep{sess: s, op: g.pick("exec", "query"), sql: g.pick("DECLARE c1 CURSOR WITH HOLD FOR SELECT id FROM t ORDER BY id", "FETCH 2 FROM c1", "CLOSE c1")})
	case 10:
		g.add(tpStep{sess: s, op: "exec", sql: g.pick("LISTEN "+tpChannel, "UNLISTEN *", "NOTIFY "+tpChannel+", 'hello'")})
	default:
		g.add(tpStep{sess: s, op: "query", sql: "SELECT pg_notify($1, $2)", args: []any{tpChannel, g.pick("x", "y")}})
	}
}

func (g *tpGen) tx(s int) {
	if g.block[s] {
		return
	}
	if !g.inTx[s] {
		levels := []sql.IsolationLevel{sql.LevelDefault, sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable}
		ro := g.rng.IntN(2) == 0
		g.add(tpStep{sess: s, op: "begin", tx: sql.TxOptions{Isolation: levels[g.rng.IntN(len(levels))], ReadOnly: ro}})
		g.inTx[s], g.roTx[s] = true, ro
		return
	}
	switch g.rng.IntN(8) {
	case 0:
		g.add(tpStep{sess: s, op: g.pick("commit", "rollback")})
		g.inTx[s] = false
	case 1:
		g.add(tpStep{sess: s, op: "exec", sql: g.pick("SAVEPOINT sp", "ROLLBACK TO SAVEPOINT sp", "RELEASE SAVEPOINT sp")})
	case 2:
		g.add(tpStep{sess: s, op: "query", sql: "SELECT pg_try_advisory_xact_lock($1)", args: []any{int64(1 + g.rng.IntN(3))}})
	case 3:
		g.add(tpStep{sess: s, op: "exec", sql: g.pick("SET LOCAL search_path = s1, public", "SET search_path = s1, public", "SET LOCAL app.tenant = 'b'")})
	case 4:
		g.session(s)
	case 5:
		g.write(s)
	default:
		g.add(tpStep{sess: s, op: "query", sql: tpReads[g.rng.IntN(len(tpReads))]})
	}
}

func (g *tpGen) blockStep(s int) {
	if g.inTx[s] {
		return
	}
	if !g.block[s] {
		g.add(tpStep{sess: s, op: "exec", sql: g.pick("BEGIN", "BEGIN READ ONLY", "BEGIN ISOLATION LEVEL REPEATABLE READ")})
		g.block[s] = true
		return
	}
	switch g.rng.IntN(3) {
	case 0:
		g.add(tpStep{sess: s, op: "exec", sql: g.pick("COMMIT", "ROLLBACK")})
		g.block[s] = false
	case 1:
		g.write(s)
	default:
		g.add(tpStep{sess: s, op: "query", sql: tpReads[g.rng.IntN(len(tpReads))]})
	}
}

func (g *tpGen) prepared(s int) {
	if g.native && g.inTx[s] && g.roTx[s] {
		// pgx.Tx.Prepare moves a read-only transaction from its replica
		// to the primary, where the named statement lives (an intended
		// difference: its snapshot is the primary's from then on).
		return
	}
	if g.nstmts == 0 || g.rng.IntN(3) == 0 {
		q := g.pick("SELECT v FROM t WHERE id = $1", "INSERT INTO t VALUES ($1, 1) ON CONFLICT (id) DO UPDATE SET v = t.v + 1",
			"SELECT * FROM no_such_table WHERE id = $1", "SELECT count(*) FROM t")
		g.add(tpStep{sess: s, op: "prepare", sql: q, stmt: g.nstmts})
		g.nstmts++
		return
	}
	k := g.rng.IntN(g.nstmts)
	switch g.rng.IntN(6) {
	case 0:
		g.add(tpStep{sess: s, op: "sclose", stmt: k})
	case 1:
		g.add(tpStep{sess: s, op: "squery", stmt: k, args: []any{g.id(s), int64(2)}}) // maybe one too many
	case 2, 3:
		g.add(tpStep{sess: s, op: "sexec", stmt: k, args: []any{g.id(s)}})
	default:
		g.add(tpStep{sess: s, op: "squery", stmt: k, args: []any{g.id(s)}})
	}
}

func (g *tpGen) misc(s int) {
	switch g.rng.IntN(5) {
	case 0:
		g.add(tpStep{sess: s, op: "exec", sql: g.pick("SELECT 1; SELECT 1/0", "DO $$BEGIN PERFORM 1; END$$", "DO $$BEGIN PERFORM set_config('app.tenant', 'b', false); END$$")})
	case 1:
		g.add(tpStep{sess: s, op: "query", sql: "SELECT 1; SELECT 2"})
	case 2:
		g.add(tpStep{sess: s, op: "query", sql: "SELECT v FROM t WHERE id = $1", args: []any{g.id(s)}})
	case 3:
		g.add(tpStep{sess: s, op: "exec", sql: "SHOW transaction_isolation"})
	default:
		g.add(tpStep{sess: s, op: "query", sql: "SELECT count(*) FROM t WHERE v > $1", args: []any{int64(g.rng.IntN(50))}})
	}
}
