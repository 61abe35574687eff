package pgtest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgryw/pgryw/internal/pgtest"
)

// The test binary doubles as a stand-in for pgdocker and as the stop/start
// command of an external cluster: TestMain hands over to helperMain when
// its first argument is helperArg.
const helperArg = "pgtest-helper"

func helperCmd(args ...string) *osexec.Cmd {
	return osexec.Command(os.Args[0], append([]string{helperArg}, args...)...)
}

func helperMain(args []string) int {
	switch args[0] {
	case "unavailable": // pgdocker serve without a Docker engine
		fmt.Fprintln(os.Stderr, "fake pgdocker: no Docker engine answered (fake); nothing to do")
		fmt.Println(`{"unavailable":"no Docker engine answered (fake)"}`)
		return 0
	case "serve": // serve JSON MARKER: describe JSON, hold until EOF, then leave MARKER
		fmt.Printf("{\"cluster\":%s}\n", args[1])
		io.Copy(io.Discard, os.Stdin)
		if err := os.WriteFile(args[2], []byte("closed\n"), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	case "say": // say LINE: write LINE and exit
		fmt.Println(args[1])
		return 0
	case "hook": // hook URL: what a stop/start command does
		resp, err := http.Get(args[1])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			fmt.Fprintf(os.Stderr, "%s: %s\n", resp.Status, b)
			return 1
		}
		return 0
	}
	fmt.Fprintf(os.Stderr, "unknown helper %q\n", args)
	return 2
}

// requireLocal skips tests that start local clusters of their own when the
// suite runs on servers from elsewhere.
func requireLocal(t *testing.T) {
	t.Helper()
	pgtest.Require(t, cluster)
	if cluster.Provider != "local" {
		t.Skipf("starts local clusters; this run uses a %s cluster", cluster.Provider)
	}
}

func describe(t *testing.T, c *pgtest.Cluster) string {
	t.Helper()
	b, err := json.Marshal(c.External())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func show(t *testing.T, ctx context.Context, dsn, query string) string {
	t.Helper()
	var v string
	if err := dial(t, ctx, dsn).QueryRow(ctx, query).Scan(&v); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return v
}

// TestExternalCluster runs the SQL-only helpers through the external
// backend, on the servers of the package's own cluster described in
// PGRYW_PG_EXTERNAL.
func TestExternalCluster(t *testing.T) {
	pgtest.Require(t, cluster)
	ctx := ctxFor(t)
	// State a killed earlier run could leave: Start must undo it.
	if err := cluster.SetApplyDelay(ctx, 0, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := cluster.PauseReplay(ctx, 1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cluster.ResumeReplay(context.Background(), -1)
		cluster.SetApplyDelay(context.Background(), -1, 0)
	})
	desc := describe(t, cluster)
	t.Logf("%s=%s", pgtest.ExternalEnv, desc)
	t.Setenv(pgtest.ExternalEnv, desc)
	t.Setenv(pgtest.ProviderEnv, "")
	c, err := pgtest.Start(ctx, pgtest.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Provider != "external" || c.BinDir != "" || c.ServerVersionNum != cluster.ServerVersionNum ||
		c.WriterDSN() != cluster.WriterDSN() || fmt.Sprint(c.ReplicaAddrs()) != fmt.Sprint(cluster.ReplicaAddrs()) {
		t.Fatalf("external cluster %+v does not match %+v", c, cluster)
	}
	if got := show(t, ctx, c.ReplicaDSN(0), "SHOW recovery_min_apply_delay"); got != "0" {
		t.Errorf("Start left recovery_min_apply_delay = %s on replica 0", got)
	}
	if got := show(t, ctx, c.ReplicaDSN(1), "SELECT pg_get_wal_replay_pause_state()"); got != "not paused" {
		t.Errorf("Start left replica 1 %s", got)
	}

	w := dial(t, ctx, c.WriterDSN())
	r0 := dial(t, ctx, c.ReplicaDSN(0))
	r1 := dial(t, ctx, c.ReplicaDSN(1))
	exec(t, ctx, w, "DROP TABLE IF EXISTS ext")
	exec(t, ctx, w, "CREATE TABLE ext (id int PRIMARY KEY)")
	if err := c.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}

	const delay = 300 * time.Millisecond
	if err := c.SetApplyDelay(ctx, 0, delay); err != nil {
		t.Fatal(err)
	}
	if got := show(t, ctx, c.ReplicaDSN(0), "SHOW recovery_min_apply_delay"); got != "300ms" {
		t.Fatalf("SHOW recovery_min_apply_delay = %q", got)
	}
	exec(t, ctx, w, "INSERT INTO ext VALUES (1)")
	start := time.Now()
	if has(t, ctx, r0, "ext", 1) {
		t.Fatal("row visible on the delayed replica at once")
	}
	if err := c.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < delay-50*time.Millisecond || !has(t, ctx, r0, "ext", 1) {
		t.Fatalf("WaitCaughtUp returned after %v, row visible %v; want about %v and true", waited, has(t, ctx, r0, "ext", 1), delay)
	}
	if err := c.SetApplyDelay(ctx, -1, 0); err != nil {
		t.Fatal(err)
	}

	if err := c.PauseReplay(ctx, 1); err != nil {
		t.Fatal(err)
	}
	exec(t, ctx, w, "INSERT INTO ext VALUES (2)")
	if err := c.WaitCaughtUp(ctx); err == nil || !strings.Contains(err.Error(), "paused") {
		t.Fatalf("WaitCaughtUp with a paused replica: %v, want an error saying paused", err)
	}
	if has(t, ctx, r1, "ext", 2) {
		t.Fatal("row visible on a paused replica")
	}
	if err := c.ResumeReplay(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if !has(t, ctx, r1, "ext", 2) {
		t.Fatal("row missing after resume")
	}

	if err := c.StopNode(0); !errors.Is(err, pgtest.ErrStopUnsupported) || !strings.Contains(err.Error(), "external cluster: stopping nodes is not supported") {
		t.Fatalf("StopNode without stop commands: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got := show(t, ctx, cluster.WriterDSN(), "SELECT 1"); got != "1" {
		t.Fatal("writer gone after the external cluster's Close")
	}
}

// TestExternalHooksAndPromote gives an external description stop and start
// commands (the test binary asking this process to stop or start a server
// of a local cluster of its own), and promotes through it.
func TestExternalHooksAndPromote(t *testing.T) {
	requireLocal(t)
	ctx := ctxFor(t)
	own, err := pgtest.Start(ctx, pgtest.Options{Replicas: 1, BinDir: cluster.BinDir})
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		var err error
		switch r.URL.Path {
		case "/stop":
			err = own.StopBehindItsBack(0)
		case "/start":
			err = own.StartBehindItsBack(r.Context(), 0)
		default:
			err = errors.New("no such hook")
		}
		if err != nil {
			http.Error(rw, err.Error(), http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	ext := own.External()
	ext.Replicas[0].Stop = helperCmd("hook", srv.URL+"/stop").Args
	ext.Replicas[0].Start = helperCmd("hook", srv.URL+"/start").Args
	c, err := pgtest.StartExternal(ctx, ext, pgtest.Options{Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	w := dial(t, ctx, c.WriterDSN())
	exec(t, ctx, w, "CREATE TABLE hooked (id int PRIMARY KEY)")
	if err := c.StopNode(0); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	if conn, err := pgx.Connect(cctx, c.ReplicaDSN(0)); err == nil {
		conn.Close(ctx)
		t.Fatal("stopped replica accepted a connection")
	}
	cancel()
	if err := c.SetApplyDelay(ctx, 0, time.Second); err == nil {
		t.Error("SetApplyDelay on a stopped replica succeeded")
	}
	exec(t, ctx, w, "INSERT INTO hooked VALUES (1)")
	if err := c.WaitCaughtUp(ctx); err != nil { // skips the stopped one
		t.Fatal(err)
	}
	if err := c.StartNode(0); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	r := dial(t, ctx, c.ReplicaDSN(0))
	if !has(t, ctx, r, "hooked", 1) {
		t.Fatal("restarted replica lacks the row written while it was down")
	}

	// A failing command is reported with its output.
	broken := ext
	broken.Replicas = []pgtest.ExternalNode{ext.Replicas[0]}
	broken.Replicas[0].Stop = helperCmd("hook", srv.URL+"/nonesuch").Args
	c2, err := pgtest.StartExternal(ctx, broken, pgtest.Options{Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := c2.StopNode(0); err == nil || !strings.Contains(err.Error(), "stop command") || !strings.Contains(err.Error(), "no such hook") {
		t.Fatalf("StopNode with a failing stop command: %v", err)
	}
	c2.Close()

	if err := c.Promote(ctx, 0); err != nil {
		t.Fatal(err)
	}
	exec(t, ctx, r, "INSERT INTO hooked VALUES (2)")
	if err := c.WaitCaughtUp(ctx); err != nil { // skips the promoted one
		t.Fatal(err)
	}
	if _, err := pgtest.StartExternal(ctx, ext, pgtest.Options{Replicas: 1}); err == nil || !strings.Contains(err.Error(), "not in recovery") {
		t.Fatalf("StartExternal on a promoted replica: %v, want an error saying it is not in recovery", err)
	}
}

func TestExternalDescriptions(t *testing.T) {
	file := filepath.Join(t.TempDir(), "cluster.json")
	if err := os.WriteFile(file, []byte(`{"writer": {"port": 5432}, "replicas": [{"port": 5433, "host": "h"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ext, err := pgtest.ParseExternal(file)
	if err != nil || ext.Writer.Port != 5432 || len(ext.Replicas) != 1 || ext.Replicas[0].Host != "h" {
		t.Fatalf("ParseExternal(file) = %+v, %v", ext, err)
	}
	for _, bad := range []string{
		`{"writer": {"port": 5432}`,
		`{"writer": {"port": 5432, "passwd": "x"}}`,
		`{"writer": {"port": 0}}`,
		`{"writer": {"port": 5432}, "replicas": [{"port": 70000}]}`,
		`{"writer": {"port": 5432}, "replicas": [{"port": 5433, "stop": ["true"]}]}`,
		`{"writer": {"port": 5432, "stop": ["true"], "start": ["true"]}}`,
		filepath.Join(t.TempDir(), "missing.json"),
	} {
		if _, err := pgtest.ParseExternal(bad); err == nil {
			t.Errorf("ParseExternal(%s) accepted it", bad)
		}
	}
	ctx := context.Background()
	t.Setenv(pgtest.ProviderEnv, "")
	t.Setenv(pgtest.ExternalEnv, `{"writer": {"port": 5432}, "typo": 1}`)
	if _, err := pgtest.Start(ctx, pgtest.Options{}); err == nil || errors.Is(err, pgtest.ErrNoServer) || !strings.Contains(err.Error(), pgtest.ExternalEnv) {
		t.Errorf("Start with a bad %s: %v; want an error naming it, not ErrNoServer", pgtest.ExternalEnv, err)
	}
	t.Setenv(pgtest.ExternalEnv, `{"writer": {"port": 5432}, "replicas": [{"port": 5433}]}`)
	if _, err := pgtest.Start(ctx, pgtest.Options{}); err == nil || !strings.Contains(err.Error(), "has 1 replicas; 2 wanted") {
		t.Errorf("Start wanting more replicas than described: %v", err)
	}
	// An explicit BinDir means local servers, whatever the environment says.
	if _, err := pgtest.Start(ctx, pgtest.Options{BinDir: "/nonexistent/bin"}); err == nil || !strings.Contains(err.Error(), "/nonexistent/bin") {
		t.Errorf("Start with BinDir and %s: %v; want the bad bin dir error", pgtest.ExternalEnv, err)
	}

	// DSNs carry the description's credentials, escaped.
	n := pgtest.Node{Host: "db", Port: 6543, User: "u@x", Password: "p/w", Database: "d b"}
	if got, want := n.DSN(), "postgres://u%40x:p%2Fw@db:6543/d%20b?sslmode=disable"; got != want {
		t.Errorf("DSN() = %s, want %s", got, want)
	}
	if got, want := (pgtest.Node{Host: "127.0.0.1", Port: 5432}).DSN(), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"; got != want {
		t.Errorf("DSN() = %s, want %s", got, want)
	}
}

// TestProviderStepsAside: PGRYW_PG_PROVIDER=docker where pgdocker finds no
// engine falls back to local binaries.
func TestProviderStepsAside(t *testing.T) {
	requireLocal(t)
	ctx := ctxFor(t)
	defer pgtest.SetProviderCommand(func(int) (*osexec.Cmd, error) { return helperCmd("unavailable"), nil })()
	t.Setenv(pgtest.ExternalEnv, "")
	t.Setenv(pgtest.ProviderEnv, "docker")
	c, err := pgtest.Start(ctx, pgtest.Options{Replicas: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Provider != "local" || c.BinDir == "" {
		t.Fatalf("provider %q, bin dir %q; want local servers", c.Provider, c.BinDir)
	}

	for _, reply := range []string{"", "not json", "{}"} {
		pgtest.SetProviderCommand(func(int) (*osexec.Cmd, error) { return helperCmd("say", reply), nil })
		if _, err := pgtest.Start(ctx, pgtest.Options{Replicas: -1}); err == nil || errors.Is(err, pgtest.ErrNoServer) {
			t.Errorf("provider replying %q: %v; want a failure", reply, err)
		}
	}
	t.Setenv(pgtest.ProviderEnv, "podman")
	if _, err := pgtest.Start(ctx, pgtest.Options{Replicas: -1}); err == nil || !strings.Contains(err.Error(), "podman") {
		t.Errorf("unknown provider: %v", err)
	}
}

// TestProviderServe plays pgdocker serve over the package's cluster: Start
// takes the cluster it describes, and Close ends the provider.
func TestProviderServe(t *testing.T) {
	pgtest.Require(t, cluster)
	ctx := ctxFor(t)
	marker := filepath.Join(t.TempDir(), "closed")
	desc := describe(t, cluster)
	var replicas int
	defer pgtest.SetProviderCommand(func(n int) (*osexec.Cmd, error) {
		replicas = n
		return helperCmd("serve", desc, marker), nil
	})()
	t.Setenv(pgtest.ExternalEnv, "")
	t.Setenv(pgtest.ProviderEnv, "docker")
	c, err := pgtest.Start(ctx, pgtest.Options{Replicas: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Provider != "docker" || replicas != 2 || c.WriterDSN() != cluster.WriterDSN() {
		t.Fatalf("provider %q (asked for %d replicas), writer %s", c.Provider, replicas, c.WriterDSN())
	}
	if err := c.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("provider ended before Close")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("provider not ended by Close: %v", err)
	}
}
