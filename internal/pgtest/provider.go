package pgtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"time"
)

// ProviderEnv names the environment variable that picks where Start gets
// servers when ExternalEnv is unset and Options.BinDir is not given:
// "docker" runs the internal/dockertest module's pgdocker program (`go run
// ./cmd/pgdocker serve`, so a Go toolchain and that module's dependencies
// are needed), which starts the official postgres image and hands the
// containers back as an external cluster; where no Docker engine answers
// it steps aside and Start uses local binaries. "" or "local": local
// binaries only.
const ProviderEnv = "PGRYW_PG_PROVIDER"

// ProviderReply is the one line of JSON that `pgdocker serve` writes to its
// standard output: the cluster it started, or why it stepped aside. The
// provider keeps the cluster until its standard input reaches end of file,
// then removes it and exits.
type ProviderReply struct {
	// Cluster describes the started servers, with stop and start commands.
	Cluster *External `json:"cluster,omitempty"`
	// Unavailable says why the provider started nothing (no Docker engine
	// answered); Start then uses local binaries.
	Unavailable string `json:"unavailable,omitempty"`
}

// errStepAside wraps the provider's reason for starting nothing.
var errStepAside = errors.New("the Docker provider stepped aside")

// providerClose bounds the wait for the provider to remove its containers.
const providerClose = 2 * time.Minute

// providerCommand builds the provider's command line; tests replace it.
var providerCommand = func(replicas int) (*exec.Cmd, error) {
	dir, err := dockertestDir()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("go", "run", "./cmd/pgdocker", "serve", "-replicas", strconv.Itoa(replicas))
	cmd.Dir = dir
	return cmd, nil
}

// dockertestDir finds the internal/dockertest module next to this package's
// source.
func dockertestDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if ok {
		dir := filepath.Join(filepath.Dir(file), "..", "dockertest")
		if fileExists(filepath.Join(dir, "go.mod")) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("pgtest: %s=docker: cannot find the internal/dockertest module next to %s (built with -trimpath?); run `go -C internal/dockertest run ./cmd/pgdocker` from the repository root instead", ProviderEnv, file)
}

// firstLine captures the first line written to it and discards the rest.
type firstLine struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	done bool
	ch   chan []byte
}

func (w *firstLine) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return len(p), nil
	}
	w.buf.Write(p)
	if i := bytes.IndexByte(w.buf.Bytes(), '\n'); i >= 0 {
		w.done = true
		w.ch <- bytes.Clone(w.buf.Bytes()[:i])
	}
	return len(p), nil
}

func startProvider(ctx context.Context, opts Options) (*Cluster, error) {
	cmd, err := providerCommand(opts.Replicas)
	if err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out := &firstLine{ch: make(chan []byte, 1)}
	cmd.Stdout = out
	cmd.Stderr = os.Stderr
	opts.Logf("pgtest: %s=docker: running %v in %s", ProviderEnv, cmd.Args, cmd.Dir)
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("pgtest: %s=docker: %w", ProviderEnv, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var once sync.Once
	var closeErr error
	// End of input tells the provider to remove its containers and exit.
	closeFn := func() error {
		once.Do(func() {
			stdin.Close()
			select {
			case err := <-exited:
				if err != nil {
					closeErr = fmt.Errorf("pgtest: docker provider: %w", err)
				}
			case <-time.After(providerClose):
				cmd.Process.Kill()
				closeErr = fmt.Errorf("pgtest: docker provider still running %v after its input closed; killed it (`go -C internal/dockertest run ./cmd/pgdocker purge` removes leftover containers)", providerClose)
			}
		})
		return closeErr
	}

	var line []byte
	select {
	case line = <-out.ch:
	case err := <-exited:
		exited <- err // for closeFn
		closeFn()
		if err == nil {
			err = errors.New("exited without describing a cluster")
		}
		return nil, fmt.Errorf("pgtest: docker provider: %w", err)
	case <-ctx.Done():
		closeFn()
		return nil, fmt.Errorf("pgtest: docker provider: %w", ctx.Err())
	}
	var reply ProviderReply
	if err := json.Unmarshal(line, &reply); err != nil || (reply.Cluster == nil && reply.Unavailable == "") {
		closeFn()
		return nil, fmt.Errorf("pgtest: docker provider: unexpected reply %q: %v", line, err)
	}
	if reply.Cluster == nil {
		if err := closeFn(); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %s", errStepAside, reply.Unavailable)
	}
	opts.Logf("pgtest: docker provider answered in %v", time.Since(t0).Round(time.Millisecond))
	if err := reply.Cluster.validate(); err != nil {
		closeFn()
		return nil, fmt.Errorf("pgtest: docker provider: %w", err)
	}
	return startExternal(ctx, *reply.Cluster, opts, "docker", closeFn)
}
