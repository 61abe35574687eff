package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	dc "github.com/ory/dockertest/v3/docker"

	"github.com/pgryw/pgryw/internal/pgtest"
)

const stepAside = "; nothing to do: the local-binaries path is what CI uses\n"

// runPgdocker runs the program in-process and reports how long it took.
func runPgdocker(t *testing.T, args ...string) (code int, stdout, stderr string, took time.Duration) {
	t.Helper()
	var out, errOut bytes.Buffer
	start := time.Now()
	code = run(context.Background(), args, strings.NewReader(""), &out, &errOut)
	return code, out.String(), errOut.String(), time.Since(start)
}

// TestNoEngineStepsAside: with DOCKER_HOST at a dead socket pgdocker says
// so at once, runs nothing and exits 0.
func TestNoEngineStepsAside(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix:///nonexistent.sock")
	marker := filepath.Join(t.TempDir(), "ran")
	code, stdout, stderr, took := runPgdocker(t, "-replicas", "1", "touch", marker)
	t.Logf("took %v; stderr: %s", took, stderr)
	if code != 0 {
		t.Errorf("exit status %d, want 0", code)
	}
	if !strings.HasPrefix(stderr, "pgdocker: no Docker engine answered (unix:///nonexistent.sock: ") || !strings.HasSuffix(stderr, stepAside) {
		t.Errorf("stderr %q does not step aside as documented", stderr)
	}
	if stdout != "" {
		t.Errorf("stdout %q, want nothing", stdout)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the command ran without a Docker engine")
	}
	if took > 2*time.Second {
		t.Errorf("stepping aside took %v", took)
	}
}

// With -require (make test-docker) a missing engine is a failure.
func TestNoEngineRequired(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix:///nonexistent.sock")
	marker := filepath.Join(t.TempDir(), "ran")
	code, _, stderr, _ := runPgdocker(t, "-require", "-replicas", "1", "touch", marker)
	if code != 1 || !strings.Contains(stderr, "-require") {
		t.Errorf("exit status %d, stderr %q; want 1, naming -require", code, stderr)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the command ran without a Docker engine")
	}
}

// TestServeNoEngine: serve tells pgtest (PGRYW_PG_PROVIDER=docker) why it
// started nothing, in the reply pgtest parses.
func TestServeNoEngine(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix:///nonexistent.sock")
	code, stdout, stderr, _ := runPgdocker(t, "serve", "-replicas", "2")
	if code != 0 || !strings.HasSuffix(stderr, stepAside) {
		t.Fatalf("exit status %d, stderr %q", code, stderr)
	}
	var reply pgtest.ProviderReply
	if err := json.Unmarshal([]byte(stdout), &reply); err != nil || reply.Cluster != nil ||
		!strings.HasPrefix(reply.Unavailable, "no Docker engine answered (unix:///nonexistent.sock") || strings.Count(stdout, "\n") != 1 {
		t.Fatalf("stdout %q: %+v, %v", stdout, reply, err)
	}
}

// TestSilentEngine: an endpoint that accepts connections but never answers
// is given up on after -ping-timeout.
func TestSilentEngine(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	t.Setenv("DOCKER_HOST", "tcp://"+ln.Addr().String())
	t.Setenv("DOCKER_CERT_PATH", "")
	code, _, stderr, took := runPgdocker(t, "-ping-timeout", "300ms", "true")
	if code != 0 || !strings.Contains(stderr, "no answer within 300ms") || !strings.HasSuffix(stderr, stepAside) {
		t.Fatalf("exit status %d, stderr %q", code, stderr)
	}
	if took > 2*time.Second {
		t.Errorf("took %v with -ping-timeout 300ms", took)
	}
}

// TestHooksNeedEngine: the stop and start commands fail without an engine,
// so pgtest reports the failure rather than a node that never stopped.
func TestHooksNeedEngine(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix:///nonexistent.sock")
	for _, sub := range []string{"stop", "start", "purge"} {
		args := []string{sub}
		if sub != "purge" {
			args = append(args, "pgryw-1-x-replica0")
		}
		if code, _, stderr, _ := runPgdocker(t, args...); code == 0 || !strings.Contains(stderr, "no Docker engine answered") {
			t.Errorf("%s: exit status %d, stderr %q", sub, code, stderr)
		}
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{{"stop"}, {"start", "a", "b"}, {"serve", "extra"}, {"purge", "x"}, {"-replicas", "-1"}, {"-nonesuch"}} {
		if code, _, _, _ := runPgdocker(t, args...); code != 2 {
			t.Errorf("%q: exit status %d, want 2", args, code)
		}
	}
}

func TestSplitImage(t *testing.T) {
	for _, tc := range []struct{ in, repo, tag string }{
		{"postgres:17", "postgres", "17"},
		{"postgres", "postgres", "latest"},
		{"postgres:18-alpine", "postgres", "18-alpine"},
		{"localhost:5000/postgres", "localhost:5000/postgres", "latest"},
		{"localhost:5000/library/postgres:16", "localhost:5000/library/postgres", "16"},
	} {
		if repo, tag := splitImage(tc.in); repo != tc.repo || tag != tc.tag {
			t.Errorf("splitImage(%q) = %q, %q", tc.in, repo, tag)
		}
	}
}

// TestDescription: what pgdocker hands pgtest is a valid description whose
// standbys stream under the names primary_conninfo gives them, on ports
// that are the same inside and outside the containers.
func TestDescription(t *testing.T) {
	ns := nodes("1-ab", []int{40000, 40001, 40002})
	ext := describe(ns, "/bin/pgdocker")
	b, err := json.Marshal(ext)
	if err != nil {
		t.Fatal(err)
	}
	back, err := pgtest.ParseExternal(string(b))
	if err != nil {
		t.Fatal(err)
	}
	if back.Writer.Port != 40000 || len(back.Replicas) != 2 {
		t.Fatalf("%s", b)
	}
	for i, r := range back.Replicas {
		n := ns[i+1]
		opts := n.runOptions("postgres", "17", "net", nil)
		cmd := strings.Join(opts.Cmd, " ")
		if r.Port != n.port || !strings.Contains(cmd, "-p "+itoa(n.port)+" ") ||
			!strings.Contains(cmd, "application_name="+r.ApplicationName) || !strings.Contains(cmd, "host="+ns[0].name+" port=40000 ") {
			t.Errorf("replica %d: %+v vs command %s", i, r, cmd)
		}
		if strings.Contains(cmd, "recovery_min_apply_delay") {
			t.Errorf("replica %d: the command line would override SetApplyDelay: %s", i, cmd)
		}
		if strings.Join(r.Stop, " ") != "/bin/pgdocker stop "+n.name || strings.Join(r.Start, " ") != "/bin/pgdocker start "+n.name {
			t.Errorf("replica %d hooks: %q %q", i, r.Stop, r.Start)
		}
		if b := opts.PortBindings[dcPort(n.port)]; len(b) != 1 || b[0].HostIP != "127.0.0.1" || b[0].HostPort != itoa(n.port) {
			t.Errorf("replica %d port bindings %+v", i, opts.PortBindings)
		}
	}
}

// TestScripts: the container scripts are valid shell.
func TestScripts(t *testing.T) {
	sh, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	for name, s := range map[string]string{"writer": writerScript, "replica": replicaScript} {
		if out, err := exec.Command(sh, "-n", "-c", s).CombinedOutput(); err != nil {
			t.Errorf("%s script: %v: %s", name, err, out)
		}
	}
}

func TestRepoRoot(t *testing.T) {
	dir, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "internal", "dockertest", "go.mod")); err != nil {
		t.Errorf("repoRoot() = %s: %v", dir, err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func dcPort(n int) dc.Port { return dc.Port(strconv.Itoa(n) + "/tcp") }
