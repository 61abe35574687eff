package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// A PgBouncer in front of a server, as many deployments run one in front
// of every node: Debian's pgbouncer package (apt-get install -y pgbouncer),
// started as a child process on loopback, like the servers. Nothing is
// downloaded or built.

// ErrNoBouncer reports that no pgbouncer binary was found.
var ErrNoBouncer = errors.New("pgtest: pgbouncer not found (apt-get install -y pgbouncer)")

// BouncerEnv names the environment variable that, set to "transaction" or
// "session", has Start put a PgBouncer in that pool mode in front of every
// node (Options.Bouncer); BouncerFreshEnv set to "1" has those bouncers use
// every server connection for one client only (BouncerOptions.FreshServers).
const (
	BouncerEnv      = "PGRYW_PGBOUNCER"
	BouncerFreshEnv = "PGRYW_PGBOUNCER_FRESH"
)

// BouncerOptions configures StartBouncer.
type BouncerOptions struct {
	// Target is the server's "host:port".
	Target string
	// Mode is PgBouncer's pool_mode: "transaction" (the default) or
	// "session".
	Mode string
	// PoolSize is default_pool_size, the server connections per database
	// and user (0: 4).
	PoolSize int
	// FreshServers has every server connection used by one client only,
	// then closed (server_lifetime = 0): nothing a client left in a
	// session (a custom setting's placeholder survives DISCARD ALL) reaches
	// the next. For comparing two drivers through bouncers, whose answers
	// must not depend on which server connection each got.
	FreshServers bool
	// Users are the roles clients log in as (auth_type trust still wants
	// them listed); postgres is always there.
	Users []string
}

// Bouncer is a running pgbouncer.
type Bouncer struct {
	opts BouncerOptions
	dir  string
	port int
	as   runAs
	bin  string

	mu      sync.Mutex
	target  string
	cmd     *exec.Cmd
	exited  chan struct{}
	closing bool
	crashes []string
}

// Crashes returns the last log line of each time pgbouncer exited on its
// own and was started again. PgBouncer 1.18 (Debian 12's) exits with
// "FATAL … disconnect_client(): bad client state: 0" when a cancel
// request's client disconnects before the cancel went out
// (pgbouncer/pgbouncer#801, fixed in a later release); a supervisor
// would restart it, and so does the harness, on the same port.
func (b *Bouncer) Crashes() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.crashes...)
}

// supervise waits for pgbouncer to exit and, unless Close stopped it,
// starts it again.
func (b *Bouncer) supervise(cmd *exec.Cmd, exited chan struct{}) {
	<-exited
	b.mu.Lock()
	if b.closing || b.cmd != cmd {
		b.mu.Unlock()
		return
	}
	b.cmd = nil
	lines := strings.Split(strings.TrimSpace(b.Log()), "\n")
	b.crashes = append(b.crashes, lines[len(lines)-1])
	b.mu.Unlock()
	for try := 0; try < 20; try++ {
		if b.start(context.Background()) == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// findBouncer returns the pgbouncer binary's path.
func findBouncer() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer", "/usr/local/bin/pgbouncer"} {
		if fileExists(p) {
			return p, nil
		}
	}
	return "", ErrNoBouncer
}

// StartBouncer starts a pgbouncer in front of opts.Target and returns once
// it accepts connections and serves a query through it.
func StartBouncer(ctx context.Context, opts BouncerOptions) (*Bouncer, error) {
	bin, err := findBouncer()
	if err != nil {
		return nil, err
	}
	switch opts.Mode {
	case "":
		opts.Mode = "transaction"
	case "transaction", "session":
	default:
		return nil, fmt.Errorf("pgtest: pgbouncer pool mode %q: want transaction or session", opts.Mode)
	}
	if opts.PoolSize <= 0 {
		opts.PoolSize = 4
	}
	as, err := serverUser()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(baseTempDir(as), "pgtest-bouncer-")
	if err != nil {
		return nil, err
	}
	if as.cred != nil {
		os.Chown(dir, as.uid, as.gid)
	}
	b := &Bouncer{opts: opts, dir: dir, as: as, bin: bin, target: opts.Target}
	for try := 0; ; try++ {
		if b.port, err = freePort(); err == nil {
			if err = b.start(ctx); err == nil {
				return b, nil
			}
		}
		if try == 3 || ctx.Err() != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
}

// Addr returns the bouncer's "127.0.0.1:PORT".
func (b *Bouncer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

// Target returns the server the bouncer now leads to.
func (b *Bouncer) Target() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.target
}

// Mode returns the bouncer's pool mode.
func (b *Bouncer) Mode() string { return b.opts.Mode }

// Repoint makes the bouncer lead to another server, as an operator's
// RELOAD does: new server connections go there; no client connection
// breaks (a client holding a server connection, in session mode, keeps it
// until it disconnects).
func (b *Bouncer) Repoint(target string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.target = target
	if err := b.writeConfig(); err != nil {
		return err
	}
	if b.cmd == nil {
		return errors.New("pgtest: pgbouncer is not running")
	}
	return b.cmd.Process.Signal(syscall.SIGHUP)
}

// Log returns pgbouncer's log so far.
func (b *Bouncer) Log() string {
	out, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
	return string(out)
}

// Close stops the bouncer and removes its files.
func (b *Bouncer) Close() error {
	b.mu.Lock()
	cmd, exited := b.cmd, b.exited
	b.cmd, b.closing = nil, true
	b.mu.Unlock()
	if cmd != nil {
		cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	}
	return os.RemoveAll(b.dir)
}

// writeConfig writes pgbouncer.ini and its user list for the current
// target. Call it with b.mu held.
func (b *Bouncer) writeConfig() error {
	host, port, err := net.SplitHostPort(b.target)
	if err != nil {
		return fmt.Errorf("pgtest: pgbouncer target %q: %w", b.target, err)
	}
	users := []string{`"postgres" ""`}
	for _, u := range b.opts.Users {
		if u != "postgres" {
			users = append(users, strconv.Quote(u)+` ""`)
		}
	}
	lines := []string{
		"[databases]",
		fmt.Sprintf("* = host=%s port=%s", host, port),
		"[pgbouncer]",
		"listen_addr = 127.0.0.1",
		fmt.Sprintf("listen_port = %d", b.port),
		"unix_socket_dir =",
		"auth_type = trust",
		"auth_file = " + filepath.Join(b.dir, "users.txt"),
		"admin_users = postgres",
		"pool_mode = " + b.opts.Mode,
		fmt.Sprintf("default_pool_size = %d", b.opts.PoolSize),
		"max_client_conn = 2000",
		"max_db_connections = 0",
		// Parameters drivers send at startup that PgBouncer would refuse.
		"ignore_startup_parameters = extra_float_digits,statement_timeout,search_path,options,idle_in_transaction_session_timeout,lock_timeout,default_transaction_isolation",
		"server_login_retry = 1",
		fmt.Sprintf("server_lifetime = %d", map[bool]int{false: 3600, true: 0}[b.opts.FreshServers]),
		"logfile = " + filepath.Join(b.dir, "pgbouncer.log"),
		"pidfile = " + filepath.Join(b.dir, "pgbouncer.pid"),
		"log_connections = 0",
		"log_disconnections = 0",
		"",
	}
	for name, text := range map[string]string{
		"pgbouncer.ini": strings.Join(lines, "\n"),
		"users.txt":     strings.Join(users, "\n") + "\n",
	} {
		p := filepath.Join(b.dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			return err
		}
		if b.as.cred != nil {
			os.Chown(p, b.as.uid, b.as.gid)
		}
	}
	return nil
}

// start writes the configuration, starts pgbouncer and waits until a query
// gets through it.
func (b *Bouncer) start(ctx context.Context) error {
	b.mu.Lock()
	err := b.writeConfig()
	b.mu.Unlock()
	if err != nil {
		return err
	}
	cmd := exec.Command(b.bin, filepath.Join(b.dir, "pgbouncer.ini"))
	cmd.Dir = b.dir
	cmd.Env = []string{"LC_ALL=C"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: b.as.cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	logf, err := os.OpenFile(filepath.Join(b.dir, "stderr.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	err = startLocked(cmd)
	logf.Close()
	if err != nil {
		return fmt.Errorf("pgtest: start pgbouncer: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	b.mu.Lock()
	if b.closing {
		b.mu.Unlock()
		cmd.Process.Kill()
		return errors.New("pgtest: pgbouncer closed while starting")
	}
	b.cmd, b.exited = cmd, exited
	b.mu.Unlock()
	deadline := time.Now().Add(20 * time.Second)
	node := Node{Host: "127.0.0.1", Port: b.port}
	for {
		select {
		case <-exited:
			b.mu.Lock()
			b.cmd = nil
			b.mu.Unlock()
			return fmt.Errorf("pgtest: pgbouncer exited during startup: %s%s%s", cmd.ProcessState,
				logTail(filepath.Join(b.dir, "stderr.log")), logTail(filepath.Join(b.dir, "pgbouncer.log")))
		case <-ctx.Done():
			b.stopStarting(cmd, exited)
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		err := probeBouncer(ctx, node)
		if err == nil {
			go b.supervise(cmd, exited)
			return nil
		}
		if time.Now().After(deadline) {
			b.stopStarting(cmd, exited)
			return fmt.Errorf("pgtest: pgbouncer not serving after 20s: %w%s", err, logTail(filepath.Join(b.dir, "pgbouncer.log")))
		}
	}
}

// stopStarting kills a pgbouncer that did not come up, leaving the
// bouncer's files for another try.
func (b *Bouncer) stopStarting(cmd *exec.Cmd, exited chan struct{}) {
	b.mu.Lock()
	if b.cmd == cmd {
		b.cmd = nil
	}
	b.mu.Unlock()
	cmd.Process.Kill()
	<-exited
}

// probeBouncer runs one query through a bouncer, in the simple protocol:
// a prepared statement would stay behind on a server connection another
// client gets next.
func probeBouncer(ctx context.Context, n Node) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(n.DSN())
	if err != nil {
		return err
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "SELECT 1")
	return err
}

// ServerLogs returns what each local server has logged so far, writer
// first, then the replicas in index order; nil for servers not started by
// this process.
func (c *Cluster) ServerLogs() []string {
	l, ok := c.be.(*local)
	if !ok {
		return nil
	}
	out := make([]string, len(l.procs))
	for i, p := range l.procs {
		b, _ := os.ReadFile(p.logPath)
		out[i] = string(b)
	}
	return out
}

// bouncerPoolSize is the server connections per node each bouncer of a
// cluster keeps (Options.Bouncer): enough for the integration suite's
// sessions that hold connections at once.
const bouncerPoolSize = 40

// startBouncers starts a bouncer in pool mode in front of the writer and
// each replica (or its WAIT FOR emulation).
func (c *Cluster) startBouncers(ctx context.Context, mode string) error {
	targets := append([]string{c.Writer.Addr()}, c.ReplicaAddrs()...)
	for _, t := range targets {
		b, err := StartBouncer(ctx, BouncerOptions{Target: t, Mode: mode, PoolSize: bouncerPoolSize,
			FreshServers: os.Getenv(BouncerFreshEnv) == "1"})
		if err != nil {
			return err
		}
		c.bouncers = append(c.bouncers, b)
	}
	return nil
}

// BouncerTrouble returns the log lines, of the cluster's bouncers and
// servers, that say an answer (its ReadyForQuery) reached a server
// connection no client was linked to (it would go to the next client) or that one of pgryw's
// statement names met a server connection other than its own: what a
// client must never cause behind a pooler. Empty without bouncers.
func (c *Cluster) BouncerTrouble() []string {
	if len(c.bouncers) == 0 {
		return nil
	}
	logs := c.ServerLogs()
	for _, b := range c.bouncers {
		logs = append(logs, b.Log())
	}
	var out []string
	for _, l := range logs {
		for _, line := range strings.Split(l, "\n") {
			// Every answer ends with a ReadyForQuery ('Z'); a server shut
			// down or terminated sends its FATAL ('E') unasked, also to
			// connections no client is linked to.
			if strings.Contains(line, "got packet 'Z' from server when not linked") || strings.Contains(line, `prepared statement "pgryw_`) {
				out = append(out, line)
			}
		}
	}
	return out
}
