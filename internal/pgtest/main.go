package pgtest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"
)

// SkipMessage is what Main prints, and Require skips with, when no
// PostgreSQL server can be found outside CI.
const SkipMessage = "pgtest: PostgreSQL server binaries not found (set PGRYW_PG_BINDIR or apt-get install postgresql; with Docker: PGRYW_PG_PROVIDER=docker); integration tests skipped"

// ShortMessage is what Main prints, and Require skips with, under go test
// -short: the unit run starts no server.
const ShortMessage = "pgtest: -short: no PostgreSQL server started; integration tests skipped"

// StartTimeout bounds Start inside Main. Local clusters take seconds; the
// margin is for the Docker provider (building pgdocker, pulling an image).
const StartTimeout = 5 * time.Minute

// Required reports whether a missing server must fail the run: on CI
// (CI=true) or when PGRYW_REQUIRE_PG=1, so that a broken CI image cannot
// turn the integration tests into silent skips.
func Required() bool {
	return os.Getenv("CI") == "true" || os.Getenv("PGRYW_REQUIRE_PG") == "1"
}

// Main starts one cluster for a whole test package, hands it to set, runs
// the tests and closes the cluster. Use it from TestMain:
//
//	var cluster *pgtest.Cluster
//
//	func TestMain(m *testing.M) {
//		os.Exit(pgtest.Main(m, pgtest.Options{}, func(c *pgtest.Cluster) { cluster = c }))
//	}
//
// When no server can be found it fails (returns 1, reason on stderr) if
// Required, and otherwise prints SkipMessage, calls set(nil) and runs the
// tests, which should call Require to skip. Any other start failure (servers
// found but broken) fails the run.
func Main(m *testing.M, opts Options, set func(*Cluster)) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	if testing.Short() {
		// go test -short is the unit run (make unit): no server is started,
		// on CI too; the integration tests skip and say why.
		fmt.Fprintln(os.Stderr, ShortMessage)
		set(nil)
		return m.Run()
	}
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	c, err := Start(ctx, opts)
	cancel()
	if err != nil {
		if errors.Is(err, ErrNoServer) && !Required() {
			fmt.Fprintln(os.Stderr, SkipMessage)
			fmt.Fprintf(os.Stderr, "pgtest: details: %v\n", err)
			set(nil)
			return m.Run()
		}
		fmt.Fprintf(os.Stderr, "pgtest: cannot start PostgreSQL cluster: %v\n", err)
		if errors.Is(err, ErrNoServer) {
			fmt.Fprintln(os.Stderr, "pgtest: failing because CI=true or PGRYW_REQUIRE_PG=1; install the server (apt-get install -y postgresql) or set PGRYW_PG_BINDIR")
		}
		return 1
	}
	defer c.Close()

	// Local servers die with us anyway (parent-death signal); closing on ^C
	// or SIGTERM also removes the temp dir, and has the Docker provider
	// remove its containers.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	defer close(done)
	defer signal.Stop(sigs)
	go func() {
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "pgtest: %v: stopping PostgreSQL cluster\n", s)
			c.Close()
			os.Exit(1)
		case <-done:
		}
	}()

	set(c)
	code := m.Run()
	for _, b := range c.Bouncers() {
		if cr := b.Crashes(); len(cr) > 0 {
			fmt.Fprintf(os.Stderr, "pgtest: pgbouncer at %s exited on its own %d times and was started again; last log line: %s\n", b.Addr(), len(cr), cr[len(cr)-1])
		}
	}
	if lines := c.BouncerTrouble(); len(lines) > 0 {
		fmt.Fprintf(os.Stderr, "pgtest: through the bouncers, %d log lines of answers that reached no client or statement names of pgryw's that met another server connection; first: %s\n", len(lines), lines[0])
		code = 1
	}
	return code
}

// Require skips the test when c is nil, i.e. when Main found no server.
func Require(tb testing.TB, c *Cluster) {
	tb.Helper()
	if c == nil {
		if testing.Short() {
			tb.Skip(ShortMessage)
		}
		tb.Skip(SkipMessage)
	}
}
