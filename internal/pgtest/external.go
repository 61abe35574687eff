package pgtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// ExternalEnv names the environment variable that points Start at servers
// someone else runs: a primary with streaming standbys, described by
// External as JSON, either inline (a value starting with "{") or in the
// file the value names. It wins over local binaries (and over
// PGRYW_PG_BINDIR), but not over an explicit Options.BinDir. The
// internal/dockertest module's pgdocker program sets it for the official
// PostgreSQL images.
const ExternalEnv = "PGRYW_PG_EXTERNAL"

// ErrStopUnsupported is what StopNode and StartNode return on an external
// cluster whose description gives no stop and start commands.
var ErrStopUnsupported = errors.New("external cluster: stopping nodes is not supported (the description gives no stop/start commands)")

// externalWait bounds how long Start waits for servers described in
// ExternalEnv: they are meant to be running already.
const externalWait = 60 * time.Second

// External describes an already running cluster, as ExternalEnv holds it.
// Example:
//
//	{"writer": {"host": "127.0.0.1", "port": 5432, "user": "postgres"},
//	 "replicas": [{"port": 5433, "stop": ["docker", "stop", "r0"], "start": ["docker", "start", "r0"]},
//	              {"port": 5434}]}
//
// The user must be a superuser, or at least be allowed ALTER SYSTEM,
// pg_reload_conf, pg_wal_replay_pause/resume and pg_promote, for the
// Cluster methods that change servers; Start itself only needs them when it
// has to reset a replica (see StartExternal).
type External struct {
	// Writer is the primary.
	Writer ExternalNode `json:"writer"`
	// Replicas are streaming standbys of Writer, in index order.
	Replicas []ExternalNode `json:"replicas"`
}

// ExternalNode is one server of an External cluster.
type ExternalNode struct {
	// Host defaults to 127.0.0.1.
	Host string `json:"host,omitempty"`
	// Port is required.
	Port int `json:"port"`
	// User defaults to postgres on the writer, and to the writer's user on
	// a replica; likewise Password (default none) and DBName (default
	// postgres).
	User     string `json:"user,omitempty"`
	Password string `json:"password,omitempty"`
	DBName   string `json:"dbname,omitempty"`
	// ApplicationName is the name a replica streams under, as the writer's
	// pg_stat_replication shows it (application_name in its
	// primary_conninfo). It defaults to replica0, replica1, ..., what the
	// local and Docker clusters use.
	ApplicationName string `json:"application_name,omitempty"`
	// Stop and Start are commands (argv, no shell) that stop a replica
	// (fast shutdown; it must refuse connections afterwards) and start it
	// again on the same host and port, for StopNode and StartNode. Give
	// both or neither; without them StopNode returns ErrStopUnsupported.
	// Start need not wait for the server: StartNode waits until it accepts
	// connections and streams.
	Stop  []string `json:"stop,omitempty"`
	Start []string `json:"start,omitempty"`
}

// ParseExternal reads an External description: JSON when s starts with
// "{", else the name of a file holding it. Unknown fields are an error, so
// a misspelt key does not go unnoticed.
func ParseExternal(s string) (External, error) {
	var ext External
	b := []byte(strings.TrimSpace(s))
	if len(b) == 0 || b[0] != '{' {
		var err error
		if b, err = os.ReadFile(s); err != nil {
			return ext, fmt.Errorf("pgtest: %s: %w", ExternalEnv, err)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ext); err != nil {
		return ext, fmt.Errorf("pgtest: %s: bad cluster description: %w", ExternalEnv, err)
	}
	if err := ext.validate(); err != nil {
		return ext, fmt.Errorf("pgtest: %s: %w", ExternalEnv, err)
	}
	return ext, nil
}

func (e External) validate() error {
	if e.Writer.Port <= 0 || e.Writer.Port > 65535 {
		return fmt.Errorf("writer: port %d out of range", e.Writer.Port)
	}
	if len(e.Writer.Stop) > 0 || len(e.Writer.Start) > 0 || e.Writer.ApplicationName != "" {
		return errors.New("writer: stop, start and application_name are for replicas")
	}
	for i, r := range e.Replicas {
		if r.Port <= 0 || r.Port > 65535 {
			return fmt.Errorf("replica %d: port %d out of range", i, r.Port)
		}
		if (len(r.Stop) == 0) != (len(r.Start) == 0) {
			return fmt.Errorf("replica %d: give both stop and start commands, or neither", i)
		}
	}
	return nil
}

// External describes c as an External cluster, for instance to hand a
// cluster started here to another process through ExternalEnv. Stop and
// start commands are not included: the servers of a local cluster belong
// to this process.
func (c *Cluster) External() External {
	conv := func(n Node) ExternalNode {
		return ExternalNode{Host: n.Host, Port: n.Port, User: n.User, Password: n.Password, DBName: n.Database}
	}
	e := External{Writer: conv(c.Writer), Replicas: []ExternalNode{}}
	for i, r := range c.Replicas {
		n := conv(r)
		n.ApplicationName = c.appName(i)
		e.Replicas = append(e.Replicas, n)
	}
	return e
}

// StartExternal returns a Cluster over the servers ext describes, using the
// first opts.Replicas replicas (opts.BinDir is ignored). It waits, until ctx
// ends, for every server to accept connections, checks that the writer is a
// primary and each replica a standby, and puts each replica into the state
// a fresh cluster has: replay resumed if a previous run left it paused, and
// recovery_min_apply_delay set to opts.ApplyDelay (with ALTER SYSTEM) where
// it differs; then it waits until each replica streams. Close stops nothing.
func StartExternal(ctx context.Context, ext External, opts Options) (*Cluster, error) {
	if err := ext.validate(); err != nil {
		return nil, fmt.Errorf("pgtest: external cluster: %w", err)
	}
	opts = opts.withDefaults()
	return finish(ctx, opts.EmulateWaitFor, func() (*Cluster, error) { return startExternal(ctx, ext, opts, "external", nil) })
}

// external is the backend for servers pgtest did not start.
type external struct {
	nodes   []Node
	stop    [][]string // per node; nil for the writer and when unsupported
	start   [][]string
	closeFn func() error // nil: nothing to release
}

func startExternal(ctx context.Context, ext External, opts Options, provider string, closeFn func() error) (c *Cluster, err error) {
	if opts.Replicas > len(ext.Replicas) {
		return nil, fmt.Errorf("pgtest: the external cluster has %d replicas; %d wanted", len(ext.Replicas), opts.Replicas)
	}
	w := nodeOf(ext.Writer, ExternalNode{})
	e := &external{nodes: []Node{w}, stop: [][]string{nil}, start: [][]string{nil}, closeFn: closeFn}
	c = &Cluster{Writer: w, Provider: provider, be: e}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	for i, r := range ext.Replicas[:opts.Replicas] {
		n := nodeOf(r, ext.Writer)
		e.nodes = append(e.nodes, n)
		e.stop = append(e.stop, r.Stop)
		e.start = append(e.start, r.Start)
		c.Replicas = append(c.Replicas, n)
		app := r.ApplicationName
		if app == "" {
			app = replicaName(i)
		}
		c.appNames = append(c.appNames, app)
	}
	// resetReplica uses the Cluster's methods, which want these.
	c.stopped = make([]bool, len(c.Replicas))
	c.promoted = make([]bool, len(c.Replicas))
	t0 := time.Now()
	if err := waitAccepting(ctx, &c.Writer); err != nil {
		return nil, fmt.Errorf("pgtest: external writer: %w", err)
	}
	if err := checkRecovery(ctx, c.Writer, false); err != nil {
		return nil, fmt.Errorf("pgtest: external writer %s: %w", c.Writer.Addr(), err)
	}
	want := opts.ApplyDelay.Milliseconds()
	for i := range c.Replicas {
		if err := waitAccepting(ctx, &c.Replicas[i]); err != nil {
			return nil, fmt.Errorf("pgtest: external replica %d: %w", i, err)
		}
		if err := c.resetReplica(ctx, i, want); err != nil {
			return nil, fmt.Errorf("pgtest: external replica %d (%s): %w", i, c.Replicas[i].Addr(), err)
		}
		if err := waitStreaming(ctx, c.Writer, c.appNames[i]); err != nil {
			return nil, fmt.Errorf("pgtest: external replica %d: no standby named %q streams from the writer (application_name in its primary_conninfo; see ExternalNode.ApplicationName): %w", i, c.appNames[i], err)
		}
	}
	e.nodes = append([]Node{c.Writer}, c.Replicas...)
	opts.Logf("pgtest: %s cluster: writer %s and replicas %v ready in %v", provider, c.Writer.Addr(), c.ReplicaAddrs(), time.Since(t0).Round(time.Millisecond))
	return c, nil
}

// nodeOf turns a description into a Node; a replica (def = the writer's
// description) inherits the writer's credentials.
func nodeOf(n, def ExternalNode) Node {
	or := func(v, d, dd string) string {
		if v != "" {
			return v
		}
		if d != "" {
			return d
		}
		return dd
	}
	return Node{
		Host:     or(n.Host, "", "127.0.0.1"),
		Port:     n.Port,
		User:     or(n.User, def.User, ""),
		Password: or(n.Password, def.Password, ""),
		Database: or(n.DBName, def.DBName, ""),
	}
}

// waitAccepting polls until n accepts connections or ctx ends, and then
// fills in its data directory where the server tells (superusers and
// pg_read_all_settings only).
func waitAccepting(ctx context.Context, n *Node) error {
	var last error
	err := poll(ctx, func() (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		conn, err := connect(cctx, *n)
		if err != nil {
			last = err
			return false, nil
		}
		defer conn.Close(context.Background())
		var dir string
		if conn.QueryRow(ctx, "SELECT setting FROM pg_settings WHERE name = 'data_directory'").Scan(&dir) == nil {
			n.DataDir = dir
		}
		return true, nil
	})
	if err != nil && last != nil {
		return fmt.Errorf("%w (last attempt: %v)", err, last)
	}
	return err
}

func checkRecovery(ctx context.Context, n Node, want bool) error {
	return withConn(ctx, n, func(conn *pgx.Conn) error {
		var inRec bool
		if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRec); err != nil {
			return err
		}
		switch {
		case inRec && !want:
			return errors.New("is in recovery; want a primary")
		case !inRec && want:
			return errors.New("is not in recovery (promoted by an earlier run?); want a streaming standby")
		}
		return nil
	})
}

// resetReplica checks replica i is a standby, resumes a paused replay and
// sets the apply delay, touching nothing that is already as wanted.
func (c *Cluster) resetReplica(ctx context.Context, i int, delayMs int64) error {
	if err := checkRecovery(ctx, c.Replicas[i], true); err != nil {
		return err
	}
	var pause, delay string
	err := withConn(ctx, c.Replicas[i], func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, "SELECT pg_get_wal_replay_pause_state(), (SELECT setting FROM pg_settings WHERE name = 'recovery_min_apply_delay')").Scan(&pause, &delay)
	})
	if err != nil {
		return err
	}
	if pause != "not paused" {
		if err := c.replayControl(ctx, i, "pg_wal_replay_resume()", "not paused"); err != nil {
			return err
		}
	}
	if delay != fmt.Sprint(delayMs) {
		return c.setApplyDelay(ctx, i, delayMs)
	}
	return nil
}

func (e *external) stopNode(i int) error {
	if e.stop[i] == nil {
		return ErrStopUnsupported
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := runHook(ctx, "stop", e.stop[i]); err != nil {
		return err
	}
	// The command may return before the server is down: wait until it
	// refuses connections, as after a local StopNode.
	return poll(ctx, func() (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		conn, err := connect(cctx, e.nodes[i])
		if err != nil {
			return true, nil
		}
		conn.Close(context.Background())
		return false, nil
	})
}

func (e *external) startNode(ctx context.Context, i int) error {
	if e.start[i] == nil {
		return ErrStopUnsupported
	}
	if err := runHook(ctx, "start", e.start[i]); err != nil {
		return err
	}
	return waitAccepting(ctx, &e.nodes[i])
}

func (e *external) close() error {
	if e.closeFn == nil {
		return nil
	}
	return e.closeFn()
}

func runHook(ctx context.Context, what string, argv []string) error {
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("external cluster: %s command %q: %w: %s", what, argv, err, bytes.TrimSpace(out))
	}
	return nil
}

var (
	_ backend = (*local)(nil)
	_ backend = (*external)(nil)
)
