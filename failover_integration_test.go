package pgryw_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// TestIntegrationWriterFailover kills the writer while a workload runs, on
// a cluster of its own (a writer and one replica, both named as writer
// candidates in the DSN): workers write unique ids and read each back at
// once, through a pool with session_scope=db and through one with
// session_scope=conn whose workers carry a Session each. Before the kill
// the replica stops receiving and a large write goes through both pools,
// so the writer dies with history the replica never got (as an
// asynchronous primary can) and the sessions' positions lie far beyond
// anything the new writer will write for a long time. Then the replica is
// promoted and the old writer rebuilt as its standby.
//
// It asserts what docs/guarantees.md promises across a failover:
//   - writes resume within a bounded time after the promotion;
//   - no write is duplicated (ids are unique, rows are counted);
//   - a write acknowledged after the promotion is never lost; only writes
//     acknowledged by the old writer may be gone;
//   - 0 stale reads: a read that follows a write sees it whenever the new
//     writer has it;
//   - errors only for statements started before the promotion (in flight
//     at the kill, or while there was no writer);
//   - the rebuilt old writer serves reads again, for both pools (the
//     first names it only as a writer candidate): no read waits for a
//     position of the old history.
func TestIntegrationWriterFailover(t *testing.T) {
	pgtest.Require(t, cluster)
	if cluster.Provider != "local" {
		t.Skipf("stops and rebuilds the writer: needs local servers; this run uses a %s cluster", cluster.Provider)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	fc, err := pgtest.Start(ctx, pgtest.Options{Replicas: 1, BinDir: cluster.BinDir, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer fc.Close()
	if err := installNodeProbes(fc); err != nil {
		t.Fatal(err)
	}
	oldWriter, newWriter := fc.Writer, fc.Replicas[0]
	multi := fc.MultiHostDSN()
	// The first pool names the old writer only as a writer candidate; the
	// second lists both nodes as replicas too.
	dbP, cP := openDSN(t, multi+"&replicas="+newWriter.Addr())
	dbS, cS := openDSN(t, multi+"&replicas="+oldWriter.Addr()+","+newWriter.Addr()+"&session_scope=conn")
	logs := &syncBuffer{}
	cP.SetLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	// A pool that sits idle through the failover: its connections to the
	// old writer are found dead when it is next used, before anything is
	// sent on them.
	dbIdle, _ := openDSN(t, multi+"&replicas="+newWriter.Addr())
	for _, db := range []*sql.DB{dbP, dbS, dbIdle} {
		db.SetMaxOpenConns(8)
		db.SetMaxIdleConns(8)
	}
	if _, err := dbP.ExecContext(ctx, "CREATE TABLE fo (id bigint NOT NULL, worker int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	if _, err := dbP.ExecContext(ctx, "CREATE TABLE fo_lost (pad text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	if err := fc.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}

	h := &foHistory{writes: map[int64]foOp{}}
	var stop atomic.Bool
	var wg sync.WaitGroup
	const workersPerPool = 3
	for w := 0; w < 2*workersPerPool; w++ {
		db, sess := dbP, (*pgryw.Session)(nil)
		if w >= workersPerPool {
			db, sess = dbS, pgryw.NewSession()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.worker(ctx, db, sess, w, &stop)
		}()
	}
	stopWorkers := func() {
		stop.Store(true)
		wg.Wait()
	}
	defer stopWorkers()

	sleep := func(d time.Duration) {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	sleep(500 * time.Millisecond)
	// The replica stops receiving: what the writer writes from now on dies
	// with it.
	if err := fc.PauseStreaming(ctx, 0); err != nil {
		t.Fatal(err)
	}
	lostSession := pgryw.NewSession() // writes only what will be lost
	big := "INSERT INTO fo_lost SELECT repeat('x', 1000) FROM generate_series(1, 4000)"
	if _, err := dbP.ExecContext(ctx, big); err != nil {
		t.Fatal(err)
	}
	if _, err := dbS.ExecContext(pgryw.WithSession(ctx, lostSession), big); err != nil {
		t.Fatal(err)
	}
	// Three idle connections, each handed out twice (pgx pings a connection
	// handed out for the first time, or after a second idle).
	for range 2 {
		var conns []*sql.Conn
		for range 3 {
			conn, err := dbIdle.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, conn)
		}
		for _, conn := range conns {
			if _, err := conn.ExecContext(ctx, "SELECT 1 FROM fo_lost LIMIT 0"); err != nil {
				t.Fatal(err)
			}
			conn.Close()
		}
	}
	sleep(200 * time.Millisecond)
	tStop := time.Now()
	if err := fc.StopWriter(); err != nil {
		t.Fatal(err)
	}
	sleep(300 * time.Millisecond) // no writer at all
	if err := fc.Failover(ctx, 0); err != nil {
		t.Fatal(err)
	}
	tPromoted := time.Now()
	t.Logf("writer %s stopped at +0, %s promoted at +%v", oldWriter.Addr(), newWriter.Addr(), tPromoted.Sub(tStop).Round(time.Millisecond))
	for i := range 3 {
		id := -int64(i + 1) // the workers' ids are positive
		if _, err := dbIdle.ExecContext(ctx, "INSERT INTO fo VALUES ($1, -1)", id); err != nil {
			t.Errorf("write %d through the pool idle since before the failover: %v", i, err)
		}
		var n int
		if err := dbIdle.QueryRowContext(ctx, "SELECT count(*) FROM fo WHERE id = $1", id).Scan(&n); err != nil || n != 1 {
			t.Errorf("read %d through the pool idle since before the failover: %d rows, %v", i, n, err)
		}
	}

	const resumeBound = 20 * time.Second
	resumed, ok := h.firstWriteAfter(ctx, tPromoted, resumeBound)
	if !ok {
		t.Fatalf("no write succeeded within %v of the promotion", resumeBound)
	}
	t.Logf("writes resumed %v after the promotion", resumed.Sub(tPromoted).Round(time.Millisecond))

	how, err := fc.RebuildStandby(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("old writer rebuilt as a standby by %s at +%v", how, time.Since(tStop).Round(time.Millisecond))

	// The rebuilt old writer serves reads: the pool whose watermark was
	// raised by the lost write, and a Session whose token is of the old
	// history, are both served by it.
	const servedBound = 20 * time.Second
	for _, p := range []struct {
		name string
		db   *sql.DB
		ctx  context.Context
	}{
		{"session_scope=db pool", dbP, ctx},
		{"Session with a lost position", dbS, pgryw.WithSession(ctx, lostSession)},
	} {
		start := time.Now()
		var port, tries int
		for port != oldWriter.Port && time.Since(start) < servedBound {
			tries++
			if err := p.db.QueryRowContext(p.ctx, "SELECT "+nodePort).Scan(&port); err != nil {
				t.Fatalf("%s: served-by read: %v", p.name, err)
			}
			if port != oldWriter.Port {
				sleep(20 * time.Millisecond)
			}
		}
		if port != oldWriter.Port {
			t.Errorf("%s: the rebuilt old writer %s served no read within %v (%d reads; the last was served by port %d)",
				p.name, oldWriter.Addr(), servedBound, tries, port)
		} else {
			t.Logf("%s: a read was served by the rebuilt old writer after %v", p.name, time.Since(start).Round(time.Millisecond))
		}
	}
	sleep(300 * time.Millisecond)
	stopWorkers()
	t.Logf("stats, session_scope=db pool: %+v", cP.Stats())
	t.Logf("stats, session_scope=conn pool: %+v", cS.Stats())

	h.check(t, ctx, dbP, tPromoted)
	text := logs.String()
	for _, want := range []string{
		`level=WARN msg="pgryw: the writer changed`,
		`level=WARN msg="pgryw: node is not in recovery (the writer, or promoted): no reads go to it" node=` + newWriter.Addr(),
		`level=INFO msg="pgryw: node is a standby again: reads may go to it" node=` + oldWriter.Addr(),
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no log line %s; the log:\n%s", want, text)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writes (a log).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// foOp is one write or read of the failover workload.
type foOp struct {
	id         int64
	start, end time.Time
	n          int // rows a read counted
	err        error
}

type foHistory struct {
	mu     sync.Mutex
	seq    atomic.Int64
	writes map[int64]foOp
	reads  []foOp
}

// worker writes a new id and reads it back, until stop; errors make it
// pause a little, as an application would.
func (h *foHistory) worker(ctx context.Context, db *sql.DB, sess *pgryw.Session, w int, stop *atomic.Bool) {
	if sess != nil {
		ctx = pgryw.WithSession(ctx, sess)
	}
	for !stop.Load() && ctx.Err() == nil {
		id := h.seq.Add(1)
		op := foOp{id: id, start: time.Now()}
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, op.err = db.ExecContext(octx, "INSERT INTO fo VALUES ($1, $2)", id, w)
		cancel()
		op.end = time.Now()
		h.mu.Lock()
		h.writes[id] = op
		h.mu.Unlock()
		if op.err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		rd := foOp{id: id, start: time.Now()}
		octx, cancel = context.WithTimeout(ctx, 5*time.Second)
		rd.err = db.QueryRowContext(octx, "SELECT count(*) FROM fo WHERE id = $1", id).Scan(&rd.n)
		cancel()
		rd.end = time.Now()
		h.mu.Lock()
		h.reads = append(h.reads, rd)
		h.mu.Unlock()
		if rd.err != nil {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// firstWriteAfter waits until a write that started after t has succeeded,
// and returns when it ended.
func (h *foHistory) firstWriteAfter(ctx context.Context, t time.Time, bound time.Duration) (time.Time, bool) {
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		h.mu.Lock()
		var first time.Time
		for _, op := range h.writes {
			if op.err == nil && !op.start.Before(t) && (first.IsZero() || op.end.Before(first)) {
				first = op.end
			}
		}
		h.mu.Unlock()
		if !first.IsZero() {
			return first, true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Time{}, false
}

// check compares what the workers saw with the final state on the new
// writer.
func (h *foHistory) check(t *testing.T, ctx context.Context, db *sql.DB, promoted time.Time) {
	t.Helper()
	rows, err := db.QueryContext(pgryw.WithPrimary(ctx), "SELECT id, count(*) FROM fo GROUP BY id")
	if err != nil {
		t.Fatal(err)
	}
	final := map[int64]int{}
	for rows.Next() {
		var id int64
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		final[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var okWrites, lostOld, errBefore int
	errKinds := map[string]int{}
	var bad []string
	fail := func(format string, args ...any) {
		if len(bad) < 20 {
			bad = append(bad, fmt.Sprintf(format, args...))
		}
	}
	for id, n := range final {
		if n > 1 {
			fail("id %d written %d times", id, n)
		}
		if _, ok := h.writes[id]; !ok && id > 0 {
			fail("id %d on the writer was never written", id)
		}
	}
	for id, op := range h.writes {
		switch {
		case op.err == nil && final[id] == 1:
			okWrites++
		case op.err == nil && op.end.Before(promoted):
			lostOld++ // acknowledged by the old writer, never replicated
		case op.err == nil:
			fail("id %d: write acknowledged at +%v after the promotion is missing", id, op.end.Sub(promoted))
		case !op.start.Before(promoted):
			fail("id %d: write started %v after the promotion failed: %v", id, op.start.Sub(promoted), op.err)
		default:
			errBefore++
			errKinds[errKind(op.err)]++
		}
	}
	var reads, stale, readErrs int
	for _, rd := range h.reads {
		switch {
		case rd.err != nil && !rd.start.Before(promoted):
			fail("id %d: read started %v after the promotion failed: %v", rd.id, rd.start.Sub(promoted), rd.err)
		case rd.err != nil:
			readErrs++
			errKinds[errKind(rd.err)]++
		case rd.n == 0 && final[rd.id] == 1:
			stale++
			fail("id %d: stale read at +%v (the write is on the new writer)", rd.id, rd.start.Sub(promoted))
		default:
			reads++
		}
	}
	var kinds []string
	for k, n := range errKinds {
		kinds = append(kinds, fmt.Sprintf("%dx %s", n, k))
	}
	sort.Strings(kinds)
	t.Logf("writes: %d on the new writer, %d acknowledged by the old writer and lost, %d failed before the promotion; reads: %d fine, %d stale, %d failed before the promotion",
		okWrites, lostOld, errBefore, reads, stale, readErrs)
	t.Logf("errors before the promotion: %s", strings.Join(kinds, "; "))
	if okWrites == 0 || reads == 0 {
		t.Errorf("the workload did nothing: %d writes, %d reads", okWrites, reads)
	}
	for _, b := range bad {
		t.Error(b)
	}
}

// errKind shortens an error for the summary: its text without ids or
// addresses is enough to tell the kinds apart.
func errKind(err error) string {
	s := err.Error()
	if i := strings.Index(s, "127.0.0.1"); i >= 0 {
		s = s[:i] + "…"
	}
	if len(s) > 100 {
		s = s[:100] + "…"
	}
	return s
}
