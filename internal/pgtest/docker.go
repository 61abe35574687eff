package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// The Docker path is the fallback for machines without local server
// binaries. It drives the docker CLI rather than a Go Docker client: the
// dockertest module would add about 26 modules (docker/docker, runc,
// containerd, ...) to the driver's go.mod, and a build tag would not keep
// them out, since go mod tidy considers every tag.
//
// Replicas share the primary container's network namespace, so they reach
// it on 127.0.0.1 (which initdb's default pg_hba trusts for replication) and
// all ports are published by the primary container.

// dockerPing bounds the engine check: with no engine the CLI fails at once,
// with an unreachable DOCKER_HOST it would otherwise hang.
const dockerPing = 3 * time.Second

const containerPort = 5432

type dockerBackend struct {
	names []string // containers; index 0 is the writer
	nodes []Node
	logf  func(string, ...any)
}

func startDocker(ctx context.Context, opts Options, cause error) (c *Cluster, err error) {
	if os.Getenv("PGRYW_PG_DOCKER") == "0" {
		return nil, cause
	}
	if _, err := exec.LookPath("docker"); err != nil {
		return nil, cause
	}
	pctx, cancel := context.WithTimeout(ctx, dockerPing)
	out, err := exec.CommandContext(pctx, "docker", "version", "--format", "{{.Server.Version}}").CombinedOutput()
	cancel()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if i := strings.IndexByte(msg, '\n'); i >= 0 {
			msg = msg[:i]
		}
		opts.Logf("pgtest: no Docker engine: %v %s", err, msg)
		return nil, fmt.Errorf("%w; no Docker engine answered either", cause)
	}
	image := os.Getenv("PGRYW_PG_DOCKER_IMAGE")
	if image == "" {
		image = "postgres:15"
	}
	opts.Logf("pgtest: no local binaries; using Docker image %s", image)

	d := &dockerBackend{logf: opts.Logf}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	base := fmt.Sprintf("pgryw-test-%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
	args := []string{"run", "-d", "--name", base, "--label", "pgryw.pgtest=1",
		"-e", "POSTGRES_HOST_AUTH_METHOD=trust"}
	for i := 0; i <= opts.Replicas; i++ {
		args = append(args, "-p", fmt.Sprintf("127.0.0.1::%d", containerPort+i))
	}
	args = append(args, image, "postgres",
		"-c", "wal_level=replica", "-c", "max_wal_senders=10", "-c", "wal_keep_size=1GB",
		"-c", "hot_standby=on", "-c", "fsync=off", "-c", "max_connections=200",
		"-c", "shared_buffers=32MB", "-c", "track_commit_timestamp=on", "-c", "cluster_name=writer")
	d.names = append(d.names, base)
	if err := docker(ctx, args...); err != nil {
		return nil, err
	}
	if err := d.waitReady(ctx, 0); err != nil {
		return nil, err
	}
	for i := 0; i < opts.Replicas; i++ {
		name := replicaName(i)
		// Settings go into postgresql.conf on first start, not on the
		// command line, where they would override ALTER SYSTEM and so
		// defeat SetApplyDelay.
		script := fmt.Sprintf(`if [ ! -s "$PGDATA/PG_VERSION" ]; then
until pg_basebackup -h 127.0.0.1 -p %d -U postgres -D "$PGDATA" -X stream -c fast; do rm -rf "$PGDATA"/*; sleep 0.5; done
touch "$PGDATA/standby.signal"
printf "%%s\n" "primary_conninfo = 'host=127.0.0.1 port=%d user=postgres application_name=%s'" "recovery_min_apply_delay = %d" "cluster_name = '%s'" "wal_receiver_status_interval = 1s" "hot_standby_feedback = on" >> "$PGDATA/postgresql.conf"
fi
chmod 700 "$PGDATA"
exec postgres -p %d`, containerPort, containerPort, name, opts.ApplyDelay.Milliseconds(), name, containerPort+i+1)
		cname := base + "-" + name
		d.names = append(d.names, cname)
		if err := docker(ctx, "run", "-d", "--name", cname, "--label", "pgryw.pgtest=1",
			"--network", "container:"+base, "--user", "postgres", "--entrypoint", "bash",
			image, "-c", script); err != nil {
			return nil, err
		}
	}
	for i := 1; i <= opts.Replicas; i++ {
		if err := d.waitReady(ctx, i); err != nil {
			return nil, err
		}
		if err := waitStreaming(ctx, d.nodes[0], replicaName(i-1)); err != nil {
			return nil, fmt.Errorf("pgtest: %s never streamed: %w", replicaName(i-1), err)
		}
	}
	c = &Cluster{Writer: d.nodes[0], Replicas: d.nodes[1:], be: d}
	return c, nil
}

// waitReady finds node i's published port and waits until it accepts
// connections, then records its data directory.
func (d *dockerBackend) waitReady(ctx context.Context, i int) error {
	if len(d.nodes) <= i {
		out, err := exec.CommandContext(ctx, "docker", "port", d.names[0], fmt.Sprintf("%d/tcp", containerPort+i)).Output()
		if err != nil {
			return fmt.Errorf("pgtest: docker port: %w", err)
		}
		host, port, err := net.SplitHostPort(strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0]))
		if err != nil {
			return fmt.Errorf("pgtest: docker port output %q: %w", out, err)
		}
		p, _ := strconv.Atoi(port)
		d.nodes = append(d.nodes, Node{Host: host, Port: p})
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return poll(ctx, func() (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		conn, err := connect(cctx, d.nodes[i])
		if err != nil {
			return false, nil
		}
		defer conn.Close(context.Background())
		return true, conn.QueryRow(ctx, "SHOW data_directory").Scan(&d.nodes[i].DataDir)
	})
}

func (d *dockerBackend) stopNode(i int) error {
	return docker(context.Background(), "stop", "-t", "10", d.names[i])
}

func (d *dockerBackend) startNode(ctx context.Context, i int) error {
	if err := docker(ctx, "start", d.names[i]); err != nil {
		return err
	}
	return d.waitReady(ctx, i)
}

func (d *dockerBackend) close() error {
	if len(d.names) == 0 {
		return nil
	}
	// Replicas live in the writer's network namespace: remove them first.
	var errs []error
	for i := len(d.names) - 1; i >= 0; i-- {
		errs = append(errs, docker(context.Background(), "rm", "-f", "-v", d.names[i]))
	}
	return errors.Join(errs...)
}

func docker(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgtest: docker %s: %w: %s", args[0], err, strings.TrimSpace(string(out)))
	}
	return nil
}

var (
	_ backend = (*local)(nil)
	_ backend = (*dockerBackend)(nil)
)
