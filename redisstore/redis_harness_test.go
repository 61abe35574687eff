package redisstore

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The tests run against a real redis-server on loopback, started by
// TestMain as a child process and killed when the tests end. When
// redis-server is not on PATH and the tests run as root, TestMain installs
// it with apt-get. On CI (CI=true) or with PGRYW_REQUIRE_REDIS=1 a missing
// server fails the run; elsewhere the tests skip and say why.

// redisAddr is the test server's address; "" when none could be started
// (outside CI), and then the tests skip with skipReason.
var (
	redisAddr  string
	skipReason string
)

func requiredRedis() bool {
	return os.Getenv("CI") == "true" || os.Getenv("PGRYW_REQUIRE_REDIS") == "1"
}

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	bin, err := ensureRedisServer()
	if err != nil {
		if requiredRedis() {
			fmt.Fprintf(os.Stderr, "redisstore: %v\nredisstore: failing because CI=true or PGRYW_REQUIRE_REDIS=1; install it (apt-get install -y redis-server)\n", err)
			return 1
		}
		skipReason = fmt.Sprintf("redisstore: %v; tests skipped (apt-get install -y redis-server)", err)
		fmt.Fprintln(os.Stderr, skipReason)
		return m.Run()
	}
	srv, err := startRedis(bin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "redisstore: cannot start redis-server: %v\n", err)
		return 1
	}
	defer srv.stop()
	redisAddr = srv.addr
	return m.Run()
}

// ensureRedisServer finds redis-server on PATH, installing it with apt-get
// (after apt-get update if the first attempt fails) when missing and running
// as root.
func ensureRedisServer() (string, error) {
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	if os.Geteuid() != 0 {
		return "", errors.New("redis-server not found on PATH (not root, so not installing it)")
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return "", errors.New("redis-server not found on PATH and apt-get is not available")
	}
	install := func() error {
		cmd := exec.Command("apt-get", "install", "-y", "redis-server")
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		return cmd.Run()
	}
	fmt.Fprintln(os.Stderr, "redisstore: redis-server not found; running apt-get install -y redis-server")
	if err := install(); err != nil {
		upd := exec.Command("apt-get", "update")
		upd.Stdout, upd.Stderr = os.Stderr, os.Stderr
		if err := upd.Run(); err != nil {
			return "", fmt.Errorf("redis-server not found; apt-get update failed: %w", err)
		}
		if err := install(); err != nil {
			return "", fmt.Errorf("redis-server not found; apt-get install redis-server failed: %w", err)
		}
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", errors.New("redis-server still not on PATH after apt-get install")
	}
	return p, nil
}

type redisServer struct {
	cmd  *exec.Cmd
	dir  string
	addr string
	done chan struct{}
}

// startRedis starts bin on a free loopback port, retrying with another
// port if one is taken between choosing and binding it, and waits until
// PING answers.
func startRedis(bin string) (*redisServer, error) {
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		s, err := startRedisOnce(bin)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startRedisOnce(bin string) (*redisServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "redisstore-test-")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin,
		"--save", "", "--appendonly", "no",
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--dir", dir, "--daemonize", "no", "--logfile", "")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	setDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s := &redisServer{cmd: cmd, dir: dir, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), done: make(chan struct{})}
	go func() { cmd.Wait(); close(s.done) }()

	c := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return s, nil
		}
		select {
		case <-s.done:
			os.RemoveAll(dir)
			return nil, fmt.Errorf("redis-server exited before answering PING on %s: %v", s.addr, cmd.ProcessState)
		default:
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("redis-server on %s did not answer PING: %w", s.addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *redisServer) stop() {
	s.cmd.Process.Kill()
	<-s.done
	os.RemoveAll(s.dir)
}

// newClient returns a client for the test server, closed at the end of t,
// or skips t when there is no server.
func newClient(t *testing.T) redis.UniversalClient {
	t.Helper()
	if redisAddr == "" {
		t.Skip(skipReason)
	}
	c := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { c.Close() })
	return c
}
