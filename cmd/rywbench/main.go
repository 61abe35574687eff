// Command rywbench measures what reading your own writes from PostgreSQL
// streaming replicas costs, strategy against strategy, in one process.
//
// Each worker inserts a fresh row on the primary and at once reads it back by
// id. A read is stale when the row is missing or has the wrong value; it was
// served by a replica when the inet_server_port() returned by the same query
// differs from the primary's. The strategies:
//
//	sticky-primary  read from the primary (plain pgx)
//	naive-replica   read from a replica right away (plain pgx)
//	sleep-replica   sleep -sleep, then read from a replica
//	two-round-trip  fetch the primary's WAL insert position, wait until the
//	                replica has replayed it (at most -budget), then read the
//	                replica, or the primary if the budget ran out
//	pgryw           insert and read through one pgryw pool
//
// The strategies run interleaved: each of -rounds rounds runs every strategy
// for a slice of the iterations, in rotating order, so machine noise hits all
// of them alike. Read latency is the read call only (for two-round-trip it
// includes the position fetch and the wait, for sleep-replica the sleep);
// write latency is the insert call (for pgryw it includes pgryw's capture of
// the primary's position).
//
// Without -primary, rywbench starts a local primary and -replicas streaming
// replicas from the PostgreSQL server binaries (internal/pgtest), with
// recovery_min_apply_delay set to -delay to simulate lag, and stops them when
// it exits. With -primary and -replica it uses running servers instead.
//
// Usage:
//
//	go run ./cmd/rywbench                       # all strategies, no lag
//	go run ./cmd/rywbench -delay 50ms           # replicas 50ms behind
//	go run ./cmd/rywbench -demo                 # what `make demo` runs
//	go run ./cmd/rywbench -json > result.json
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
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
	delay, budget, sleep                  time.Duration
	strategies                            []string
	json, demo                            bool
	primary                               string
	replicaDSNs                           []string
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
	)
	flag.IntVar(&cfg.workers, "workers", 8, "concurrent workers (and pool size)")
	flag.IntVar(&cfg.iterations, "iterations", 200, "measured iterations per worker per strategy")
	flag.IntVar(&cfg.rounds, "rounds", 10, "rounds to split the iterations into")
	flag.IntVar(&cfg.replicas, "replicas", 1, "replicas to start (local cluster only)")
	flag.DurationVar(&cfg.delay, "delay", 0, "recovery_min_apply_delay on the replicas (local cluster only)")
	flag.DurationVar(&cfg.budget, "budget", 500*time.Millisecond, "how long a read may wait for a replica (two-round-trip, pgryw wait_timeout)")
	flag.DurationVar(&cfg.sleep, "sleep", 50*time.Millisecond, "sleep-replica's pause before reading")
	flag.StringVar(&strategies, "strategies", strings.Join(allStrategies, ","), "comma-separated strategies to run")
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

	seen := map[string]bool{}
	for _, s := range strings.Split(strategies, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(allStrategies, s) {
			return nil, fmt.Errorf("-strategies: unknown strategy %q (known: %s)", s, strings.Join(allStrategies, ", "))
		}
		seen[s] = true
	}
	for _, s := range allStrategies { // table order
		if seen[s] {
			cfg.strategies = append(cfg.strategies, s)
		}
	}

	switch {
	case cfg.workers < 1 || cfg.iterations < 1 || cfg.rounds < 1:
		return nil, errors.New("-workers, -iterations and -rounds must be at least 1")
	case cfg.budget < time.Millisecond:
		return nil, errors.New("-budget must be at least 1ms")
	case cfg.delay < 0 || cfg.sleep < 0:
		return nil, errors.New("-delay and -sleep must not be negative")
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
	cfg.rounds = min(cfg.rounds, cfg.iterations)
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

	start := time.Now()
	e, err := setup(ctx, cfg)
	if e != nil {
		defer e.close()
	}
	if err != nil {
		return fail(ctx, err)
	}
	setupTime := time.Since(start)

	b := &bench{cfg: cfg, env: e, progress: newProgress()}
	results, err := b.run(ctx)
	b.progress.done()
	if err != nil {
		return fail(ctx, err)
	}
	sums := make([]summary, len(results))
	for i, r := range results {
		sums[i] = r.summarize()
	}
	elapsed := time.Since(start)
	if cfg.json {
		err = printJSON(os.Stdout, cfg, e, sums, elapsed)
	} else {
		printText(os.Stdout, cfg, e, sums, elapsed, setupTime)
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
	replicaAddrs     []string // host:port, for pgryw's replicas key
	pools            *pools
	pgryw            *pgrywStrategy // nil unless the pgryw strategy runs
	primaryPort      int64
	serverVersion    string
	serverVersionNum int
	tables           []string
}

func (e *env) close() {
	if e.pools != nil && len(e.tables) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		for _, t := range e.tables {
			e.pools.primary.ExecContext(ctx, "DROP TABLE IF EXISTS "+t)
		}
		cancel()
	}
	if e.pgryw != nil {
		e.pgryw.db.Close()
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
		c, err := pgtest.Start(startCtx, pgtest.Options{Replicas: cfg.replicas, ApplyDelay: cfg.delay})
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

	if slices.Contains(cfg.strategies, pgrywName) {
		if e.pgryw, err = newPgryw(e.primaryDSN, e.replicaAddrs, cfg.budget); err != nil {
			return e, err
		}
		e.pgryw.db.SetMaxOpenConns(cfg.workers)
		e.pgryw.db.SetMaxIdleConns(cfg.workers)
	}

	for _, s := range cfg.strategies {
		t := tableName(s)
		e.tables = append(e.tables, t)
		for _, q := range []string{"DROP TABLE IF EXISTS " + t, "CREATE TABLE " + t + " (id bigint PRIMARY KEY, v bigint NOT NULL)"} {
			if _, err := p.primary.ExecContext(ctx, q); err != nil {
				return e, fmt.Errorf("create table %s: %w", t, err)
			}
		}
	}
	return e, waitForTables(ctx, e, cfg.delay)
}

// waitForTables waits until every replica shows every table.
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
}

func (b *bench) strategies() []strategy {
	var out []strategy
	for _, name := range b.cfg.strategies {
		if name == pgrywName {
			out = append(out, b.env.pgryw)
		} else {
			out = append(out, newBaseline(name, b.env.pools))
		}
	}
	return out
}

func (b *bench) run(ctx context.Context) ([]*result, error) {
	strats := b.strategies()
	ids := make([]atomic.Int64, len(strats)) // per table
	results := make([]*result, len(strats))
	for i, s := range strats {
		results[i] = &result{name: s.name()}
	}

	b.progress.line("warming up")
	for i, s := range strats {
		if _, err := b.slice(ctx, s, warmupIterations, &ids[i]); err != nil {
			return nil, err
		}
	}
	var pgrywBefore pgryw.Stats
	if b.env.pgryw != nil {
		pgrywBefore = b.env.pgryw.conn.Stats()
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
		for k := 0; k < n; k++ {
			i := (k + r) % n
			b.progress.strategy(r+1, b.cfg.rounds, strats[i].name())
			samples, err := b.slice(ctx, strats[i], iters, &ids[i])
			if err != nil {
				return nil, err
			}
			for _, s := range samples {
				results[i].add(s)
			}
		}
	}

	if b.env.pgryw != nil {
		d := statsDiff(b.env.pgryw.conn.Stats(), pgrywBefore)
		for _, r := range results {
			if r.name == pgrywName {
				r.pgrywDiff = &d
			}
		}
	}
	return results, nil
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

// iteration inserts row id and reads it back, timing each call.
func (b *bench) iteration(ctx context.Context, s strategy, id int64) sample {
	want := 2*id + 1
	t0 := time.Now()
	if err := s.insert(ctx, id, want); err != nil {
		return sample{err: fmt.Errorf("insert: %w", err)}
	}
	t1 := time.Now()
	v, port, err := s.read(ctx, id)
	t2 := time.Now()
	if err != nil {
		return sample{err: fmt.Errorf("read: %w", err)}
	}
	return sample{
		write:     t1.Sub(t0),
		read:      t2.Sub(t1),
		stale:     !v.Valid || v.Int64 != want,
		onReplica: port != b.env.primaryPort,
	}
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
