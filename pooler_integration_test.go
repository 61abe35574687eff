package pgryw_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// Through PgBouncer: one bouncer per node, as deployments run them, with
// the driver's DSN naming the bouncers.

// bouncers is one PgBouncer in front of each node of the test cluster.
type bouncers struct {
	writer   *pgtest.Bouncer
	replicas []*pgtest.Bouncer
}

// startBouncers starts a bouncer in pool mode in front of every node, each
// with poolSize server connections, stopped with the test.
func startBouncers(t *testing.T, mode string, poolSize int) *bouncers {
	t.Helper()
	pgtest.Require(t, cluster)
	ctx := context.Background()
	start := func(target string) *pgtest.Bouncer {
		b, err := pgtest.StartBouncer(ctx, pgtest.BouncerOptions{Target: target, Mode: mode, PoolSize: poolSize})
		if errors.Is(err, pgtest.ErrNoBouncer) && !pgtest.Required() {
			t.Skip(err) // on CI (pgtest.Required) a missing pgbouncer fails
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	bs := &bouncers{writer: start(cluster.Writer.Addr())}
	for i := range cluster.Replicas {
		bs.replicas = append(bs.replicas, start(replicaTarget(i)))
	}
	return bs
}

// replicaTarget is where a bouncer in front of replica i leads: the
// replica, or its WAIT FOR emulation (PGRYW_EMULATE_PG19=1).
func replicaTarget(i int) string {
	if f := cluster.WaitForFronts(); i < len(f) {
		return f[i].Addr()
	}
	return cluster.Replicas[i].Addr()
}

// writerDSN is the writer's bouncer as a URL, with extra keys.
func (bs *bouncers) writerDSN(extra string) string {
	d := strings.Replace(cluster.Writer.DSN(), cluster.Writer.Addr(), bs.writer.Addr(), 1)
	if extra != "" {
		d += "&" + extra
	}
	return d
}

// pgrywDSN names the bouncers as the writer and the replicas.
func (bs *bouncers) pgrywDSN(extra string) string {
	addrs := make([]string, len(bs.replicas))
	for i, b := range bs.replicas {
		addrs[i] = b.Addr()
	}
	return bs.writerDSN(extra) + "&replicas=" + strings.Join(addrs, ",")
}

// churnResult is what a churn workload saw.
type churnResult struct {
	cycles, wrong, stale, errs, panics, onReplica atomic.Int64
	mu                                            sync.Mutex
	first                                         []string
}

func (r *churnResult) note(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.first) < 5 {
		r.first = append(r.first, fmt.Sprintf(format, args...))
	}
}

// churn is the pooler's worst case: connections database/sql closes right
// after their statement (no idle connections), few server connections per
// node, every worker inserting a row and reading it back at once. Every
// row read is checked against the id asked for: a row of another session,
// or of pgryw's own statements, counts as wrong.
func churn(t *testing.T, db *sql.DB, table string, workers, cycles int, tag string) *churnResult {
	t.Helper()
	db.SetMaxIdleConns(0)
	var r churnResult
	var next atomic.Int64
	base := time.Now().UnixNano() % 1e9 * 1000
	var wg sync.WaitGroup
	for g := 0; g < workers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(cycles) {
				func() {
					defer func() {
						if p := recover(); p != nil {
							r.panics.Add(1)
							r.note("panic: %v\n%s", p, debug.Stack())
						}
					}()
					r.cycles.Add(1)
					k := base + next.Load()*1000 + int64(g)
					if _, err := db.Exec("INSERT INTO "+table+" (id, tag) VALUES ($1, $2)", k, tag); err != nil {
						r.errs.Add(1)
						r.note("insert %d: %v", k, err)
						return
					}
					var id int64
					var got string
					var port int
					err := db.QueryRow("SELECT id, tag, "+nodePort+" FROM "+table+" WHERE id = $1", k).Scan(&id, &got, &port)
					switch {
					case errors.Is(err, sql.ErrNoRows):
						r.stale.Add(1)
						r.note("asked id %d: no row", k)
					case err != nil:
						r.errs.Add(1)
						r.note("read %d: %v", k, err)
					case id != k || got != tag:
						r.wrong.Add(1)
						r.note("asked id %d, got (%d, %q)", k, id, got)
					case port != cluster.Writer.Port:
						r.onReplica.Add(1)
					}
				}()
			}
		}()
	}
	wg.Wait()
	return &r
}

func (r *churnResult) String() string {
	return fmt.Sprintf("cycles=%d wrong=%d stale=%d errors=%d panics=%d on replicas=%d first=%q",
		r.cycles.Load(), r.wrong.Load(), r.stale.Load(), r.errs.Load(), r.panics.Load(), r.onReplica.Load(), r.first)
}

// clean fails the test unless every cycle read its own row, without error.
func (r *churnResult) clean(t *testing.T) {
	t.Helper()
	if r.wrong.Load()+r.stale.Load()+r.errs.Load()+r.panics.Load() != 0 {
		t.Errorf("%s", r)
	}
}

// newChurnTable creates the churn workload's table.
func newChurnTable(t *testing.T) string {
	t.Helper()
	table := newTable(t)
	db, err := sql.Open("pgx", cluster.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("ALTER TABLE " + table + " ADD COLUMN tag text, ALTER COLUMN v SET DEFAULT 0"); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitCaughtUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	return table
}

// logMarks is where each log stood, to read what came after.
type logMarks struct {
	servers  []int
	bouncers []int
}

func (bs *bouncers) all() []*pgtest.Bouncer {
	return append([]*pgtest.Bouncer{bs.writer}, bs.replicas...)
}

func (bs *bouncers) mark() logMarks {
	var m logMarks
	for _, l := range cluster.ServerLogs() {
		m.servers = append(m.servers, len(l))
	}
	for _, b := range bs.all() {
		m.bouncers = append(m.bouncers, len(b.Log()))
	}
	return m
}

// since returns the lines logged after m by the servers and the bouncers
// that contain any of subs.
func (bs *bouncers) since(m logMarks, subs ...string) []string {
	var logs []string
	for i, l := range cluster.ServerLogs() {
		if i < len(m.servers) && m.servers[i] <= len(l) {
			logs = append(logs, l[m.servers[i]:])
		}
	}
	for i, b := range bs.all() {
		if l := b.Log(); m.bouncers[i] <= len(l) {
			logs = append(logs, l[m.bouncers[i]:])
		}
	}
	var out []string
	for _, l := range logs {
		for _, line := range strings.Split(l, "\n") {
			for _, s := range subs {
				if strings.Contains(line, s) {
					out = append(out, line)
					break
				}
			}
		}
	}
	return out
}

// Log lines that mean an answer went astray (PgBouncer: a server
// connection answered while no client was linked to it) or a statement
// name of pgryw's met another server connection than its own.
var (
	astray     = []string{"when not linked", "idle server got"}
	collisions = []string{`prepared statement "pgryw_`}
)

// TestIntegrationPoolerChurn: through PgBouncer 1.18 (Debian's) in
// transaction and in session mode, with replicas 100 ms behind and
// connections closed after every statement, pgryw returns every row asked
// for and nothing else, in both exec modes pgx can use behind a
// transaction pooler without protocol-level prepared statements, as pgx
// does on the primary through the same bouncer (the baseline that shows the
// workload is sound); no answer goes astray and no statement name of
// pgryw's collides.
func TestIntegrationPoolerChurn(t *testing.T) {
	setDelay(t, 100*time.Millisecond)
	for _, mode := range []string{"transaction", "session"} {
		t.Run(mode, func(t *testing.T) {
			bs := startBouncers(t, mode, 3)
			table := newChurnTable(t)
			for _, em := range []string{"simple_protocol", "exec"} {
				t.Run(em, func(t *testing.T) {
					pdb, err := sql.Open("pgx", bs.writerDSN("default_query_exec_mode="+em))
					if err != nil {
						t.Fatal(err)
					}
					defer pdb.Close()
					base := churn(t, pdb, table, 12, 100, "pgx-"+em)
					t.Logf("pgx through the writer's bouncer: %s", base)
					base.clean(t)

					m := bs.mark()
					db, c := openDSN(t, bs.pgrywDSN("default_query_exec_mode="+em))
					res := churn(t, db, table, 12, 200, "pgryw-"+em)
					st := c.Stats()
					t.Logf("pgryw: %s; stats %+v", res, st)
					res.clean(t)
					// A replica's check must run in the read's own
					// transaction, chained into its extended-protocol
					// execution: in the simple protocol, behind what pgryw
					// takes for a transaction pooler, reads that need one
					// run on the primary.
					if em == "exec" && res.onReplica.Load() == 0 {
						t.Errorf("no read served by a replica: %s", res)
					}
					if st.CaptureFailures != 0 {
						t.Errorf("%d captures failed", st.CaptureFailures)
					}
					if l := bs.since(m, append(astray, collisions...)...); len(l) > 0 {
						t.Errorf("%d log lines of answers gone astray or names colliding, first %q", len(l), l[0])
					}
				})
			}
		})
	}
}

// TestIntegrationPoolerNoneGoesAstray shows what the churn test guards
// against: told there is no pooler (pooler=none), pgryw lets its
// ride-alongs follow statements that end a transaction, and behind
// PgBouncer in transaction mode their answers go astray (to no client, or
// to another one) and its named statements collide.
func TestIntegrationPoolerNoneGoesAstray(t *testing.T) {
	setDelay(t, 100*time.Millisecond)
	bs := startBouncers(t, "transaction", 3)
	table := newChurnTable(t)
	m := bs.mark()
	db, c := openDSN(t, bs.pgrywDSN("default_query_exec_mode=exec&pooler=none"))
	res := churn(t, db, table, 12, 400, "none")
	st := c.Stats()
	lines := bs.since(m, append(astray, collisions...)...)
	t.Logf("pooler=none: %s; captures failed %d; %d log lines", res, st.CaptureFailures, len(lines))
	if len(lines) == 0 && st.CaptureFailures == 0 && res.wrong.Load()+res.panics.Load()+res.errs.Load() == 0 {
		t.Fatal("with pooler=none nothing went astray: the churn test would not see the hazard")
	}
}

// repointRound writes n rows and reads each back at once, then repoints
// the replica bouncer at the standby whose replay is paused and reads
// every row again, on connections opened after the repoint; it returns
// how many of those reads missed their row.
func repointRound(t *testing.T, bs *bouncers, table, extra string, n int) (stale int) {
	t.Helper()
	ctx := context.Background()
	r2 := cluster.Replicas[1]
	bs.replicas[0].Repoint(replicaTarget(0))
	db, c := openDSN(t, bs.writerDSN("default_query_exec_mode=exec&"+extra)+"&replicas="+bs.replicas[0].Addr())
	if strings.Contains(extra, "read_your_writes=off") {
		// The control: what the reads before the repoint learned of the
		// address is all that is known of it, as it is for the moments
		// between two of the monitor's polls (which, polling through the
		// repointed bouncer, may learn of the new server's position
		// first, and make the control pass by timing).
		pgryw.StopMonitor(c)
	}
	base := time.Now().UnixNano()
	before := 0 // reads before the repoint served by r1
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = base + int64(i)
		if _, err := db.Exec("INSERT INTO "+table+" (id, tag) VALUES ($1, 'repoint')", ids[i]); err != nil {
			t.Fatal(err)
		}
		var port int
		if err := db.QueryRow("SELECT "+nodePort+" FROM "+table+" WHERE id = $1", ids[i]).Scan(&port); err != nil {
			t.Fatalf("read %d before the repoint: %v", i, err)
		}
		if port == cluster.Replicas[0].Port {
			before++
		}
	}
	if before == 0 {
		t.Errorf("no read before the repoint was served by %s", cluster.Replicas[0].Addr())
	}
	if err := bs.replicas[0].Repoint(replicaTarget(1)); err != nil {
		t.Fatal(err)
	}
	// The bouncer leads to r2 for new clients once it has reloaded.
	probe := strings.Replace(bs.writerDSN("default_query_exec_mode=simple_protocol"), bs.writer.Addr(), bs.replicas[0].Addr(), 1)
	deadline := time.Now().Add(10 * time.Second)
	for {
		pdb, err := sql.Open("pgx", probe)
		if err != nil {
			t.Fatal(err)
		}
		var port int
		err = pdb.QueryRowContext(ctx, "SELECT inet_server_port()").Scan(&port)
		pdb.Close()
		if err == nil && port == r2.Port {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bouncer does not lead to %s after its reload: port %d, %v", r2.Addr(), port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Every read on connections opened after the repoint: the pool's, and
	// the replica connections they gave back (lent to the next reads).
	db.SetMaxIdleConns(0)
	pgryw.CloseIdleReplicaConns(c)
	for i, id := range ids {
		var got int64
		err := db.QueryRow("SELECT id FROM "+table+" WHERE id = $1", id).Scan(&got)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			stale++
		case err != nil:
			t.Fatalf("read %d after the repoint: %v", i, err)
		}
	}
	t.Logf("%s: %d of %d reads after the repoint missed their row; stats %+v", extra, stale, n, c.Stats())
	return stale
}

// TestIntegrationPoolerRepoint: the replica bouncer is repointed (RELOAD,
// no client connection breaks) from a standby that has every row to one
// whose replay is paused; the rows written and read before are read again
// on connections opened after it. pgryw's knowledge of what the node
// replayed belonged to the old server: every read is checked again, finds
// the new one behind, and reads the primary, with pooler=none too (the
// instance is read at connect there as well; before, what was known
// belonged to the address, and every read missed its row). The control,
// read_your_writes=off, misses its rows: the repoint leads to a standby
// behind, so a read that skipped its check would show.
func TestIntegrationPoolerRepoint(t *testing.T) {
	pgtest.Require(t, cluster)
	ctx := context.Background()
	table := newChurnTable(t) // while both standbys replay
	if err := cluster.PauseReplay(ctx, 1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.ResumeReplay(ctx, 1); err != nil {
			t.Error(err)
		}
		if err := cluster.WaitCaughtUp(ctx); err != nil {
			t.Error(err)
		}
	})
	for _, mode := range []string{"transaction", "session"} {
		t.Run(mode, func(t *testing.T) {
			bs := startBouncers(t, mode, 3)
			if stale := repointRound(t, bs, table, "pooler=auto", 5); stale != 0 {
				t.Errorf("%d stale reads after the repoint", stale)
			}
			if mode == "session" {
				if stale := repointRound(t, bs, table, "pooler=none", 5); stale != 0 {
					t.Errorf("pooler=none: %d stale reads after the repoint", stale)
				}
				if stale := repointRound(t, bs, table, "read_your_writes=off", 5); stale == 0 {
					t.Error("with read_your_writes=off no read after the repoint was stale: the test would not see a read that skips its check")
				}
			}
		})
	}
}
