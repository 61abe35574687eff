// Command rywbench measures what reading your own writes from PostgreSQL
// streaming replicas costs, strategy against strategy, in one process.
//
// Each worker inserts a fresh row on the primary and at once reads it back by
// id. A read is stale when the row is missing or has the wrong value; it was
// served by a replica when the inet_server_port() (through a STABLE wrapper) returned by the same query
// differs from the primary's. The strategies:
//
//	sticky-primary    insert and read on the primary (plain pgx stdlib)
//	naive-replica     read from a replica right away (plain pgx)
//	spin-floor        read from a replica again and again, at once, until the
//	                  row is there: the earliest moment the replica can answer
//	                  with it, the floor for a read after a write (it
//	                  overshoots by about half a round trip)
//	sleep-replica     sleep -sleep, then read from a replica
//	two-round-trip    fetch the primary's WAL insert position, wait until the
//	                  replica has replayed it (at most -budget), then read the
//	                  replica, or the primary if the budget ran out
//	pgryw             insert and read through one pgryw pool (defaults:
//	                  session_scope=db)
//	pgryw-session     the same with session_scope=conn and a pgryw.Session
//	                  per insert-and-read
//	plain-write       the insert alone, plain pgx stdlib
//	pgryw-write       the insert alone, through a pgryw pool with replicas
//	replica-read      a read of a row written before the run, from a replica
//	                  (plain pgx), with no write
//	pgryw-read        the same through a pgryw pool that never writes (no
//	                  pending watermark)
//	pgryw-no-replica  insert and read through a pgryw pool without replicas
//
// and, only when named (-strategies all), the wire-level models of models.go.
// The end of the report judges the benchmark targets on the run, PASS or FAIL
// with the ratios measured.
//
// The strategies run interleaved: each of -rounds rounds runs every strategy
// for a slice of the iterations, in rotating order, so machine noise hits all
// of them alike. Read latency is the read call only (for two-round-trip it
// includes the position fetch and the wait, for sleep-replica the sleep);
// write latency is the insert call (for pgryw it includes pgryw's capture of
// the primary's position).
//
// Server cost: around each slice, the CPU time of each node's process tree
// (/proc; local cluster) and, with -pgss, the statements it executed
// (pg_stat_statements) are read, and reported per iteration.
//
// -load runs the load test instead (load.go): 32 workers, mixed writes and
// reads, throughput and the server connections each node sees, judged
// against the load targets. -pgryw key=value adds a DSN key to every pgryw
// strategy (-pgryw read_your_writes=off: pgryw's routing alone).
//
// Without -primary, rywbench starts a local primary and -replicas streaming
// replicas from the PostgreSQL server binaries (internal/pgtest), with
// recovery_min_apply_delay set to -delay to simulate lag, and stops them when
// it exits. With -primary and -replica it uses running servers instead.
//
// Usage:
//
//	go run ./cmd/rywbench                       # the default strategies, no lag
//	go run ./cmd/rywbench -delay 50ms           # replicas 50ms behind
//	go run ./cmd/rywbench -strategies all -pgss # with the models and statement counts
//	go run ./cmd/rywbench -load -replicas 2     # the load test
//	go run ./cmd/rywbench -demo                 # what `make demo` runs
//	go run ./cmd/rywbench -json > result.json
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/ctxsleep"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// warmupIterations is how many uncounted iterations each worker runs per
// strategy before measuring: it opens the pools' connections and fills the
// statement caches.
const warmupIterations = 5

type config struct {
	workers, iterations, rounds, replicas int
	repeat                                int // -repeat: whole measurements on the same servers
	delay, budget, sleep                  time.Duration
	strategies                            []string
	json, demo                            bool
	primary                               string
	cpuProfile                            string
	replicaDSNs                           []string
	explicit                              map[string]bool // strategies named one by one, not by "all"
	mix                                   bool            // -mix: strategies mixed within each worker's loop
	pgss                                  bool            // count statements with pg_stat_statements
	settings                              []string        // -conf: extra postgresql.conf lines
	load                                  bool            // the load test instead of the latency run
	loadTime                              time.Duration
	writeShare                            float64
}

// stringList is a repeatable string flag.
type stringList []string

// String implements flag.Value.
func (l *stringList) String() string { return strings.Join(*l, ",") }

// Set implements flag.Value: each -replica flag adds one.
func (l *stringList) Set(s string) error { *l = append(*l, s); return nil }

func parseFlags() (*config, error) {
	var (
		cfg        config
		strategies string
		replicas   stringList
		settings   stringList
	)
	flag.IntVar(&cfg.workers, "workers", 8, "concurrent workers (and pool size)")
	flag.IntVar(&cfg.iterations, "iterations", 200, "measured iterations per worker per strategy")
	flag.IntVar(&cfg.rounds, "rounds", 10, "rounds to split the iterations into")
	flag.IntVar(&cfg.repeat, "repeat", 1, "measure this many times on the same servers, each with its warm-up and rounds; the target lines are then judged on the median of the runs' ratios, printed with their range (not with -load)")
	flag.IntVar(&cfg.replicas, "replicas", 1, "replicas to start (local cluster only)")
	flag.DurationVar(&cfg.delay, "delay", 0, "recovery_min_apply_delay on the replicas (local cluster only)")
	flag.DurationVar(&cfg.budget, "budget", 500*time.Millisecond, "how long a read may wait for a replica (two-round-trip, pgryw wait_timeout)")
	flag.DurationVar(&cfg.sleep, "sleep", 50*time.Millisecond, "sleep-replica's pause before reading")
	flag.StringVar(&strategies, "strategies", "default", "comma-separated strategies to run; \"default\" = "+strings.Join(defaultStrategies, ",")+
		"; \"all\" adds the wire-level models "+strings.Join(modelStrategies, ",")+"; with -load: "+strings.Join(loadStrategies, ","))
	flag.BoolVar(&cfg.mix, "mix", false, "interleave the strategies iteration by iteration within each worker, in a new random order each time, instead of running one strategy at a time (finer interleaving; no server cost per strategy)")
	flag.BoolVar(&cfg.pgss, "pgss", false, "count the statements each strategy makes the servers run, with pg_stat_statements (loaded into a local cluster; given servers must have it in shared_preload_libraries)")
	flag.Var(&settings, "conf", "a postgresql.conf line for every node of a local cluster, e.g. -conf \"hot_standby_feedback = off\"; repeatable")
	flag.BoolVar(&cfg.load, "load", false, "load test: -workers (default 32) run mixed writes and reads for -load-time per strategy; reports throughput, CPU and statements per operation, and the server connections each node sees")
	flag.DurationVar(&cfg.loadTime, "load-time", 6*time.Second, "with -load: measured time per strategy, split over -rounds")
	flag.Float64Var(&cfg.writeShare, "write-share", 0.2, "with -load: share of operations that are writes")
	flag.Var(&pgrywKeys, "pgryw", "a pgryw DSN key=value added to every pgryw strategy's DSN after rywbench's own, e.g. -pgryw capture=always; repeatable")
	flag.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write the client's CPU profile (runtime/pprof) of the whole run to this file")
	flag.BoolVar(&cfg.json, "json", false, "print one JSON object instead of the table")
	flag.BoolVar(&cfg.demo, "demo", false, "short demo: 1 replica 50ms behind, naive-replica vs pgryw (explicit flags still win)")
	flag.StringVar(&cfg.primary, "primary", "", "primary's pgx DSN (instead of starting a local cluster)")
	flag.Var(&replicas, "replica", "a replica's pgx DSN; repeatable; needs -primary (pgryw takes only its host:port and the primary's credentials)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: rywbench [flags]\n\nCompares read-your-writes strategies on PostgreSQL streaming replicas.\n\nFlags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %s", strings.Join(flag.Args(), " "))
	}

	if cfg.demo {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		for _, kv := range [][2]string{
			{"replicas", "1"}, {"delay", "50ms"}, {"budget", "500ms"}, {"workers", "4"},
			{"iterations", "50"}, {"rounds", "4"}, {"strategies", naiveReplica + "," + pgrywName},
		} {
			if !set[kv[0]] {
				if err := flag.Set(kv[0], kv[1]); err != nil {
					return nil, err
				}
			}
		}
	}
	cfg.replicaDSNs = replicas
	cfg.settings = settings
	if cfg.load {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["workers"] {
			cfg.workers = 32
		}
		if !set["rounds"] {
			cfg.rounds = 3
		}
	}

	known, def := allStrategies, defaultStrategies
	if cfg.load {
		known, def = loadStrategies, loadStrategies
	}
	seen := map[string]bool{}
	cfg.explicit = map[string]bool{}
	for _, s := range strings.Split(strategies, ",") {
		s = strings.TrimSpace(s)
		switch {
		case s == "default":
			for _, d := range def {
				seen[d] = true
			}
		case s == "all":
			for _, d := range known {
				seen[d] = true
			}
		case s == "pgx" && !cfg.load:
			for _, d := range pgxStrategies {
				seen[d] = true
			}
		case !slices.Contains(known, s):
			return nil, fmt.Errorf("-strategies: unknown strategy %q (known: %s)", s, strings.Join(known, ", "))
		default:
			seen[s] = true
			cfg.explicit[s] = true
		}
	}
	for _, s := range known { // table order
		if seen[s] {
			cfg.strategies = append(cfg.strategies, s)
		}
	}

	switch {
	case cfg.workers < 1 || cfg.iterations < 1 || cfg.rounds < 1 || cfg.repeat < 1:
		return nil, errors.New("-workers, -iterations, -rounds and -repeat must be at least 1")
	case cfg.load && cfg.repeat > 1:
		return nil, errors.New("-repeat applies to the latency run, not to -load (its rounds already alternate the strategies)")
	case cfg.budget < time.Millisecond:
		return nil, errors.New("-budget must be at least 1ms")
	case cfg.delay < 0 || cfg.sleep < 0:
		return nil, errors.New("-delay and -sleep must not be negative")
	case cfg.load && (cfg.loadTime < 100*time.Millisecond || cfg.writeShare < 0 || cfg.writeShare > 1):
		return nil, errors.New("-load-time must be at least 100ms and -write-share between 0 and 1")
	case cfg.mix && cfg.pgss:
		return nil, errors.New("-pgss needs one strategy at a time: not with -mix")
	case cfg.primary != "" && len(cfg.settings) > 0:
		return nil, errors.New("-conf applies only to a local cluster, not with -primary")
	case cfg.primary == "" && len(cfg.replicaDSNs) > 0:
		return nil, errors.New("-replica needs -primary")
	case cfg.primary != "" && len(cfg.replicaDSNs) == 0:
		return nil, errors.New("-primary needs at least one -replica")
	case cfg.primary == "" && cfg.replicas < 1:
		return nil, errors.New("-replicas must be at least 1")
	}
	if cfg.primary != "" {
		cfg.replicas = len(cfg.replicaDSNs)
	}
	if !cfg.load {
		cfg.rounds = min(cfg.rounds, cfg.iterations)
	}
	return &cfg, nil
}

func main() {
	cfg, err := parseFlags()
	if err != nil {
		fmt.Fprintln(os.Stderr, "rywbench:", err)
		os.Exit(2)
	}
	os.Exit(run(cfg))
}

// run does the work and returns the exit code, so that deferred clean-up
// (the cluster above all) runs before the process exits.
func run(cfg *config) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C kills at once; the servers die with us
	}()

	if cfg.cpuProfile != "" {
		f, err := os.Create(cfg.cpuProfile)
		if err != nil {
			return fail(ctx, err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fail(ctx, err)
		}
		defer pprof.StopCPUProfile()
	}
	start := time.Now()
	e, err := setup(ctx, cfg)
	if e != nil {
		defer e.close()
	}
	if err != nil {
		return fail(ctx, err)
	}
	setupTime := time.Since(start)

	if cfg.load {
		res, err := runLoad(ctx, cfg, e, newProgress())
		if err != nil {
			return fail(ctx, err)
		}
		elapsed := time.Since(start)
		if cfg.json {
			err = printLoadJSON(os.Stdout, cfg, e, res, elapsed)
		} else {
			printLoadText(os.Stdout, cfg, e, res, elapsed, setupTime)
		}
		if err != nil {
			return fail(ctx, err)
		}
		for _, r := range res {
			if r.Errors > 0 {
				// Operations that failed are not throughput: a run with
				// any is no measurement.
				fmt.Fprintf(os.Stderr, "rywbench: -load: %s had %d errors (first: %s)\n", r.Name, r.Errors, r.FirstError)
				return 1
			}
		}
		return 0
	}

	b := &bench{cfg: cfg, env: e, progress: newProgress()}
	var (
		sums []summary
		runs [][]target // each run's target lines, with -repeat
	)
	for k := range cfg.repeat {
		if cfg.repeat > 1 {
			b.progress.line(fmt.Sprintf("run %d of %d", k+1, cfg.repeat))
		}
		results, err := b.run(ctx)
		if err != nil {
			b.progress.done()
			return fail(ctx, err)
		}
		sums = make([]summary, len(results))
		for i, r := range results {
			sums[i] = r.summarize()
		}
		runs = append(runs, targets(sums, e.serverVersionNum, cfg.delay > 0))
	}
	b.progress.done()
	elapsed := time.Since(start)
	if cfg.json {
		err = printJSON(os.Stdout, cfg, e, sums, runs, elapsed)
	} else {
		printText(os.Stdout, cfg, e, sums, runs, elapsed, setupTime)
	}
	if err != nil {
		return fail(ctx, err)
	}
	return 0
}

func fail(ctx context.Context, err error) int {
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "rywbench: interrupted; stopping")
		return 130
	}
	fmt.Fprintln(os.Stderr, "rywbench:", err)
	return 1
}

// env is the servers and pools a run uses.
type env struct {
	cluster          *pgtest.Cluster // nil with -primary
	primaryDSN       string
	replicaAddrs     []string                  // host:port, for pgryw's replicas key
	pools            *pools                    // the setup's own
	basePools        map[string]*pools         // each plain-pgx strategy's own, by name
	pgryws           map[string]*pgrywStrategy // the pgryw strategies that run, by name
	models           map[string]*model         // the wire-level models that run, by name
	meter            *costMeter
	primaryPort      int64
	serverVersion    string
	serverVersionNum int
	tables           []string
	// scopeHost: each pgryw strategy's writer address on a local
	// cluster (scopes.go); nil with -primary.
	scopeHost map[string]string
}

func (e *env) close() {
	if e.pools != nil && len(e.tables) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		for _, t := range e.tables {
			e.pools.primary.ExecContext(ctx, "DROP TABLE IF EXISTS "+t)
		}
		cancel()
	}
	for _, p := range e.pgryws {
		if p.pool != nil {
			p.pool.Close()
		} else {
			p.db.Close()
		}
	}
	for _, m := range e.models {
		m.close()
	}
	e.meter.close()
	for _, p := range e.basePools {
		p.close()
	}
	if e.pools != nil {
		e.pools.primary.Close()
		for _, r := range e.pools.replicas {
			r.Close()
		}
	}
	e.cluster.Close() // safe on nil
}

// setup starts or finds the servers, opens the pools, checks the replicas
// and creates one table per strategy. The returned env, when not nil, must be
// closed even if err is not nil.
func setup(ctx context.Context, cfg *config) (*env, error) {
	e := &env{}
	if cfg.primary == "" {
		fmt.Fprintf(os.Stderr, "rywbench: starting a local PostgreSQL primary and %d replica(s), apply delay %v...\n", cfg.replicas, cfg.delay)
		t0 := time.Now()
		startCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		var settings []string
		// Every strategy has pools of its own, up to -workers connections
		// each on every node; pgtest allows 200.
		if need := cfg.workers*(len(cfg.strategies)+2) + 50; need > 200 {
			settings = append(settings, fmt.Sprintf("max_connections = %d", need))
		}
		// Each pgryw strategy's writer address, for a cluster scope of its
		// own (scopes.go); not for the load test, whose pools are open one
		// strategy at a time.
		if !cfg.load {
			var hosts []string
			e.scopeHost, hosts = scopeHosts(scopedKinds(cfg.strategies), canListen)
			if len(hosts) > 1 {
				settings = append(settings, listenLine(hosts))
			}
		}
		settings = append(settings, cfg.settings...) // -conf wins
		if cfg.pgss {
			// Before -conf's lines, which may extend it.
			settings = append([]string{"shared_preload_libraries = 'pg_stat_statements'", "pg_stat_statements.max = 50000"}, settings...)
		}
		c, err := pgtest.Start(startCtx, pgtest.Options{Replicas: cfg.replicas, ApplyDelay: cfg.delay, Settings: settings})
		cancel()
		if err != nil {
			if errors.Is(err, pgtest.ErrNoServer) {
				return nil, fmt.Errorf("cannot start a local PostgreSQL cluster: %v\n"+
					"rywbench: install the server (apt-get install -y postgresql) or set PGRYW_PG_BINDIR to its bin directory,\n"+
					"rywbench: or point rywbench at running servers with -primary DSN -replica DSN", err)
			}
			if dir := os.Getenv("PGRYW_PG_BINDIR"); dir != "" {
				return nil, fmt.Errorf("cannot start a local PostgreSQL cluster: %w\n"+
					"rywbench: check PGRYW_PG_BINDIR=%s (the PostgreSQL bin directory; unset it to search the usual places)", err, dir)
			}
			return nil, fmt.Errorf("cannot start a local PostgreSQL cluster: %w", err)
		}
		fmt.Fprintf(os.Stderr, "rywbench: cluster up in %v\n", time.Since(t0).Round(time.Millisecond))
		e.cluster = c
		e.primaryDSN = c.WriterDSN()
		e.replicaAddrs = c.ReplicaAddrs()
		cfg.replicaDSNs = nil
		for i := range c.Replicas {
			cfg.replicaDSNs = append(cfg.replicaDSNs, c.ReplicaDSN(i))
		}
	} else {
		if cfg.delay != 0 {
			fmt.Fprintln(os.Stderr, "rywbench: -delay applies only to a local cluster; ignored with -primary")
			cfg.delay = 0
		}
		e.primaryDSN = cfg.primary
		for _, d := range cfg.replicaDSNs {
			pc, err := pgx.ParseConfig(d)
			if err != nil {
				return e, fmt.Errorf("-replica: %w", err)
			}
			e.replicaAddrs = append(e.replicaAddrs, net.JoinHostPort(pc.Host, strconv.Itoa(int(pc.Port))))
		}
	}

	open := func(dsn string) (*sql.DB, error) {
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			return nil, err
		}
		db.SetMaxOpenConns(cfg.workers)
		db.SetMaxIdleConns(cfg.workers) // database/sql keeps only 2 by default
		return db, nil
	}
	p := &pools{budget: cfg.budget, sleep: cfg.sleep}
	e.pools = p
	var err error
	if p.primary, err = open(e.primaryDSN); err != nil {
		return e, fmt.Errorf("primary: %w", err)
	}
	for _, d := range cfg.replicaDSNs {
		db, err := open(d)
		if err != nil {
			return e, fmt.Errorf("replica: %w", err)
		}
		p.replicas = append(p.replicas, db)
	}

	err = p.primary.QueryRowContext(ctx, "SELECT current_setting('server_version'), current_setting('server_version_num')::int, inet_server_port()").
		Scan(&e.serverVersion, &e.serverVersionNum, &e.primaryPort)
	if err != nil {
		return e, fmt.Errorf("primary: %w", err)
	}
	p.waitFor = true
	for i, r := range p.replicas {
		var (
			num   int
			inRec bool
			port  sql.NullInt64
		)
		if err := r.QueryRowContext(ctx, "SELECT current_setting('server_version_num')::int, pg_is_in_recovery(), inet_server_port()").Scan(&num, &inRec, &port); err != nil {
			return e, fmt.Errorf("replica %s: %w", e.replicaAddrs[i], err)
		}
		if !inRec {
			return e, fmt.Errorf("replica %s is not a standby (pg_is_in_recovery() is false)", e.replicaAddrs[i])
		}
		if port.Int64 == e.primaryPort {
			fmt.Fprintf(os.Stderr, "rywbench: warning: replica %s answers inet_server_port() = %d like the primary; the replica share will read as 0\n", e.replicaAddrs[i], port.Int64)
		}
		p.waitFor = p.waitFor && num >= 190000 // WAIT FOR LSN is new in PostgreSQL 19
	}

	if cfg.pgss {
		if _, err := p.primary.ExecContext(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
			return e, fmt.Errorf("-pgss: %w (a local cluster loads it; given servers need it in shared_preload_libraries)", err)
		}
	}
	if _, err := p.primary.ExecContext(ctx, createPortFunction); err != nil {
		return e, fmt.Errorf("create %s(): %w", portFunction, err)
	}
	if cfg.load {
		if err := setupLoad(ctx, cfg, e); err != nil {
			return e, err
		}
		// The sampler leaves the meter's connections out by their name.
		named := func(dsn string) (*sql.DB, error) {
			return open(withParams(dsn, [][2]string{{"application_name", meterAppName}}))
		}
		e.meter, err = newCostMeter(ctx, named, e.primaryDSN, cfg.replicaDSNs, e.dataDirs(), cfg.pgss)
		return e, err
	}

	e.pgryws = map[string]*pgrywStrategy{}
	e.models = map[string]*model{}
	e.basePools = map[string]*pools{}
	for _, s := range cfg.strategies {
		switch {
		case !slices.Contains(pgrywKinds, s) && !slices.Contains(modelStrategies, s):
			// Pools of its own, as each pgryw strategy has: a pool shared
			// by several strategies hands each worker other connections
			// than one of its own would (measurably slower here).
			bp := &pools{budget: p.budget, sleep: p.sleep, waitFor: p.waitFor}
			e.basePools[s] = bp
			if isPgx(s) {
				if bp.xprimary, err = openPgxpool(ctx, e.primaryDSN, cfg.workers); err != nil {
					return e, err
				}
				for _, d := range cfg.replicaDSNs {
					x, err := openPgxpool(ctx, d, cfg.workers)
					if err != nil {
						return e, err
					}
					bp.xreplicas = append(bp.xreplicas, x)
				}
				continue
			}
			if bp.primary, err = open(e.primaryDSN); err != nil {
				return e, err
			}
			for _, d := range cfg.replicaDSNs {
				db, err := open(d)
				if err != nil {
					return e, err
				}
				bp.replicas = append(bp.replicas, db)
			}
		case slices.Contains(pgrywKinds, s):
			ps, err := newPgryw(s, e.pgrywDSN(s), e.replicaAddrs, cfg.budget, cfg.workers)
			if err != nil {
				return e, err
			}
			e.pgryws[s] = ps
		case slices.Contains(modelStrategies, s):
			if (s == wireWaitFor || s == wireWaitForTrail) && !p.waitFor {
				if cfg.explicit[s] {
					return e, fmt.Errorf("-strategies: %s needs WAIT FOR LSN, new in PostgreSQL 19; these servers run %s", s, e.serverVersion)
				}
				continue
			}
			e.models[s] = newModel(s, e, cfg)
		}
	}
	// "all" named the WAIT FOR models; on older servers they are left out.
	cfg.strategies = slices.DeleteFunc(cfg.strategies, func(s string) bool {
		return (s == wireWaitFor || s == wireWaitForTrail) && e.models[s] == nil
	})

	// The preloaded table first: once a replica shows the tables created
	// after it, it has its rows too.
	tables := []string{preloadTable}
	for _, s := range cfg.strategies {
		tables = append(tables, tableName(s))
	}
	for _, t := range tables {
		e.tables = append(e.tables, t)
		for _, q := range []string{"DROP TABLE IF EXISTS " + t, "CREATE TABLE " + t + " (id bigint PRIMARY KEY, v bigint NOT NULL)"} {
			if _, err := p.primary.ExecContext(ctx, q); err != nil {
				return e, fmt.Errorf("create table %s: %w", t, err)
			}
		}
		if t == preloadTable {
			if _, err := p.primary.ExecContext(ctx, "INSERT INTO "+preloadTable+" SELECT g, 2*g+1 FROM generate_series(1, $1::bigint) g", preloadRows); err != nil {
				return e, fmt.Errorf("fill %s: %w", preloadTable, err)
			}
		}
	}
	if err := waitForTables(ctx, e, cfg.delay); err != nil {
		return e, err
	}
	e.meter, err = newCostMeter(ctx, open, e.primaryDSN, cfg.replicaDSNs, e.dataDirs(), cfg.pgss)
	return e, err
}

// openPgxpool opens a pgxpool of size conns on dsn, its connections made
// at once (as database/sql's pools keep theirs idle once made).
func openPgxpool(ctx context.Context, dsn string, size int) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	pc.MaxConns, pc.MinIdleConns = int32(size), int32(size)
	return pgxpool.NewWithConfig(ctx, pc)
}

// dataDirs returns the nodes' data directories, primary first, when the
// cluster is local (for CPU readings from /proc), else nil.
func (e *env) dataDirs() []string {
	if e.cluster == nil || e.cluster.Provider != "local" {
		return nil
	}
	dirs := []string{e.cluster.Writer.DataDir}
	for _, r := range e.cluster.Replicas {
		dirs = append(dirs, r.DataDir)
	}
	return dirs
}

// waitForTables waits until every replica shows every table, and so
// everything written before the last one was created (the preloaded rows,
// pg_stat_statements).
func waitForTables(ctx context.Context, e *env, delay time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second+delay)
	defer cancel()
	for i, r := range e.pools.replicas {
		for _, t := range e.tables {
			for {
				var ok bool
				if err := r.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL", t).Scan(&ok); err != nil {
					return fmt.Errorf("replica %s: waiting for table %s: %w", e.replicaAddrs[i], t, err)
				}
				if ok {
					break
				}
				if err := ctxsleep.Sleep(ctx, 10*time.Millisecond); err != nil {
					return fmt.Errorf("replica %s: waiting for table %s: %w", e.replicaAddrs[i], t, err)
				}
			}
		}
	}
	return nil
}

// bench runs the strategies interleaved.
type bench struct {
	cfg      *config
	env      *env
	progress *progress
	ids      []atomic.Int64 // the next row per strategy's table, across -repeat's runs
}

func (b *bench) strategies() []strategy {
	var out []strategy
	for _, name := range b.cfg.strategies {
		if p, ok := b.env.pgryws[name]; ok {
			out = append(out, p)
		} else if m, ok := b.env.models[name]; ok {
			out = append(out, m)
		} else {
			out = append(out, newBaseline(name, b.env.basePools[name]))
		}
	}
	return out
}

func (b *bench) run(ctx context.Context) ([]*result, error) {
	strats := b.strategies()
	if b.ids == nil {
		b.ids = make([]atomic.Int64, len(strats)) // per table
	}
	ids := b.ids
	results := make([]*result, len(strats))
	for i, s := range strats {
		results[i] = &result{name: s.name(), shape: s.shape()}
	}

	b.progress.line("warming up")
	for i, s := range strats {
		if _, err := b.slice(ctx, s, warmupIterations, &ids[i]); err != nil {
			return nil, err
		}
	}
	b.progress.line("measuring the servers' background load")
	if err := b.env.meter.background(ctx, time.Second); err != nil {
		return nil, err
	}
	pgrywBefore := map[string]pgryw.Stats{}
	for name, p := range b.env.pgryws {
		pgrywBefore[name] = p.conn.Stats()
	}

	n := len(strats)
	for r := 0; r < b.cfg.rounds; r++ {
		// This round's share of each worker's iterations; the remainder goes
		// to the first rounds.
		iters := b.cfg.iterations / b.cfg.rounds
		if r < b.cfg.iterations%b.cfg.rounds {
			iters++
		}
		var order []string
		for k := 0; k < n; k++ {
			order = append(order, strats[(k+r)%n].name())
		}
		b.progress.round(r+1, b.cfg.rounds, order)
		if b.cfg.mix {
			b.progress.strategy(r+1, b.cfg.rounds, "all strategies, mixed")
			per, err := b.mixed(ctx, strats, iters, ids, r)
			if err != nil {
				return nil, err
			}
			for i, samples := range per {
				for _, s := range samples {
					results[i].add(s)
				}
			}
			continue
		}
		for k := 0; k < n; k++ {
			i := (k + r) % n
			b.progress.strategy(r+1, b.cfg.rounds, strats[i].name())
			before, err := b.env.meter.snapshot(ctx)
			if err != nil {
				return nil, err
			}
			t0 := time.Now()
			samples, err := b.slice(ctx, strats[i], iters, &ids[i])
			if err != nil {
				return nil, err
			}
			dur := time.Since(t0)
			after, err := b.env.meter.snapshot(ctx)
			if err != nil {
				return nil, err
			}
			results[i].cost.add(b.env.meter, before, after, dur)
			for _, s := range samples {
				results[i].add(s)
			}
		}
	}

	for _, r := range results {
		if p, ok := b.env.pgryws[r.name]; ok {
			d := statsDiff(p.conn.Stats(), pgrywBefore[r.name])
			r.pgrywDiff = &d
			r.scope = b.env.scopeHost[r.name]
		}
	}
	return results, nil
}

// mixed runs iters iterations of every strategy on each of the workers
// concurrently, each worker taking the strategies in turn, one iteration
// each, in a new random order every time (seeded by round and worker):
// every strategy meets the same machine, moment by moment, and none always
// follows the same other one (a strategy right after one that wrote meets
// the replay of that write). It returns the samples by strategy.
func (b *bench) mixed(ctx context.Context, strats []strategy, iters int, ids []atomic.Int64, round int) ([][]sample, error) {
	n := len(strats)
	perWorker := make([][][]sample, b.cfg.workers)
	var wg sync.WaitGroup
	for w := range perWorker {
		perWorker[w] = make([][]sample, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(round), uint64(w)))
			order := make([]int, n)
			for k := range order {
				order[k] = k
			}
			for range iters {
				rng.Shuffle(n, func(a, b int) { order[a], order[b] = order[b], order[a] })
				for _, i := range order {
					if ctx.Err() != nil {
						return
					}
					perWorker[w][i] = append(perWorker[w][i], b.iteration(ctx, strats[i], ids[i].Add(1)))
				}
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil, errInterrupted
	}
	out := make([][]sample, n)
	for _, pw := range perWorker {
		for i := range out {
			out[i] = append(out[i], pw[i]...)
		}
	}
	return out, nil
}

// slice runs iters iterations on each of the workers concurrently.
func (b *bench) slice(ctx context.Context, s strategy, iters int, ids *atomic.Int64) ([]sample, error) {
	perWorker := make([][]sample, b.cfg.workers)
	var wg sync.WaitGroup
	for w := range perWorker {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range iters {
				if ctx.Err() != nil {
					return
				}
				perWorker[w] = append(perWorker[w], b.iteration(ctx, s, ids.Add(1)))
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil, errInterrupted
	}
	return slices.Concat(perWorker...), nil
}

// iteration inserts row id and reads it back, timing each call; a
// write-only strategy only inserts, a read-only one only reads a preloaded
// row.
func (b *bench) iteration(ctx context.Context, s strategy, id int64) sample {
	var smp sample
	sh := s.shape()
	if sh == readOnly {
		id = preloadID(id)
	}
	want := 2*id + 1
	t1 := time.Now()
	if sh != readOnly {
		t0 := t1
		early, err := s.insert(ctx, id, want)
		if err != nil {
			return sample{err: fmt.Errorf("insert: %w", err)}
		}
		t1 = time.Now()
		smp.write, smp.early, smp.hasWrite = t1.Sub(t0), early, true
	}
	if sh == insertOnly {
		return smp
	}
	out, err := s.read(ctx, id)
	t2 := time.Now()
	if err != nil {
		return sample{err: fmt.Errorf("read: %w", err)}
	}
	smp.read, smp.hasRead, smp.tries = t2.Sub(t1), true, out.tries
	smp.stale = !out.v.Valid || out.v.Int64 != want
	smp.onReplica = out.port != b.env.primaryPort
	return smp
}

// progress reports the run's position on stderr: one line rewritten in place
// on a terminal, one line per round otherwise.
type progress struct{ tty bool }

func newProgress() *progress {
	fi, err := os.Stderr.Stat()
	return &progress{tty: err == nil && fi.Mode()&os.ModeCharDevice != 0}
}

func (p *progress) line(s string) {
	if p.tty {
		fmt.Fprintf(os.Stderr, "\r\033[Krywbench: %s", s)
	} else {
		fmt.Fprintf(os.Stderr, "rywbench: %s\n", s)
	}
}

func (p *progress) round(k, n int, order []string) {
	if !p.tty {
		p.line(fmt.Sprintf("round %d/%d: %s", k, n, strings.Join(order, ", ")))
	}
}

func (p *progress) strategy(k, n int, name string) {
	if p.tty {
		p.line(fmt.Sprintf("round %d/%d: %s", k, n, name))
	}
}

func (p *progress) done() {
	if p.tty {
		fmt.Fprint(os.Stderr, "\r\033[K")
	}
}

// machine describes where the run happened.
func machine(e *env) string {
	return fmt.Sprintf("%s/%s, %d CPUs, %s, PostgreSQL %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), e.serverVersion)
}
