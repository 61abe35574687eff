package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgryw/pgryw"
)

// The load test (-load): -workers workers (32 by default) each run a loop of
// mixed operations for -load-time per strategy: a write (insert a fresh
// row; -write-share of the operations, and always the first) or a read of
// the row the worker wrote last. It reports throughput, latency, stale
// reads; the cost of an operation: the client process's CPU, the servers'
// client backends' CPU less their background (/proc, local cluster), their
// statements (-pgss) and pgryw's Stats; and the server connections each
// node sees, sampled from pg_stat_activity every 50ms: "held" = open client
// connections, "busy" = those not idle at that instant. Each strategy gets fresh pools for each
// round, closed (and their connections gone from the servers) before the
// next.
//
//	primary-pool    one pgx stdlib pool of -workers connections on the primary;
//	                every call runs there
//	per-node-pools  a pgx stdlib pool of -workers connections per node: writes
//	                on the primary, reads on the replicas in turn, no waiting
//	                (stale reads possible): plain read/write splitting
//	pgryw           one pgryw pool of -workers connections (session_scope=db:
//	                every read waits for the pool's latest write)
//	pgryw-session   the same with session_scope=conn, each worker carrying a
//	                pgryw.Session of its own (a read waits for its worker's
//	                writes only)
const (
	loadPrimary = "primary-pool"
	loadPerNode = "per-node-pools"
)

var loadStrategies = []string{loadPrimary, loadPerNode, pgrywName, pgrywSession}

const (
	loadSampleEvery = 50 * time.Millisecond
	loadWarmup      = 300 * time.Millisecond
)

// setupLoad creates the load test's tables.
func setupLoad(ctx context.Context, cfg *config, e *env) error {
	for _, s := range cfg.strategies {
		t := tableName("load-" + s)
		e.tables = append(e.tables, t)
		for _, q := range []string{"DROP TABLE IF EXISTS " + t, "CREATE TABLE " + t + " (id bigint PRIMARY KEY, v bigint NOT NULL)"} {
			if _, err := e.pools.primary.ExecContext(ctx, q); err != nil {
				return fmt.Errorf("create table %s: %w", t, err)
			}
		}
	}
	return waitForTables(ctx, e, cfg.delay)
}

// loadTarget is one strategy's pools for one round.
type loadTarget struct {
	primary  *sql.DB   // writes (and reads for primary-pool)
	readers  []*sql.DB // per-node-pools: the replicas
	closers  []*sql.DB
	insert   string
	get      string
	nextRead atomic.Uint64
	conn     *pgryw.Connector // pgryw's strategies: its Stats
}

func openLoadTarget(cfg *config, e *env, name string) (*loadTarget, error) {
	ins, get := statements(tableName("load-" + name))
	t := &loadTarget{insert: ins, get: get}
	open := func(dsn string) (*sql.DB, error) {
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			return nil, err
		}
		db.SetMaxOpenConns(cfg.workers)
		db.SetMaxIdleConns(cfg.workers)
		t.closers = append(t.closers, db)
		return db, nil
	}
	var err error
	switch name {
	case loadPrimary:
		t.primary, err = open(e.primaryDSN)
	case loadPerNode:
		if t.primary, err = open(e.primaryDSN); err != nil {
			return t, err
		}
		for _, d := range cfg.replicaDSNs {
			db, err := open(d)
			if err != nil {
				return t, err
			}
			t.readers = append(t.readers, db)
		}
	case pgrywName, pgrywSession:
		var p *pgrywStrategy
		// (The writer as it is: each strategy's pools are opened and closed
		// around its slice, so no two pgryw pools are open at once.)
		p, err = newPgryw(name, e.primaryDSN, e.replicaAddrs, cfg.budget, cfg.workers)
		if p != nil {
			t.primary, t.conn = p.db, p.conn
			t.closers = append(t.closers, p.db)
		}
	}
	return t, err
}

func (t *loadTarget) close() {
	for _, db := range t.closers {
		db.Close()
	}
}

func (t *loadTarget) write(ctx context.Context, id int64) error {
	_, err := t.primary.ExecContext(ctx, t.insert, id, 2*id+1)
	return err
}

func (t *loadTarget) read(ctx context.Context, id int64) (sql.NullInt64, error) {
	db := t.primary
	if len(t.readers) > 0 {
		db = t.readers[t.nextRead.Add(1)%uint64(len(t.readers))]
	}
	var (
		v    sql.NullInt64
		port sql.NullInt64
	)
	err := db.QueryRowContext(ctx, t.get, id).Scan(&v, &port)
	return v, err
}

// connStats is what the samples of one node's connections say.
type connStats struct {
	Node     string  `json:"node"`
	HeldMax  int     `json:"held_max"`
	HeldMean float64 `json:"held_mean"`
	BusyMax  int     `json:"busy_max"`
	BusyMean float64 `json:"busy_mean"`
	samples  int
	heldSum  int
	busySum  int
}

func (c *connStats) add(held, busy int) {
	c.samples++
	c.heldSum += held
	c.busySum += busy
	c.HeldMax = max(c.HeldMax, held)
	c.BusyMax = max(c.BusyMax, busy)
	c.HeldMean = float64(c.heldSum) / float64(c.samples)
	c.BusyMean = float64(c.busySum) / float64(c.samples)
}

// loadResult is one strategy's load test outcome.
type loadResult struct {
	Name       string      `json:"strategy"`
	Ops        int         `json:"ops"`
	Writes     int         `json:"writes"`
	Reads      int         `json:"reads"`
	Stale      int         `json:"stale"`
	Errors     int         `json:"errors"`
	FirstError string      `json:"first_error,omitempty"`
	Seconds    float64     `json:"seconds"`
	OpsPerSec  float64     `json:"ops_per_second"`
	ReadP50    float64     `json:"read_p50_ms"`
	ReadP95    float64     `json:"read_p95_ms"`
	WriteP50   float64     `json:"write_p50_ms"`
	WriteP95   float64     `json:"write_p95_ms"`
	Conns      []connStats `json:"connections"`
	// Reads in flight (called and not yet returned), sampled with the
	// connections: what a replica's connections are judged against.
	ReadingMax  int     `json:"reads_in_flight_max"`
	ReadingMean float64 `json:"reads_in_flight_mean"`
	readingSum  int
	readingN    int
	// Per operation: the servers' cost (CPU of their client backends, and
	// statements with -pgss), the client's CPU (the whole process, in
	// microseconds), and pgryw's Stats summed over the measured phases.
	Cost      *costSummary `json:"server_cost,omitempty"`
	ClientCPU float64      `json:"client_cpu_us_per_op"`
	Pgryw     *pgryw.Stats `json:"pgryw_stats,omitempty"`
	cost      costDelta
	clientCPU time.Duration
	readLat   []time.Duration
	writeLat  []time.Duration
}

// sampler counts each node's client connections.
type sampler struct {
	names []string
	dbs   []*sql.DB
}

func newSampler(e *env, cfg *config) (*sampler, error) {
	s := &sampler{}
	for i, dsn := range append([]string{e.primaryDSN}, cfg.replicaDSNs...) {
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			s.close()
			return nil, err
		}
		db.SetMaxOpenConns(1)
		name := "primary"
		if i > 0 {
			name = fmt.Sprintf("replica%d", i-1)
		}
		s.names = append(s.names, name)
		s.dbs = append(s.dbs, db)
	}
	return s, nil
}

func (s *sampler) close() {
	for _, db := range s.dbs {
		db.Close()
	}
}

// meterAppName is the application_name of the cost meter's connections,
// which the sampler does not count.
const meterAppName = "rywbench-meter"

// count returns node i's client connections other than the sampler's own
// and the cost meter's: open, and not idle.
func (s *sampler) count(ctx context.Context, i int) (held, busy int, err error) {
	err = s.dbs[i].QueryRowContext(ctx, `SELECT count(*), count(*) FILTER (WHERE state <> 'idle')
		FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND application_name <> $1`, meterAppName).Scan(&held, &busy)
	return held, busy, err
}

// settle waits until no node holds client connections but the sampler's,
// so that one strategy's closed pools are not counted in the next's.
func (s *sampler) settle(ctx context.Context) error {
	deadline := time.Now().Add(10 * time.Second)
	for i := range s.dbs {
		for {
			held, _, err := s.count(ctx, i)
			if err != nil {
				return err
			}
			if held == 0 {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s still holds %d client connections 10s after the pools closed", s.names[i], held)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

func runLoad(ctx context.Context, cfg *config, e *env, prog *progress) ([]*loadResult, error) {
	// The setup's pools would otherwise keep idle connections open, counted
	// against every strategy.
	e.pools.primary.SetMaxIdleConns(0)
	for _, r := range e.pools.replicas {
		r.SetMaxIdleConns(0)
	}
	smp, err := newSampler(e, cfg)
	if err != nil {
		return nil, err
	}
	defer smp.close()
	if err := smp.settle(ctx); err != nil {
		return nil, err
	}
	prog.line("measuring the servers' background load")
	if err := e.meter.background(ctx, time.Second); err != nil {
		return nil, err
	}
	results := make([]*loadResult, len(cfg.strategies))
	for i, name := range cfg.strategies {
		results[i] = &loadResult{Name: name}
		for _, n := range smp.names {
			results[i].Conns = append(results[i].Conns, connStats{Node: n})
		}
	}
	var ids atomic.Int64
	per := cfg.loadTime / time.Duration(cfg.rounds)
	n := len(cfg.strategies)
	for r := 0; r < cfg.rounds; r++ {
		var order []string
		for k := 0; k < n; k++ {
			order = append(order, cfg.strategies[(k+r)%n])
		}
		prog.round(r+1, cfg.rounds, order)
		for k := 0; k < n; k++ {
			i := (k + r) % n
			prog.strategy(r+1, cfg.rounds, cfg.strategies[i])
			if err := loadSlice(ctx, cfg, e, smp, results[i], per, &ids); err != nil {
				return nil, err
			}
			if err := smp.settle(ctx); err != nil {
				return nil, err
			}
		}
	}
	prog.done()
	for _, res := range results {
		slices.Sort(res.readLat)
		slices.Sort(res.writeLat)
		res.ReadP50, res.ReadP95 = ms(percentile(res.readLat, 0.5)), ms(percentile(res.readLat, 0.95))
		res.WriteP50, res.WriteP95 = ms(percentile(res.writeLat, 0.5)), ms(percentile(res.writeLat, 0.95))
		if res.Seconds > 0 {
			res.OpsPerSec = float64(res.Ops) / res.Seconds
		}
		res.Cost = res.cost.summarize(res.Ops)
		if res.Ops > 0 {
			res.ClientCPU = float64(res.clientCPU.Microseconds()) / float64(res.Ops)
		}
	}
	return results, nil
}

// loadSlice runs one strategy for d with fresh pools, after a warm-up.
func loadSlice(ctx context.Context, cfg *config, e *env, smp *sampler, res *loadResult, d time.Duration, ids *atomic.Int64) error {
	t, err := openLoadTarget(cfg, e, res.Name)
	defer t.close()
	if err != nil {
		return err
	}
	type workerOut struct {
		ops, writes, reads, stale, errors int
		firstErr                          error
		readLat, writeLat                 []time.Duration
	}
	var reading atomic.Int64 // reads in flight
	run := func(until time.Time, out *workerOut, seed uint64) {
		ctx := ctx
		if res.Name == pgrywSession {
			ctx = pgryw.WithSession(ctx, pgryw.NewSession())
		}
		rng := rand.New(rand.NewPCG(seed, 1))
		var last int64
		for time.Now().Before(until) && ctx.Err() == nil {
			t0 := time.Now()
			if last == 0 || rng.Float64() < cfg.writeShare {
				id := ids.Add(1)
				if err := t.write(ctx, id); err != nil {
					out.errors++
					if out.firstErr == nil {
						out.firstErr = fmt.Errorf("write: %w", err)
					}
					continue
				}
				out.writeLat = append(out.writeLat, time.Since(t0))
				out.ops++
				out.writes++
				last = id
				continue
			}
			reading.Add(1)
			v, err := t.read(ctx, last)
			reading.Add(-1)
			if err != nil {
				out.errors++
				if out.firstErr == nil {
					out.firstErr = fmt.Errorf("read: %w", err)
				}
				continue
			}
			out.readLat = append(out.readLat, time.Since(t0))
			out.ops++
			out.reads++
			if !v.Valid || v.Int64 != 2*last+1 {
				out.stale++
			}
		}
	}
	phase := func(dur time.Duration, sample bool) []workerOut {
		outs := make([]workerOut, cfg.workers)
		until := time.Now().Add(dur)
		var wg sync.WaitGroup
		for w := range outs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				run(until, &outs[w], uint64(ids.Load())+uint64(w))
			}()
		}
		stop := make(chan struct{})
		var sw sync.WaitGroup
		if sample {
			sw.Add(1)
			go func() {
				defer sw.Done()
				tick := time.NewTicker(loadSampleEvery)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					r := int(reading.Load())
					res.ReadingMax = max(res.ReadingMax, r)
					res.readingSum += r
					res.readingN++
					res.ReadingMean = float64(res.readingSum) / float64(res.readingN)
					for i := range smp.dbs {
						if held, busy, err := smp.count(ctx, i); err == nil {
							res.Conns[i].add(held, busy)
						}
					}
				}
			}()
		}
		wg.Wait()
		close(stop)
		sw.Wait()
		return outs
	}
	phase(loadWarmup, false)
	before, err := e.meter.snapshot(ctx)
	if err != nil {
		return err
	}
	var stats pgryw.Stats
	if t.conn != nil {
		stats = t.conn.Stats()
	}
	cpu0 := processCPU()
	start := time.Now()
	outs := phase(d, true)
	dur := time.Since(start)
	res.clientCPU += processCPU() - cpu0
	res.Seconds += dur.Seconds()
	if t.conn != nil {
		diff := statsDiff(t.conn.Stats(), stats)
		if res.Pgryw == nil {
			res.Pgryw = &pgryw.Stats{}
		}
		addStats(res.Pgryw, diff)
	}
	after, err := e.meter.snapshot(ctx)
	if err != nil {
		return err
	}
	res.cost.add(e.meter, before, after, dur)
	for _, o := range outs {
		res.Ops += o.ops
		res.Writes += o.writes
		res.Reads += o.reads
		res.Stale += o.stale
		res.Errors += o.errors
		if res.FirstError == "" && o.firstErr != nil {
			res.FirstError = o.firstErr.Error()
		}
		res.readLat = append(res.readLat, o.readLat...)
		res.writeLat = append(res.writeLat, o.writeLat...)
	}
	if ctx.Err() != nil {
		return errInterrupted
	}
	return nil
}

func printLoadText(w io.Writer, cfg *config, e *env, res []*loadResult, elapsed, setup time.Duration) {
	fmt.Fprintf(w, "rywbench -load: %s\n", machine(e))
	fmt.Fprintf(w, "%d replica(s), %d workers, %.0f%% writes, %v per strategy in %d rounds, budget %v\n\n",
		cfg.replicas, cfg.workers, 100*cfg.writeShare, cfg.loadTime, cfg.rounds, cfg.budget)
	const row = "%-15s %9s %8s %8s %6s %6s %9s %9s %10s %10s\n"
	fmt.Fprintf(w, row, "strategy", "ops/s", "writes", "reads", "stale", "errors", "read p50", "read p95", "write p50", "write p95")
	for _, r := range res {
		fmt.Fprintf(w, row, r.Name, fmt.Sprintf("%.0f", r.OpsPerSec), fmt.Sprint(r.Writes), fmt.Sprint(r.Reads), fmt.Sprint(r.Stale), fmt.Sprint(r.Errors),
			fmtMS(r.ReadP50), fmtMS(r.ReadP95), fmtMS(r.WriteP50), fmtMS(r.WriteP95))
	}
	printLoadCost(w, res)
	fmt.Fprintf(w, "\nServer connections per node (client backends in pg_stat_activity every %v; held = open, busy = not idle):\n", loadSampleEvery)
	const crow = "%-15s %-15s %9s %10s %9s %10s\n"
	fmt.Fprintf(w, crow, "strategy", "node", "held max", "held mean", "busy max", "busy mean")
	for _, r := range res {
		total := 0
		for _, c := range r.Conns {
			fmt.Fprintf(w, crow, r.Name, c.Node, fmt.Sprint(c.HeldMax), fmt.Sprintf("%.1f", c.HeldMean), fmt.Sprint(c.BusyMax), fmt.Sprintf("%.1f", c.BusyMean))
			total += c.HeldMax
		}
		fmt.Fprintf(w, crow, r.Name, "all nodes", fmt.Sprint(total), "", "", "")
		fmt.Fprintf(w, crow, r.Name, "reads in flight", fmt.Sprint(r.ReadingMax), fmt.Sprintf("%.1f", r.ReadingMean), "", "")
	}
	fmt.Fprintf(w, "(a pool of M pgryw connections holds M primary connections, and on each replica as many as reads ran there at once, plus the monitor's; reads in flight: called and not returned, all replicas)\n")
	for _, r := range res {
		if r.FirstError != "" {
			fmt.Fprintf(w, "\n%s: %d errors; first: %s\n", r.Name, r.Errors, r.FirstError)
		}
	}
	if ts := loadTargets(res); len(ts) > 0 {
		fmt.Fprintln(w, "\nTargets:")
		for _, t := range ts {
			fmt.Fprintf(w, "  %-4s %s\n", t.status, t.text)
		}
	}
	fmt.Fprintf(w, "\nTook %v (of which starting and preparing the servers %v).\n", elapsed.Round(100*time.Millisecond), setup.Round(100*time.Millisecond))
}

func printLoadJSON(w io.Writer, cfg *config, e *env, res []*loadResult, elapsed time.Duration) error {
	out := map[string]any{
		"settings": map[string]any{
			"workers": cfg.workers, "replicas": cfg.replicas, "write_share": cfg.writeShare,
			"load_time": cfg.loadTime.String(), "rounds": cfg.rounds, "budget": cfg.budget.String(),
			"strategies": cfg.strategies,
		},
		"machine": map[string]any{
			"goos": runtime.GOOS, "goarch": runtime.GOARCH, "num_cpu": runtime.NumCPU(), "go_version": runtime.Version(),
			"server_version": e.serverVersion, "server_version_num": e.serverVersionNum,
		},
		"results":         res,
		"elapsed_seconds": elapsed.Seconds(),
	}
	var targets []map[string]string
	for _, t := range loadTargets(res) {
		targets = append(targets, map[string]string{"status": t.status, "target": t.text})
	}
	out["targets"] = targets
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// loadJudged is one judged line of the load test.
type loadJudged struct {
	status, text string
}

// loadTargets judges the load test's targets for each pgryw strategy run:
// throughput at least 90% of per-node-pools' with no stale read and no
// error, and server connections per replica at most the peak of busy ones
// plus a small constant (2).
func loadTargets(res []*loadResult) []loadJudged {
	var base *loadResult
	for _, r := range res {
		if r.Name == loadPerNode {
			base = r
		}
	}
	var out []loadJudged
	for _, r := range res {
		if r.Name != pgrywName && r.Name != pgrywSession {
			continue
		}
		if base != nil && base.OpsPerSec > 0 {
			ratio := r.OpsPerSec / base.OpsPerSec
			st := "PASS"
			if ratio < 0.90 || r.Stale > 0 || r.Errors > 0 {
				st = "FAIL"
			}
			out = append(out, loadJudged{st, fmt.Sprintf("%s throughput ≥ 90%% of %s, 0 stale: %.0f%% (%d stale)", r.Name, loadPerNode, 100*ratio, r.Stale)})
		}
		for _, c := range r.Conns {
			if !strings.HasPrefix(c.Node, "replica") {
				continue
			}
			st := "PASS"
			if c.HeldMax > r.ReadingMax+2 {
				st = "FAIL"
			}
			out = append(out, loadJudged{st, fmt.Sprintf("%s server connections on %s ≤ peak reads in flight + 2: held %d, reads in flight peak %d (busy peak %d)", r.Name, c.Node, c.HeldMax, r.ReadingMax, c.BusyMax)})
		}
	}
	return out
}

// printLoadCost prints what each operation cost: the client's CPU, the
// servers' (client backends', less their background), statements with
// -pgss, and what pgryw's Stats counted, per operation.
func printLoadCost(w io.Writer, res []*loadResult) {
	fmt.Fprintln(w, "\nCost per operation (CPU in µs; statements with -pgss; pgryw's Stats per read or write):")
	const row = "%-15s %10s %11s %11s %10s %10s %9s %9s %9s %9s\n"
	fmt.Fprintf(w, row, "strategy", "client CPU", "primary CPU", "replica CPU", "prim stmts", "repl stmts", "waits/rd", "primrd/rd", "capt/wr", "timeouts")
	opt := func(v *float64, f string) string {
		if v == nil {
			return "-"
		}
		return fmt.Sprintf(f, *v)
	}
	for _, r := range res {
		c := r.Cost
		if c == nil {
			c = &costSummary{}
		}
		waits, prim, capt, tmo := "-", "-", "-", "-"
		if s := r.Pgryw; s != nil && r.Reads > 0 && r.Writes > 0 {
			waits = fmt.Sprintf("%.3f", float64(s.Waits)/float64(r.Reads))
			prim = fmt.Sprintf("%.3f", float64(s.PrimaryReads)/float64(r.Reads))
			capt = fmt.Sprintf("%.3f", float64(s.Captures)/float64(r.Writes))
			tmo = fmt.Sprint(s.WaitTimeouts)
		}
		fmt.Fprintf(w, row, r.Name, fmt.Sprintf("%.1f", r.ClientCPU), opt(c.PrimaryBackendCPU, "%.1f"), opt(c.ReplicaBackendCPU, "%.1f"),
			opt(c.PrimaryStatements, "%.3f"), opt(c.ReplicaStatements, "%.3f"), waits, prim, capt, tmo)
	}
}
