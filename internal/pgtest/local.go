package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// dirPrefix names our temp dirs so that a later run can find and remove the
// ones a killed run left behind.
const dirPrefix = "pgryw-test-"

// maxSocketPath is sizeof(sockaddr_un.sun_path) minus the NUL on Linux.
const maxSocketPath = 107

// forceCopy makes replicas by copying the initdb'ed data dir even when
// pg_basebackup exists, so tests can cover the route that bin dirs without
// pg_basebackup (the npm PostgreSQL 18 build) depend on.
var forceCopy bool

// findBinDir resolves the bin dir as documented on Options.BinDir. The
// boolean tells whether the dir was chosen explicitly.
func findBinDir(opt string) (string, bool, error) {
	explicit := opt
	if explicit == "" {
		explicit = os.Getenv("PGRYW_PG_BINDIR")
	}
	if explicit != "" {
		if err := checkBinDir(explicit); err != nil {
			return "", true, fmt.Errorf("pgtest: bin dir %s: %w", explicit, err)
		}
		return explicit, true, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Newest first: compare major versions as numbers ("9.6" < "15").
	sort.Slice(dirs, func(a, b int) bool {
		va, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(dirs[a])), 64)
		vb, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(dirs[b])), 64)
		return va > vb
	})
	for _, d := range dirs {
		if checkBinDir(d) == nil {
			return d, false, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		// Debian's /usr/bin entries are pg_wrapper links that pick a version
		// by their own rules; following the link finds the real bin dir and
		// its pg_basebackup.
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		if d := filepath.Dir(p); checkBinDir(d) == nil {
			return d, false, nil
		}
	}
	return "", false, fmt.Errorf("%w (looked at $PGRYW_PG_BINDIR, /usr/lib/postgresql/*/bin and initdb on PATH)", ErrNoServer)
}

func checkBinDir(d string) error {
	for _, b := range []string{"initdb", "postgres"} {
		st, err := os.Stat(filepath.Join(d, b))
		if err != nil {
			return err
		}
		if st.IsDir() || st.Mode()&0o111 == 0 {
			return fmt.Errorf("%s is not executable", filepath.Join(d, b))
		}
	}
	return nil
}

// runAs says which user the servers run as. PostgreSQL refuses to run as
// root, so as root we switch to the postgres user in the child itself
// (SysProcAttr.Credential) rather than through runuser: with runuser in
// between, the parent-death signal would reach runuser, not the server.
type runAs struct {
	cred     *syscall.Credential // nil: run as ourselves
	uid, gid int                 // -1 when cred is nil
}

func serverUser() (runAs, error) {
	if os.Geteuid() != 0 {
		return runAs{uid: -1, gid: -1}, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return runAs{}, fmt.Errorf("pgtest: running as root, but PostgreSQL refuses to run as root and there is no 'postgres' user to run it as (apt-get install postgresql creates one; or run the tests as a non-root user): %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return runAs{
		cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}},
		uid:  uid, gid: gid,
	}, nil
}

// baseTempDir picks os.TempDir() unless, as root, the postgres user could
// not traverse it (e.g. TMPDIR under /root); then /tmp.
func baseTempDir(as runAs) string {
	d := os.TempDir()
	if as.cred == nil {
		return d
	}
	for p := d; ; p = filepath.Dir(p) {
		st, err := os.Stat(p)
		if err != nil || st.Mode().Perm()&0o001 == 0 {
			return "/tmp"
		}
		if p == filepath.Dir(p) {
			return d
		}
	}
}

// removeStale deletes temp dirs of earlier runs whose process is gone. Their
// servers died with that process (parent-death signal); only files remain.
func removeStale(base string) {
	ents, _ := os.ReadDir(base)
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), dirPrefix) {
			continue
		}
		dir := filepath.Join(base, e.Name())
		b, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
		if err != nil {
			continue // being set up right now, or not ours
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(dir)
		}
	}
}

// proc is one local server.
type proc struct {
	name    string // cluster_name and application_name
	node    Node
	dir     string // node dir: socket, log, data dir
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{} // closed once cmd.Wait returned
}

type local struct {
	bin   string
	as    runAs
	root  string
	procs []*proc
	logf  func(string, ...any)
}

func startLocal(ctx context.Context, opts Options) (c *Cluster, err error) {
	bin, _, err := findBinDir(opts.BinDir)
	if err != nil {
		return nil, err
	}
	as, err := serverUser()
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	base := baseTempDir(as)
	removeStale(base)
	root, err := os.MkdirTemp(base, dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	l := &local{bin: bin, as: as, root: root, logf: opts.Logf}
	defer func() {
		if err != nil {
			l.close()
		}
	}()
	// MkdirTemp makes 0700 dirs; postgres only needs to traverse the root
	// (it owns everything below), so 0711 is enough as root.
	if err := os.WriteFile(filepath.Join(root, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, err
	}
	if err := os.Chmod(root, 0o711); err != nil {
		return nil, err
	}
	// Running the server binary once turns the obscure failures into one
	// clear message: a bin dir the postgres user cannot reach (e.g. under
	// /root), or missing bundled libraries (the npm package's lib symlinks
	// come from its postinstall script).
	ver, err := l.run(ctx, "postgres", "--version")
	if err != nil {
		who := "we"
		if as.cred != nil {
			who = "the postgres user"
		}
		return nil, fmt.Errorf("pgtest: %s cannot run %s: %w: %s", who, filepath.Join(bin, "postgres"), err, bytes.TrimSpace(ver))
	}
	opts.Logf("pgtest: %s from %s, files in %s", bytes.TrimSpace(ver), bin, root)

	w := &proc{name: "writer", dir: filepath.Join(root, "w")}
	l.procs = append(l.procs, w)
	for i := 0; i < opts.Replicas; i++ {
		l.procs = append(l.procs, &proc{name: replicaName(i), dir: filepath.Join(root, "r"+strconv.Itoa(i))})
	}
	for _, p := range l.procs {
		p.node = Node{Host: "127.0.0.1", DataDir: filepath.Join(p.dir, "data")}
		p.logPath = filepath.Join(p.dir, "postgres.log")
		if err := l.mkdir(p.dir); err != nil {
			return nil, err
		}
	}

	out, err := l.run(ctx, "initdb", "-D", w.node.DataDir, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--no-locale", "--no-sync", "--no-instructions")
	if err != nil {
		return nil, fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	if err := writeCommonConf(w.node.DataDir, opts.Settings); err != nil {
		return nil, err
	}
	t1 := time.Now()

	useCopy := forceCopy || !fileExists(filepath.Join(bin, "pg_basebackup"))
	if useCopy {
		// initdb leaves a cleanly shut down cluster: copying it now is the
		// "copy a cleanly stopped primary" route without a stop and restart.
		// The copies start from initdb's shutdown checkpoint, so they are
		// consistent at once and stream everything after it.
		for _, p := range l.procs[1:] {
			if err := copyTree(w.node.DataDir, p.node.DataDir, as); err != nil {
				return nil, fmt.Errorf("pgtest: copy data dir: %w", err)
			}
		}
		opts.Logf("pgtest: copied %d data dirs in %v", opts.Replicas, time.Since(t1).Round(time.Millisecond))
	}
	if err := l.startProc(ctx, w, nil, true); err != nil {
		return nil, err
	}
	t2 := time.Now()

	var wg sync.WaitGroup
	errs := make([]error, len(l.procs))
	for i, p := range l.procs[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = l.startReplica(ctx, p, w, opts.ApplyDelay, useCopy)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	route := "pg_basebackup"
	if useCopy {
		route = "copied data dir"
	}
	opts.Logf("pgtest: writer %s and %d replicas (%s) up in %v (initdb %v, copies+writer start %v, replicas %v)",
		w.node.Addr(), opts.Replicas, route, time.Since(t0).Round(time.Millisecond),
		t1.Sub(t0).Round(time.Millisecond), t2.Sub(t1).Round(time.Millisecond), time.Since(t2).Round(time.Millisecond))

	c = &Cluster{Writer: w.node, BinDir: bin, be: l}
	for _, p := range l.procs[1:] {
		c.Replicas = append(c.Replicas, p.node)
	}
	return c, nil
}

func (l *local) startReplica(ctx context.Context, p, w *proc, delay time.Duration, copied bool) error {
	if !copied {
		out, err := l.run(ctx, "pg_basebackup", "-h", w.node.Host, "-p", strconv.Itoa(w.node.Port),
			"-U", "postgres", "-D", p.node.DataDir, "-X", "stream", "-c", "fast", "--no-sync")
		if err != nil {
			return fmt.Errorf("pgtest: pg_basebackup for %s: %w\n%s", p.name, err, out)
		}
	}
	// primary_conninfo goes in our node file, not via pg_basebackup -R, so
	// both routes look the same and application_name is ours to match in
	// pg_stat_replication.
	if err := l.writeFile(filepath.Join(p.node.DataDir, "standby.signal"), nil); err != nil {
		return err
	}
	if err := l.startProc(ctx, p, standbyLines(w.node, p.name, delay), true); err != nil {
		return err
	}
	if err := waitStreaming(ctx, w.node, p.name); err != nil {
		return fmt.Errorf("pgtest: %s never streamed: %w%s", p.name, err, logTail(p.logPath))
	}
	return nil
}

// standbyLines are the node file's settings of a standby streaming from w
// under application_name app.
func standbyLines(w Node, app string, delay time.Duration) []string {
	return []string{
		"primary_conninfo = " + quote(fmt.Sprintf("host=%s port=%d user=postgres application_name=%s", w.Host, w.Port, app)),
		fmt.Sprintf("recovery_min_apply_delay = %d", delay.Milliseconds()),
	}
}

// writeCommonConf appends settings shared by all nodes; the copies and base
// backups inherit postgresql.conf, and per-node values (port, socket dir,
// standby settings) live in pgtest_node.conf, included last so they win.
func writeCommonConf(data string, settings []string) error {
	conf := `
# pgtest
listen_addresses = '127.0.0.1'
max_connections = 200
shared_buffers = 32MB
fsync = off
synchronous_commit = on
full_page_writes = on
# pg_rewind needs hint-bit changes WAL-logged (or data checksums) to bring
# a crashed writer back as a standby of the new one (RebuildStandby).
wal_log_hints = on
wal_level = replica
max_wal_senders = 10
wal_keep_size = '1GB'
hot_standby = on
hot_standby_feedback = on
wal_receiver_status_interval = 1s
wal_retrieve_retry_interval = 100ms
track_commit_timestamp = on
log_min_messages = warning
logging_collector = off
`
	for i, l := range settings {
		if strings.ContainsAny(l, "\r\n") {
			return fmt.Errorf("pgtest: Options.Settings[%d] holds a line break; give one setting per entry", i)
		}
		conf += l + "\n"
	}
	conf += "include_if_exists = 'pgtest_node.conf'\n"
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(conf); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	// trust for everything on loopback, including replication; the unix
	// socket lines are for poking at a node with psql -h NODEDIR.
	hba := "local all all trust\nlocal replication all trust\nhost all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n"
	return os.WriteFile(filepath.Join(data, "pg_hba.conf"), []byte(hba), 0o600)
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// startProc writes the node file with a fresh free port and starts the
// postmaster, retrying with another port when someone else bound it between
// our probe and the server's bind. A restart (newPort false) keeps the port.
func (l *local) startProc(ctx context.Context, p *proc, extra []string, newPort bool) error {
	const attempts = 5
	for a := 1; ; a++ {
		if newPort {
			port, err := freePort()
			if err != nil {
				return err
			}
			p.node.Port = port
			if err := l.writeNodeConf(p, extra); err != nil {
				return err
			}
		}
		err := l.spawn(ctx, p)
		if err == nil || !newPort || a == attempts || !strings.Contains(logTail(p.logPath), "could not bind") {
			return err
		}
		l.logf("pgtest: port %d of %s taken, retrying", p.node.Port, p.name)
	}
}

// writeNodeConf writes p's node file: its port, socket dir and name, and
// extra lines (standby settings).
func (l *local) writeNodeConf(p *proc, extra []string) error {
	sock := ""
	// The socket is optional (we connect over TCP); skip it rather than fail
	// when TMPDIR makes the path too long.
	if len(p.dir)+len("/.s.PGSQL.65535") <= maxSocketPath {
		sock = p.dir
	}
	lines := append([]string{
		fmt.Sprintf("port = %d", p.node.Port),
		"unix_socket_directories = " + quote(sock),
		"cluster_name = " + quote(p.name),
	}, extra...)
	return l.writeFile(filepath.Join(p.node.DataDir, "pgtest_node.conf"), []byte(strings.Join(lines, "\n")+"\n"))
}

// spawn starts the postmaster directly (not via pg_ctl, which daemonizes it
// and so would cut it loose from our process) and waits until it accepts
// connections.
func (l *local) spawn(ctx context.Context, p *proc) error {
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := l.command(filepath.Join(l.bin, "postgres"), "-D", p.node.DataDir)
	cmd.Dir = p.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group: a terminal's ^C goes to us, and we decide how the
	// servers stop. SIGKILL on our death: no orphaned servers after a test
	// timeout or kill.
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	err = startLocked(cmd)
	logf.Close()
	if err != nil {
		return fmt.Errorf("pgtest: start %s: %w", p.name, err)
	}
	p.cmd = cmd
	p.exited = make(chan struct{})
	go func(ch chan struct{}) { cmd.Wait(); close(ch) }(p.exited)

	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-p.exited:
			p.cmd = nil
			return fmt.Errorf("pgtest: %s exited during startup: %s%s", p.name, cmd.ProcessState, logTail(p.logPath))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := connect(cctx, p.node)
		cancel()
		if err == nil {
			conn.Close(context.Background())
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgtest: %s not accepting connections after 60s: %w%s", p.name, err, logTail(p.logPath))
		}
	}
}

// stop signals the postmaster (SIGINT fast, SIGQUIT immediate shutdown) and
// waits; past the grace period it kills the whole process group.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) error {
	if p.cmd == nil {
		return nil
	}
	pid := p.cmd.Process.Pid
	_ = p.cmd.Process.Signal(sig)
	var err error
	select {
	case <-p.exited:
	case <-time.After(grace):
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-p.exited
		err = fmt.Errorf("%s did not stop within %v; killed", p.name, grace)
	}
	p.cmd = nil
	return err
}

func (l *local) stopNode(i int) error {
	return l.procs[i].stop(syscall.SIGINT, 30*time.Second)
}

func (l *local) startNode(ctx context.Context, i int) error {
	return l.startProc(ctx, l.procs[i], nil, false)
}

func (l *local) close() error {
	var wg sync.WaitGroup
	errs := make([]error, len(l.procs)+1)
	for i, p := range l.procs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = p.stop(syscall.SIGQUIT, 10*time.Second) }()
	}
	wg.Wait()
	if os.Getenv("PGRYW_PG_KEEP") == "1" {
		l.logf("pgtest: PGRYW_PG_KEEP=1: leaving %s (server logs in */postgres.log)", l.root)
		fmt.Fprintf(os.Stderr, "pgtest: kept %s\n", l.root)
	} else {
		errs[len(l.procs)] = os.RemoveAll(l.root)
	}
	return errors.Join(errs...)
}

// command builds a command that runs as the server user with a scrubbed
// environment: PG* variables (PGDATA, PGHOST, PGPORT, ...) would steer the
// PostgreSQL tools away from what we pass on the command line.
func (l *local) command(path string, args ...string) *exec.Cmd {
	cmd := exec.Command(path, args...)
	env := []string{"LC_ALL=C"}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "PG") && !strings.HasPrefix(e, "LC_") && !strings.HasPrefix(e, "LANG") {
			env = append(env, e)
		}
	}
	cmd.Env = env
	// A cwd the server user cannot enter (root's home) makes the tools warn
	// or fail; the temp root is always reachable.
	cmd.Dir = l.root
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: l.as.cred}
	return cmd
}

// run runs a PostgreSQL tool from the bin dir and returns its output.
func (l *local) run(ctx context.Context, tool string, args ...string) ([]byte, error) {
	cmd := l.command(filepath.Join(l.bin, tool), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.Bytes(), err
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		return out.Bytes(), ctx.Err()
	}
}

func (l *local) mkdir(d string) error {
	if err := os.Mkdir(d, 0o700); err != nil {
		return err
	}
	return l.chown(d)
}

func (l *local) writeFile(path string, b []byte) error {
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return err
	}
	return l.chown(path)
}

func (l *local) chown(path string) error {
	if l.as.cred == nil {
		return nil
	}
	return os.Lchown(path, l.as.uid, l.as.gid)
}

// copyTree copies a data directory, keeping permission bits (the server
// insists on 0700/0750 for the data dir) and handing ownership to the
// server user.
func copyTree(src, dst string, as runAs) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(target, info.Mode().Perm()); err != nil {
				return err
			}
		case info.Mode().IsRegular():
			if err := copyFile(path, target, info.Mode().Perm()); err != nil {
				return err
			}
		default:
			return fmt.Errorf("unexpected file type at %s", path)
		}
		if as.cred != nil {
			return os.Lchown(target, as.uid, as.gid)
		}
		return nil
	})
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// freePort asks the kernel for a free loopback port. Someone can take it
// before the server binds; startProc retries on that.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: pick port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// logTail returns the end of a server log for error messages.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return "\n--- " + path + " ---\n" + string(b)
}

// The parent-death signal fires when the OS thread that forked the child
// exits, not the process. Go may retire threads (a goroutine that exits
// while locked to its thread takes the thread with it), so servers are
// forked from one locked thread that lives as long as the process.
var spawner struct {
	once sync.Once
	reqs chan spawnReq
}

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

func startLocked(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan spawnReq)
		go func() {
			runtime.LockOSThread()
			for r := range spawner.reqs {
				r.done <- r.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	spawner.reqs <- spawnReq{cmd, done}
	return <-done
}
