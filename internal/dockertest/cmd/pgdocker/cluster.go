package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ory/dockertest/v3"
	dc "github.com/ory/dockertest/v3/docker"

	"github.com/pgryw/pgryw/internal/pgtest"
)

type pool = dockertest.Pool

// labelKey marks every container and network pgdocker creates; its value
// is the run's id, so a run removes exactly its own and `pgdocker purge`
// finds what killed runs left.
const labelKey = "pgryw.pgdocker"

// errNoEngine is the reason pgdocker steps aside.
var errNoEngine = errors.New("no Docker engine answered")

// connect makes a Docker client from the environment (DOCKER_HOST, ...)
// and pings the engine, giving up after timeout.
func connect(ctx context.Context, timeout time.Duration) (*pool, error) {
	endpoint := os.Getenv("DOCKER_HOST")
	if endpoint == "" {
		endpoint = "the default socket"
	}
	p, err := dockertest.NewPool("")
	if err != nil {
		return nil, fmt.Errorf("%w (%s: %v)", errNoEngine, endpoint, err)
	}
	endpoint = p.Client.Endpoint()
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := p.Client.PingWithContext(pctx); err != nil {
		if pctx.Err() != nil && ctx.Err() == nil {
			err = fmt.Errorf("no answer within %v", timeout)
		}
		return nil, fmt.Errorf("%w (%s: %v)", errNoEngine, endpoint, err)
	}
	return p, nil
}

// Settings every node gets on its command line. The standbys need the
// primary's max_connections and max_wal_senders or more. Nothing on the
// command line may be a setting the tests change with ALTER SYSTEM
// (recovery_min_apply_delay), since the command line would win.
var commonSettings = []string{
	"listen_addresses=*",
	"max_connections=200",
	"shared_buffers=32MB",
	"fsync=off",
	"wal_level=replica",
	"max_wal_senders=10",
	"wal_keep_size=1GB",
	"hot_standby=on",
	"hot_standby_feedback=on",
	"wal_receiver_status_interval=1s",
	"wal_retrieve_retry_interval=100ms",
	"track_commit_timestamp=on",
	"hba_file=/tmp/pgdocker_hba.conf",
}

// hbaScript trusts everyone, replication included: the ports are published
// on 127.0.0.1 only, and the standbys reach the primary over the private
// network.
const hbaScript = `printf '%s\n' 'local all all trust' 'host all all all trust' 'host replication all all trust' > /tmp/pgdocker_hba.conf
`

// writerScript runs the image's own entrypoint (initdb on first start);
// "$@" are the server's arguments.
const writerScript = hbaScript + `exec docker-entrypoint.sh postgres "$@"
`

// replicaScript makes a standby by pg_basebackup from the primary on first
// start (retrying while the primary initialises) and then runs the server;
// on a restart the data directory is there already.
const replicaScript = `set -e
` + hbaScript + `if [ ! -s "$PGDATA/PG_VERSION" ]; then
  mkdir -p "$PGDATA"
  chmod 700 "$PGDATA"
  n=0
  until pg_basebackup -h "$PGRYW_PRIMARY_HOST" -p "$PGRYW_PRIMARY_PORT" -U postgres -D "$PGDATA" -X stream -c fast; do
    n=$((n + 1))
    if [ "$n" -ge 240 ]; then echo "pgdocker: pg_basebackup kept failing" >&2; exit 1; fi
    rm -rf "$PGDATA"/*
    sleep 0.5
  done
  touch "$PGDATA/standby.signal"
fi
chmod 700 "$PGDATA"
exec postgres "$@"
`

// cluster is a running primary plus standbys.
type cluster struct {
	pool  *pool
	runID string
	net   *dockertest.Network
	ext   pgtest.External
	logf  func(string, ...any)
	once  sync.Once
}

// splitImage splits "repo[:tag]"; a colon before the last slash belongs to
// a registry host.
func splitImage(image string) (repo, tag string) {
	if i := strings.LastIndexByte(image, ':'); i > strings.LastIndexByte(image, '/') {
		return image[:i], image[i+1:]
	}
	return image, "latest"
}

// node is one container to run.
type node struct {
	name   string // container name; the writer's is the standbys' host name
	app    string // cluster_name, and application_name for a standby
	port   int    // the same inside and outside: inet_server_port() matches Node.Port
	script string
	user   string
	env    []string
	args   []string
}

func (n node) runOptions(repo, tag, networkID string, labels map[string]string) *dockertest.RunOptions {
	p := strconv.Itoa(n.port)
	args := []string{"-p", p, "-c", "cluster_name=" + n.app}
	for _, s := range commonSettings {
		args = append(args, "-c", s)
	}
	return &dockertest.RunOptions{
		Name:         n.name,
		Repository:   repo,
		Tag:          tag,
		Env:          n.env,
		User:         n.user,
		Entrypoint:   []string{"bash", "-c", n.script, "pgdocker-" + n.app},
		Cmd:          append(args, n.args...),
		ExposedPorts: []string{p + "/tcp"},
		PortBindings: map[dc.Port][]dc.PortBinding{dc.Port(p + "/tcp"): {{HostIP: "127.0.0.1", HostPort: p}}},
		NetworkID:    networkID,
		Labels:       labels,
	}
}

// nodes lays out the writer and n standbys on the given ports.
func nodes(runID string, ports []int) []node {
	w := node{
		name:   "pgryw-" + runID + "-writer",
		app:    "writer",
		port:   ports[0],
		script: writerScript,
		// PGPORT: the entrypoint's temporary server and psql use it.
		env: []string{"POSTGRES_HOST_AUTH_METHOD=trust", "PGPORT=" + strconv.Itoa(ports[0])},
	}
	out := []node{w}
	for i, port := range ports[1:] {
		app := "replica" + strconv.Itoa(i)
		out = append(out, node{
			name:   "pgryw-" + runID + "-" + app,
			app:    app,
			port:   port,
			script: replicaScript,
			user:   "postgres",
			env:    []string{"PGRYW_PRIMARY_HOST=" + w.name, "PGRYW_PRIMARY_PORT=" + strconv.Itoa(w.port)},
			args:   []string{"-c", fmt.Sprintf("primary_conninfo=host=%s port=%d user=postgres application_name=%s", w.name, w.port, app)},
		})
	}
	return out
}

// describe is the description pgtest gets: ports published on 127.0.0.1,
// and this program (self) as the standbys' stop and start commands.
func describe(ns []node, self string) pgtest.External {
	ext := pgtest.External{
		Writer:   pgtest.ExternalNode{Host: "127.0.0.1", Port: ns[0].port, User: "postgres", DBName: "postgres"},
		Replicas: []pgtest.ExternalNode{},
	}
	for _, n := range ns[1:] {
		ext.Replicas = append(ext.Replicas, pgtest.ExternalNode{
			Host:            "127.0.0.1",
			Port:            n.port,
			ApplicationName: n.app,
			Stop:            []string{self, "stop", n.name},
			Start:           []string{self, "start", n.name},
		})
	}
	return ext
}

// startCluster starts the writer and cfg.replicas standbys and returns once
// pgtest sees every standby streaming. On error it removes what it started.
func startCluster(ctx context.Context, cfg config, p *pool) (c *cluster, err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var b [4]byte
	rand.Read(b[:])
	c = &cluster{pool: p, runID: fmt.Sprintf("%d-%s", os.Getpid(), hex.EncodeToString(b[:])), logf: cfg.logf}
	defer func() {
		if err != nil {
			c.purge()
		}
	}()
	repo, tag := splitImage(cfg.image)
	if _, err := p.Client.InspectImage(repo + ":" + tag); err != nil {
		cfg.logf("pulling %s:%s", repo, tag)
		t := time.Now()
		if err := p.Client.PullImage(dc.PullImageOptions{Repository: repo, Tag: tag, Context: ctx}, dc.AuthConfiguration{}); err != nil {
			return nil, fmt.Errorf("pull %s:%s: %w", repo, tag, err)
		}
		cfg.logf("pulled %s:%s in %v", repo, tag, time.Since(t).Round(time.Second))
	}
	labels := map[string]string{labelKey: c.runID}
	c.net, err = p.CreateNetwork("pgryw-"+c.runID, func(o *dc.CreateNetworkOptions) { o.Labels = labels })
	if err != nil {
		return nil, fmt.Errorf("create network: %w", err)
	}
	ports := make([]int, cfg.replicas+1)
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			return nil, err
		}
	}
	ns := nodes(c.runID, ports)
	t0 := time.Now()
	for i := range ns {
		if err := c.run(ctx, &ns[i], repo, tag, labels); err != nil {
			return nil, err
		}
	}
	c.ext = describe(ns, self)
	cfg.logf("%s: writer and %d standbys created; waiting until they stream", cfg.image, cfg.replicas)
	sctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	want := cfg.replicas
	if want == 0 {
		want = -1 // pgtest's "no replicas"; 0 means its default
	}
	pc, err := pgtest.StartExternal(sctx, c.ext, pgtest.Options{Replicas: want, Logf: cfg.logf})
	if err != nil {
		return nil, fmt.Errorf("%w%s", err, c.logs(ns))
	}
	cfg.logf("PostgreSQL %d: writer 127.0.0.1:%d and standbys %v streaming after %v",
		pc.ServerVersionNum, ports[0], pc.ReplicaAddrs(), time.Since(t0).Round(time.Millisecond))
	pc.Close()
	return c, nil
}

// run starts one container, with another port when the chosen one turns
// out to be taken.
func (c *cluster) run(ctx context.Context, n *node, repo, tag string, labels map[string]string) error {
	for attempt := 1; ; attempt++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		_, err := c.pool.RunWithOptions(n.runOptions(repo, tag, c.net.Network.ID, labels), func(hc *dc.HostConfig) {
			hc.PublishAllPorts = false // only our port, on 127.0.0.1
			hc.RestartPolicy = dc.NeverRestart()
		})
		if err == nil {
			return nil
		}
		msg := err.Error()
		if attempt == 3 || !(strings.Contains(msg, "already allocated") || strings.Contains(msg, "address already in use")) {
			return fmt.Errorf("run %s: %w", n.name, err)
		}
		// The container exists even though it did not start.
		c.pool.Client.RemoveContainer(dc.RemoveContainerOptions{ID: n.name, Force: true, RemoveVolumes: true})
		port, perr := freePort()
		if perr != nil {
			return perr
		}
		c.logf("port %d taken; %s gets %d", n.port, n.name, port)
		n.port = port
	}
}

// logs returns the end of each container's log, for an error message.
func (c *cluster) logs(ns []node) string {
	var b strings.Builder
	for _, n := range ns {
		state := "?"
		if ct, err := c.pool.Client.InspectContainer(n.name); err == nil {
			state = ct.State.String()
		}
		var out bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c.pool.Client.Logs(dc.LogsOptions{Context: ctx, Container: n.name, OutputStream: &out, ErrorStream: &out, Stdout: true, Stderr: true, Tail: "20"})
		cancel()
		fmt.Fprintf(&b, "\n--- %s (%s) ---\n%s", n.name, state, strings.TrimSpace(out.String()))
	}
	return b.String()
}

// purge removes the run's containers (with their volumes) and network.
func (c *cluster) purge() {
	c.once.Do(func() {
		n, err := purge(c.pool, labelKey+"="+c.runID)
		if err != nil {
			c.logf("removing containers: %v (`pgdocker purge` removes leftovers)", err)
			return
		}
		c.logf("removed %d containers and networks", n)
	})
}

// purge removes every container and network whose labels match filter
// ("key" or "key=value") and counts them.
func purge(p *pool, filter string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs, err := p.Client.ListContainers(dc.ListContainersOptions{All: true, Filters: map[string][]string{"label": {filter}}, Context: ctx})
	if err != nil {
		return 0, err
	}
	var errs []error
	n := 0
	for _, ct := range cs {
		if err := p.Client.RemoveContainer(dc.RemoveContainerOptions{ID: ct.ID, Force: true, RemoveVolumes: true, Context: ctx}); err != nil {
			errs = append(errs, err)
		} else {
			n++
		}
	}
	nets, err := p.Client.FilteredListNetworks(dc.NetworkFilterOpts{"label": {filter: true}})
	if err != nil {
		return n, errors.Join(append(errs, err)...)
	}
	for _, nw := range nets {
		if err := p.Client.RemoveNetwork(nw.ID); err != nil {
			errs = append(errs, err)
		} else {
			n++
		}
	}
	return n, errors.Join(errs...)
}

// stopContainer is the standbys' stop command: SIGINT is PostgreSQL's fast
// shutdown (dockertest sets SIGWINCH as the stop signal, which the server
// ignores), then SIGKILL if it is still up after 30 s.
func stopContainer(ctx context.Context, p *pool, id string) error {
	if err := p.Client.KillContainer(dc.KillContainerOptions{ID: id, Signal: dc.SIGINT, Context: ctx}); err != nil {
		var nr *dc.ContainerNotRunning
		if errors.As(err, &nr) {
			return nil
		}
		return fmt.Errorf("stop %s: %w", id, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := p.Client.WaitContainerWithContext(id, wctx); err != nil {
		if kerr := p.Client.KillContainer(dc.KillContainerOptions{ID: id, Context: ctx}); kerr != nil {
			return fmt.Errorf("stop %s: %w; kill: %v", id, err, kerr)
		}
	}
	return nil
}

// startContainer is the standbys' start command; pgtest waits for the
// server itself.
func startContainer(ctx context.Context, p *pool, id string) error {
	if err := p.Client.StartContainerWithContext(id, nil, ctx); err != nil {
		var ar *dc.ContainerAlreadyRunning
		if errors.As(err, &ar) {
			return nil
		}
		return fmt.Errorf("start %s: %w", id, err)
	}
	return nil
}

// freePort asks the kernel for a free loopback port, to be the server's
// port inside its container and the published one outside.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
