package pgtest_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgryw/pgryw/internal/pgtest"
)

var cluster *pgtest.Cluster

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == helperArg {
		os.Exit(helperMain(os.Args[2:]))
	}
	opts := pgtest.Options{
		Replicas: 2,
		Logf:     func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) },
	}
	os.Exit(pgtest.Main(m, opts, func(c *pgtest.Cluster) { cluster = c }))
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func dial(t *testing.T, ctx context.Context, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func exec(t *testing.T, ctx context.Context, conn *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// has reports whether table tbl holds row id on conn's node.
func has(t *testing.T, ctx context.Context, conn *pgx.Conn, tbl string, id int) bool {
	t.Helper()
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+tbl+" WHERE id = $1", id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

func TestReplicasFollowWriter(t *testing.T) {
	pgtest.Require(t, cluster)
	ctx := ctxFor(t)
	if len(cluster.Replicas) != 2 || len(cluster.ReplicaAddrs()) != 2 {
		t.Fatalf("replicas %v", cluster.ReplicaAddrs())
	}
	w := dial(t, ctx, cluster.WriterDSN())
	exec(t, ctx, w, "DROP TABLE IF EXISTS follow")
	exec(t, ctx, w, "CREATE TABLE follow (id int PRIMARY KEY)")
	exec(t, ctx, w, "INSERT INTO follow VALUES (1)")
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range cluster.Replicas {
		r := dial(t, ctx, cluster.ReplicaDSN(i))
		if !has(t, ctx, r, "follow", 1) {
			t.Errorf("replica %d lacks the row after WaitCaughtUp", i)
		}
		var inRec bool
		var port int
		if err := r.QueryRow(ctx, "SELECT pg_is_in_recovery(), inet_server_port()").Scan(&inRec, &port); err != nil {
			t.Fatal(err)
		}
		if !inRec || port != cluster.Replicas[i].Port {
			t.Errorf("replica %d: in recovery %v, port %d, want true, %d", i, inRec, port, cluster.Replicas[i].Port)
		}
		if _, err := r.Exec(ctx, "INSERT INTO follow VALUES (2)"); err == nil {
			t.Errorf("replica %d accepted a write", i)
		}
	}
}

func TestApplyDelay(t *testing.T) {
	pgtest.Require(t, cluster)
	ctx := ctxFor(t)
	const delay = 300 * time.Millisecond
	w := dial(t, ctx, cluster.WriterDSN())
	r0 := dial(t, ctx, cluster.ReplicaDSN(0))
	exec(t, ctx, w, "DROP TABLE IF EXISTS delayed")
	exec(t, ctx, w, "CREATE TABLE delayed (id int PRIMARY KEY)")
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cluster.SetApplyDelay(ctx, 0, delay); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.SetApplyDelay(context.Background(), -1, 0); err != nil {
			t.Error(err)
		}
	})
	var shown string
	if err := r0.QueryRow(ctx, "SHOW recovery_min_apply_delay").Scan(&shown); err != nil || shown != "300ms" {
		t.Fatalf("SHOW recovery_min_apply_delay = %q, %v", shown, err)
	}

	exec(t, ctx, w, "INSERT INTO delayed VALUES (1)")
	committed := time.Now()
	if has(t, ctx, r0, "delayed", 1) {
		t.Fatal("row visible on the delayed replica at once")
	}
	for !has(t, ctx, r0, "delayed", 1) {
		if time.Since(committed) > 10*time.Second {
			t.Fatal("row never became visible on the delayed replica")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The delay counts from the commit timestamp taken on the writer, a
	// little before our clock reading: allow some slack.
	if lag := time.Since(committed); lag < delay-50*time.Millisecond {
		t.Errorf("row visible after %v, want about %v", lag, delay)
	} else {
		t.Logf("row visible on delayed replica after %v", lag)
	}

	exec(t, ctx, w, "INSERT INTO delayed VALUES (2)")
	start := time.Now()
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if !has(t, ctx, r0, "delayed", 2) {
		t.Fatal("row missing after WaitCaughtUp")
	}
	t.Logf("WaitCaughtUp waited %v", time.Since(start))
}

func TestPauseResume(t *testing.T) {
	pgtest.Require(t, cluster)
	ctx := ctxFor(t)
	w := dial(t, ctx, cluster.WriterDSN())
	r1 := dial(t, ctx, cluster.ReplicaDSN(1))
	exec(t, ctx, w, "DROP TABLE IF EXISTS paused")
	exec(t, ctx, w, "CREATE TABLE paused (id int PRIMARY KEY)")
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cluster.PauseReplay(ctx, 1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cluster.ResumeReplay(context.Background(), -1) })
	exec(t, ctx, w, "INSERT INTO paused VALUES (1)")
	err := cluster.WaitCaughtUp(ctx)
	if err == nil || !strings.Contains(err.Error(), "paused") {
		t.Fatalf("WaitCaughtUp with a paused replica: %v, want an error saying paused", err)
	}
	time.Sleep(200 * time.Millisecond)
	if has(t, ctx, r1, "paused", 1) {
		t.Fatal("row visible on a paused replica")
	}
	if err := cluster.ResumeReplay(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if !has(t, ctx, r1, "paused", 1) {
		t.Fatal("row missing after resume")
	}
}

func TestStopStartNode(t *testing.T) {
	pgtest.Require(t, cluster)
	ctx := ctxFor(t)
	w := dial(t, ctx, cluster.WriterDSN())
	exec(t, ctx, w, "DROP TABLE IF EXISTS stopped")
	exec(t, ctx, w, "CREATE TABLE stopped (id int PRIMARY KEY)")
	if err := cluster.StopNode(0); errors.Is(err, pgtest.ErrStopUnsupported) {
		t.Skipf("%s cluster: %v", cluster.Provider, err)
	} else if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cluster.StartNode(0) })
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	if conn, err := pgx.Connect(cctx, cluster.ReplicaDSN(0)); err == nil {
		conn.Close(ctx)
		t.Fatal("stopped replica accepted a connection")
	}
	cancel()
	exec(t, ctx, w, "INSERT INTO stopped VALUES (1)")
	if err := cluster.WaitCaughtUp(ctx); err != nil { // skips the stopped one
		t.Fatal(err)
	}
	if err := cluster.SetApplyDelay(ctx, 0, time.Second); err == nil {
		t.Error("SetApplyDelay on a stopped replica succeeded")
	}
	start := time.Now()
	if err := cluster.StartNode(0); err != nil {
		t.Fatal(err)
	}
	t.Logf("StartNode took %v", time.Since(start))
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if !has(t, ctx, dial(t, ctx, cluster.ReplicaDSN(0)), "stopped", 1) {
		t.Fatal("restarted replica lacks the row written while it was down")
	}
}

// TestPromoteCopyRoute starts a cluster of its own: promotion is for good,
// and replicas made by copying the data dir (what bin dirs without
// pg_basebackup get) deserve coverage on every server.
func TestPromoteCopyRoute(t *testing.T) {
	requireLocal(t)
	ctx := ctxFor(t)
	defer pgtest.SetForceCopy(true)()
	start := time.Now()
	c, err := pgtest.Start(ctx, pgtest.Options{Replicas: 1, ApplyDelay: 100 * time.Millisecond, BinDir: cluster.BinDir,
		Settings: []string{"work_mem = '7MB'"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Logf("1+1 cluster (copy route) started in %v", time.Since(start))
	w := dial(t, ctx, c.WriterDSN())
	exec(t, ctx, w, "DROP TABLE IF EXISTS promo")
	exec(t, ctx, w, "CREATE TABLE promo AS SELECT 1 AS id")
	if err := c.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	r := dial(t, ctx, c.ReplicaDSN(0))
	var delay string
	if err := r.QueryRow(ctx, "SHOW recovery_min_apply_delay").Scan(&delay); err != nil || delay != "100ms" {
		t.Fatalf("start-time apply delay %q, %v", delay, err)
	}
	if !has(t, ctx, r, "promo", 1) {
		t.Fatal("copy-route replica lacks the row")
	}
	for name, conn := range map[string]*pgx.Conn{"writer": w, "replica": r} {
		var wm string
		if err := conn.QueryRow(ctx, "SHOW work_mem").Scan(&wm); err != nil || wm != "7MB" {
			t.Errorf("%s: Options.Settings work_mem = '7MB': SHOW work_mem = %q, %v", name, wm, err)
		}
	}
	if err := c.Promote(ctx, 0); err != nil {
		t.Fatal(err)
	}
	exec(t, ctx, r, "INSERT INTO promo VALUES (2)")
	if err := c.WaitCaughtUp(ctx); err != nil { // skips the promoted one
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(c.Writer.DataDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("data dir left after Close: %v", err)
	}
}

func TestSettingsWithLineBreakFails(t *testing.T) {
	requireLocal(t)
	_, err := pgtest.Start(ctxFor(t), pgtest.Options{Replicas: 1, BinDir: cluster.BinDir,
		Settings: []string{"work_mem = '7MB'\nfsync = on"}})
	if err == nil || !strings.Contains(err.Error(), "Settings[0]") {
		t.Fatalf("Start with a setting holding a line break: %v; want an error naming Settings[0]", err)
	}
}

func TestExplicitBadBinDirFails(t *testing.T) {
	_, err := pgtest.Start(context.Background(), pgtest.Options{BinDir: "/nonexistent/bin"})
	if err == nil || errors.Is(err, pgtest.ErrNoServer) {
		t.Fatalf("Start with a bad BinDir: %v; want an error that is not ErrNoServer", err)
	}
}

func TestWALSizes(t *testing.T) {
	if cluster != nil {
		if b, s := cluster.WALSizes(); b != 8192 || s != 16<<20 {
			t.Errorf("WAL sizes read from server: %d, %d", b, s)
		}
	}
}

// TestWaitCaughtUpAtPageBoundary writes until the writer's insert LSN sits
// just past a WAL page header, where no record ends: replay stops at the
// boundary, and WaitCaughtUp must not wait for the next WAL record (14 s
// on an idle server).
func TestWaitCaughtUpAtPageBoundary(t *testing.T) {
	pgtest.Require(t, cluster)
	ctx := ctxFor(t)
	w := dial(t, ctx, cluster.WriterDSN())
	exec(t, ctx, w, "DROP TABLE IF EXISTS boundary")
	exec(t, ctx, w, "CREATE TABLE boundary (id serial, pad text)")
	for i := 0; i < 20000; i++ {
		exec(t, ctx, w, "INSERT INTO boundary (pad) VALUES (repeat('x', $1::int))", i%97)
		var lsn string
		if err := w.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
			t.Fatal(err)
		}
		var hi, lo uint64
		if _, err := fmt.Sscanf(strings.Replace(lsn, "/", " ", 1), "%x %x", &hi, &lo); err != nil {
			t.Fatal(err)
		}
		if lo%8192 != 24 {
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		start := time.Now()
		if err := cluster.WaitCaughtUp(wctx); err != nil {
			t.Fatalf("insert LSN %s after %d inserts: %v", lsn, i+1, err)
		}
		t.Logf("insert LSN %s after %d inserts: caught up in %v", lsn, i+1, time.Since(start))
		return
	}
	t.Skip("insert LSN never landed just past a page header")
}

// TestFailoverAndRebuild fails the writer over twice on a cluster of its
// own: the writer is killed (immediate shutdown) while its replica has
// stopped receiving, so writes are lost with it; the replica is promoted
// and becomes Writer; the old writer is rebuilt as its standby, by
// pg_rewind where the bin dir has it the first time and by a copy of the
// running writer the second time. The rebuilt node must have the new
// writer's rows and not the lost ones, and the multi-host DSN must reach
// whichever node is the writer.
func TestFailoverAndRebuild(t *testing.T) {
	requireLocal(t)
	ctx := ctxFor(t)
	c, err := pgtest.Start(ctx, pgtest.Options{Replicas: 1, BinDir: cluster.BinDir, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	multi := c.MultiHostDSN()
	if !strings.Contains(multi, ","+c.Replicas[0].Addr()+"/") || !strings.HasSuffix(multi, "&target_session_attrs=read-write") {
		t.Fatalf("MultiHostDSN %q", multi)
	}
	exec(t, ctx, dial(t, ctx, c.WriterDSN()), "CREATE TABLE fo (id int PRIMARY KEY)")
	next := 1
	for round, copyRoute := range []bool{false, true} {
		oldWriter, newWriter := c.Writer, c.Replicas[0]
		w := dial(t, ctx, multi)
		if port := int(w.PgConn().Conn().RemoteAddr().(*net.TCPAddr).Port); port != oldWriter.Port {
			t.Fatalf("round %d: the multi-host DSN reached port %d, want the writer's %d", round, port, oldWriter.Port)
		}
		kept := next
		exec(t, ctx, w, "INSERT INTO fo VALUES ($1)", kept)
		if err := c.WaitCaughtUp(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.PauseStreaming(ctx, 0); err != nil {
			t.Fatal(err)
		}
		lost := next + 1
		exec(t, ctx, w, "INSERT INTO fo VALUES ($1)", lost)
		next += 2
		if err := c.StopWriter(); err != nil {
			t.Fatal(err)
		}
		if err := c.Failover(ctx, 0); err != nil {
			t.Fatal(err)
		}
		if c.Writer != newWriter || c.Replicas[0].Port != oldWriter.Port {
			t.Fatalf("round %d: after Failover writer %s, replica %s", round, c.Writer.Addr(), c.Replicas[0].Addr())
		}
		if err := c.StartNode(0); err == nil {
			t.Fatal("StartNode started the old writer as it was")
		}
		w2 := dial(t, ctx, multi)
		if port := int(w2.PgConn().Conn().RemoteAddr().(*net.TCPAddr).Port); port != newWriter.Port {
			t.Fatalf("round %d: after Failover the multi-host DSN reached port %d, want %d", round, port, newWriter.Port)
		}
		exec(t, ctx, w2, "INSERT INTO fo VALUES ($1)", next)
		after := next
		next++
		restore := pgtest.SetForceRebuildCopy(copyRoute)
		how, err := c.RebuildStandby(ctx, 0)
		restore()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: old writer rebuilt by %s", round, how)
		if _, err := os.Stat(filepath.Join(cluster.BinDir, "pg_rewind")); err == nil && !copyRoute && how != "pg_rewind" {
			t.Errorf("round %d: rebuilt by %s although %s has pg_rewind", round, how, cluster.BinDir)
		}
		if copyRoute && how != "copy" {
			t.Errorf("round %d: rebuilt by %s, want copy", round, how)
		}
		if err := c.WaitCaughtUp(ctx); err != nil {
			t.Fatal(err)
		}
		r := dial(t, ctx, c.ReplicaDSN(0))
		var inRec bool
		if err := r.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRec); err != nil || !inRec {
			t.Fatalf("rebuilt node in recovery: %v, %v", inRec, err)
		}
		if !has(t, ctx, r, "fo", kept) || !has(t, ctx, r, "fo", after) {
			t.Errorf("round %d: the rebuilt node lacks a row the new writer has", round)
		}
		if has(t, ctx, r, "fo", lost) {
			t.Errorf("round %d: the rebuilt node has row %d, lost with the old writer", round, lost)
		}
	}
}
