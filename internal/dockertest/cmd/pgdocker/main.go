// Command pgdocker runs pgryw's integration suite against the official
// PostgreSQL images, through a Docker engine driven by
// github.com/ory/dockertest/v3. It starts a primary and streaming standbys
// (PGRYW_DOCKER_IMAGE, default postgres:17), describes them to the tests in
// PGRYW_PG_EXTERNAL (see internal/pgtest), runs a command, and removes the
// containers afterwards, also on ^C. Where no Docker engine answers it says
// so and steps aside (exit status 0): the local-binaries path is what CI
// uses; with -require it fails instead (make test-docker).
//
// Usage, from the repository root:
//
//	go -C internal/dockertest run ./cmd/pgdocker [flags] [command [args...]]
//	go -C internal/dockertest run ./cmd/pgdocker serve [flags]
//	go -C internal/dockertest run ./cmd/pgdocker purge
//
// The default command is
//
//	go test -count=1 -run '^(TestIntegration|TestRoundTrips|TestHistory|TestTransparency)' .
//
// run in the repository root. serve starts the cluster, writes one line of
// JSON (pgtest.ProviderReply) to standard output and keeps the cluster until
// its standard input ends or it gets ^C; it is what PGRYW_PG_PROVIDER=docker
// has go test run. purge removes containers and networks that a killed
// pgdocker left behind. The stop and start subcommands are the commands the
// cluster description gives for stopping and starting a standby.
//
// It lives in its own module so that the driver's go.mod does not carry the
// Docker client's dependencies.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/pgryw/pgryw/internal/pgtest"
)

// Environment variables pgdocker reads (besides DOCKER_HOST and the other
// variables the Docker client honours).
const (
	imageEnv     = "PGRYW_DOCKER_IMAGE"
	defaultImage = "postgres:17"
)

// defaultCommand is the server suite of the Makefile (SERVER_TESTS).
var defaultCommand = []string{"go", "test", "-count=1", "-run", "^(TestIntegration|TestRoundTrips|TestHistory|TestTransparency)", "."}

// startTimeout bounds starting the cluster once the image is there.
const startTimeout = 3 * time.Minute

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

type config struct {
	image       string
	replicas    int
	pingTimeout time.Duration
	dir         string
	logf        func(format string, args ...any)
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	sub := "run"
	if len(args) > 0 {
		switch args[0] {
		case "run", "serve", "stop", "start", "purge":
			sub, args = args[0], args[1:]
		}
	}
	cfg := config{logf: func(f string, a ...any) { fmt.Fprintf(stderr, "pgdocker: "+f+"\n", a...) }}
	fs := flag.NewFlagSet("pgdocker "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: pgdocker [run] [flags] [command [args...]]\n       pgdocker serve [flags]\n       pgdocker purge\n       pgdocker stop|start CONTAINER\nflags:\n")
		fs.PrintDefaults()
	}
	image := os.Getenv(imageEnv)
	if image == "" {
		image = defaultImage
	}
	fs.StringVar(&cfg.image, "image", image, "PostgreSQL image, repository:tag; $"+imageEnv+" sets the default")
	fs.IntVar(&cfg.replicas, "replicas", 2, "number of streaming standbys")
	fs.DurationVar(&cfg.pingTimeout, "ping-timeout", 3*time.Second, "how long to wait for the Docker engine to answer")
	require := false
	fs.BoolVar(&require, "require", false, "fail (exit status 1) when no Docker engine answers, instead of stepping aside")
	fs.StringVar(&cfg.dir, "C", "", "directory to run the command in (default: the repository root above the working directory)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	rest := fs.Args()
	if cfg.replicas < 0 {
		cfg.logf("-replicas %d: want 0 or more", cfg.replicas)
		return 2
	}
	if (sub == "stop" || sub == "start") && len(rest) != 1 || (sub == "serve" || sub == "purge") && len(rest) > 0 {
		fs.Usage()
		return 2
	}

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := connect(ctx, cfg.pingTimeout)
	if err != nil {
		if sub == "stop" || sub == "start" || sub == "purge" {
			cfg.logf("%v", err)
			return 1
		}
		if require {
			cfg.logf("%v; -require: there is nothing to run the suite against", err)
			return 1
		}
		// Stepping aside: serve also tells pgtest, which goes on with
		// local binaries.
		fmt.Fprintf(stderr, "pgdocker: %v; nothing to do: the local-binaries path is what CI uses\n", err)
		if sub == "serve" {
			json.NewEncoder(stdout).Encode(pgtest.ProviderReply{Unavailable: err.Error()})
		}
		return 0
	}

	switch sub {
	case "stop":
		return status(cfg, stopContainer(ctx, pool, rest[0]))
	case "start":
		return status(cfg, startContainer(ctx, pool, rest[0]))
	case "purge":
		n, err := purge(pool, labelKey)
		cfg.logf("removed %d containers and networks labelled %s", n, labelKey)
		return status(cfg, err)
	case "serve":
		return serve(ctx, cfg, pool, stdin, stdout)
	}
	if len(rest) == 0 {
		rest = defaultCommand
	}
	return runCommand(ctx, cfg, pool, rest, stdin, stdout, stderr)
}

func status(cfg config, err error) int {
	if err != nil {
		cfg.logf("%v", err)
		return 1
	}
	return 0
}

// serve starts a cluster, describes it on stdout and keeps it until stdin
// ends or a signal comes.
func serve(ctx context.Context, cfg config, pool *pool, stdin io.Reader, stdout io.Writer) int {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		io.Copy(io.Discard, stdin)
		cancel()
	}()
	c, err := startCluster(ctx, cfg, pool)
	if err != nil {
		cfg.logf("%v", err)
		return 1
	}
	defer c.purge()
	line, err := json.Marshal(pgtest.ProviderReply{Cluster: &c.ext})
	if err != nil {
		cfg.logf("%v", err)
		return 1
	}
	w := bufio.NewWriter(stdout)
	w.Write(append(line, '\n'))
	if err := w.Flush(); err != nil {
		cfg.logf("%v", err)
		return 1
	}
	desc, _ := json.Marshal(c.ext)
	cfg.logf("serving until end of input or ^C; %s='%s'", pgtest.ExternalEnv, desc)
	<-ctx.Done()
	return 0
}

// runCommand starts a cluster, runs argv with PGRYW_PG_EXTERNAL describing
// it, and removes the cluster; it returns the command's exit status.
func runCommand(ctx context.Context, cfg config, pool *pool, argv []string, stdin io.Reader, stdout, stderr io.Writer) int {
	dir := cfg.dir
	if dir == "" {
		var err error
		if dir, err = repoRoot(); err != nil {
			cfg.logf("%v; give -C DIR", err)
			return 2
		}
	}
	c, err := startCluster(ctx, cfg, pool)
	if err != nil {
		cfg.logf("%v", err)
		return 1
	}
	defer c.purge()
	desc, err := json.Marshal(c.ext)
	if err != nil {
		cfg.logf("%v", err)
		return 1
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	// The explicit description wins anyway; clearing the provider keeps a
	// PGRYW_PG_PROVIDER=docker in the caller's environment from nesting.
	cmd.Env = append(os.Environ(), pgtest.ExternalEnv+"="+string(desc), pgtest.ProviderEnv+"=")
	// On ^C the terminal signals the command too; on SIGTERM pass on an
	// interrupt (go test forwards that to the test binary, not SIGTERM),
	// and give the command time to finish before the cluster goes.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	cfg.logf("running %q in %s", argv, dir)
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		cfg.logf("interrupted; removing the containers")
		return 130
	case errors.As(err, &exit):
		return exit.ExitCode()
	case err != nil:
		cfg.logf("%v", err)
		return 1
	}
	return 0
}

// repoRoot walks up from the working directory to pgryw's go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				if strings.TrimSpace(l) == "module github.com/pgryw/pgryw" {
					return dir, nil
				}
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the pgryw repository")
		}
		dir = parent
	}
}
