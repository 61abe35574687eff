package pgtest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Writer failover: the writer dies (an immediate shutdown, as in a crash), a
// replica is promoted and becomes the writer, and the old writer is rebuilt
// as a standby of the new one.

// ErrFailoverUnsupported is what StopWriter, Failover and RebuildStandby
// return on a cluster pgtest did not start: they stop, promote and rebuild
// servers through their data directories.
var ErrFailoverUnsupported = errors.New("pgtest: writer failover needs local servers (an external cluster's writer cannot be stopped or rebuilt)")

// forceRebuildCopy makes RebuildStandby copy the writer's data dir even
// where pg_rewind exists, so tests cover the route bin dirs without it take.
var forceRebuildCopy bool

// failoverBackend is what a backend needs for writer failover; only local
// servers have it.
type failoverBackend interface {
	// stopWriter shuts the writer (node 0) down immediately.
	stopWriter() error
	// swap makes node i the writer (node 0) and the writer node i.
	swap(i int)
	// rebuild makes stopped node i a standby of the writer, streaming under
	// application_name app, starts it, and says how it was rebuilt.
	rebuild(ctx context.Context, i int, app string) (string, error)
}

// StopWriter stops the writer with an immediate shutdown (pg_ctl -m
// immediate, SIGQUIT to the postmaster): every backend is killed without a
// shutdown checkpoint, as in a crash, and clients see their connections
// end. It returns once the server has exited. Until Failover promotes a
// replica the cluster has no writer.
func (c *Cluster) StopWriter() error {
	fb, ok := c.be.(failoverBackend)
	if !ok {
		return ErrFailoverUnsupported
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errors.New("pgtest: cluster closed")
	}
	if c.writerStopped {
		return nil
	}
	if err := fb.stopWriter(); err != nil {
		return fmt.Errorf("pgtest: stop writer: %w", err)
	}
	c.writerStopped = true
	return nil
}

// Failover promotes replica i (pg_promote, waiting for completion) after
// StopWriter and makes it the writer: Writer and Replicas[i] trade places,
// so Writer, WriterDSN and every method that talks to the writer mean the
// new writer from then on, and replica i is the old writer, stopped and
// detached (StartNode refuses it: it would come up as a second primary;
// RebuildStandby(ctx, i) makes it a standby of the new writer). The other
// replicas still replay the old writer's history and are detached too
// (WaitCaughtUp skips them) until RebuildStandby. Ports do not change, so a
// DSN naming every node (MultiHostDSN) stays valid.
//
// Failover changes Writer and Replicas: do not call it while another
// goroutine uses the Cluster.
func (c *Cluster) Failover(ctx context.Context, i int) error {
	fb, ok := c.be.(failoverBackend)
	if !ok {
		return ErrFailoverUnsupported
	}
	c.mu.Lock()
	err := c.checkIndex(i)
	switch {
	case err != nil:
	case c.closed:
		err = errors.New("pgtest: cluster closed")
	case !c.writerStopped:
		err = errors.New("pgtest: Failover: the writer is running (StopWriter first)")
	case c.stopped[i] || c.detached[i]:
		err = fmt.Errorf("pgtest: Failover: replica %d is stopped or follows no writer", i)
	}
	r := c.Replicas[i]
	c.mu.Unlock()
	if err != nil {
		return err
	}
	if err := promote(ctx, r); err != nil {
		return fmt.Errorf("pgtest: promote replica %d: %w", i, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.Writer, c.Replicas[i] = c.Replicas[i], c.Writer
	fb.swap(i + 1)
	c.writerStopped = false
	for j := range c.Replicas {
		c.detached[j] = true
	}
	c.stopped[i] = true
	c.promoted[i] = false
	return nil
}

// RebuildStandby makes replica i a streaming standby of the current writer
// (stopping it first if it runs): the old writer after Failover, or a
// replica that followed it. With pg_rewind where the bin dir has it (which
// first completes the crash recovery an immediate shutdown left undone;
// wal_log_hints=on, set on every pgtest server, lets it rewind), else with
// a fresh copy of the running writer's data directory taken with the
// low-level backup API (pg_backup_start, copy, pg_backup_stop), which needs
// nothing but the server: the npm PostgreSQL 18 build has neither pg_rewind
// nor pg_basebackup. A failed pg_rewind falls back to the copy. Settings
// made with ALTER SYSTEM on the node are dropped. It returns how the node
// was rebuilt ("pg_rewind" or "copy") once the node streams from the
// writer.
func (c *Cluster) RebuildStandby(ctx context.Context, i int) (string, error) {
	fb, ok := c.be.(failoverBackend)
	if !ok {
		return "", ErrFailoverUnsupported
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.checkIndex(i); err != nil {
		return "", err
	}
	if c.closed {
		return "", errors.New("pgtest: cluster closed")
	}
	if c.writerStopped {
		return "", errors.New("pgtest: RebuildStandby: the writer is stopped (Failover first)")
	}
	if !c.stopped[i] {
		if err := c.be.stopNode(i + 1); err != nil {
			return "", fmt.Errorf("pgtest: stop replica %d: %w", i, err)
		}
		c.stopped[i] = true
	}
	how, err := fb.rebuild(ctx, i+1, c.appName(i))
	if err != nil {
		return "", fmt.Errorf("pgtest: rebuild replica %d: %w", i, err)
	}
	c.stopped[i], c.detached[i], c.promoted[i] = false, false, false
	if err := waitStreaming(ctx, c.Writer, c.appName(i)); err != nil {
		return "", fmt.Errorf("pgtest: rebuilt replica %d never streamed: %w", i, err)
	}
	return how, nil
}

// MultiHostDSN returns a URL naming every node as a writer candidate, the
// writer first, in pgx's multi-host form with target_session_attrs=
// read-write (pgx connects to the first that accepts writes), e.g.
// "postgres://postgres@127.0.0.1:P0,127.0.0.1:P1/postgres?sslmode=disable&target_session_attrs=read-write".
// After Failover the same hosts are named, in another order.
func (c *Cluster) MultiHostDSN() string {
	addrs := []string{c.Writer.Addr()}
	addrs = append(addrs, c.ReplicaAddrs()...)
	// Node.DSN escapes credentials; only the host part differs.
	d := c.Writer.DSN()
	at := strings.LastIndex(d, "@") + 1
	if at == 0 {
		at = len("postgres://")
	}
	rest := d[at+len(c.Writer.Addr()):]
	return d[:at] + strings.Join(addrs, ",") + rest + "&target_session_attrs=read-write"
}

// PauseStreaming stops replica i's WAL receiver: ALTER SYSTEM sets an empty
// primary_conninfo, and a reload (PostgreSQL ≥ 13) applies it, waiting until the
// receiver has exited. The replica keeps what it received and replays it;
// it receives nothing more until ResumeStreaming, so a writer that dies
// meanwhile takes the rest of its history with it.
func (c *Cluster) PauseStreaming(ctx context.Context, i int) error {
	idx, err := c.targets(i)
	if err != nil {
		return err
	}
	for _, j := range idx {
		err := withConn(ctx, c.Replicas[j], func(conn *pgx.Conn) error {
			if _, err := conn.Exec(ctx, "ALTER SYSTEM SET primary_conninfo = ''"); err != nil {
				return err
			}
			if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
				return err
			}
			return poll(ctx, func() (bool, error) {
				var n int
				err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_wal_receiver").Scan(&n)
				return n == 0, err
			})
		})
		if err != nil {
			return fmt.Errorf("pgtest: replica %d: %w", j, err)
		}
	}
	return nil
}

// ResumeStreaming undoes PauseStreaming on replica i and waits until it
// streams from the writer again.
func (c *Cluster) ResumeStreaming(ctx context.Context, i int) error {
	idx, err := c.targets(i)
	if err != nil {
		return err
	}
	for _, j := range idx {
		err := withConn(ctx, c.Replicas[j], func(conn *pgx.Conn) error {
			if _, err := conn.Exec(ctx, "ALTER SYSTEM RESET primary_conninfo"); err != nil {
				return err
			}
			_, err := conn.Exec(ctx, "SELECT pg_reload_conf()")
			return err
		})
		if err == nil {
			err = waitStreaming(ctx, c.Writer, c.appName(j))
		}
		if err != nil {
			return fmt.Errorf("pgtest: replica %d: %w", j, err)
		}
	}
	return nil
}

func promote(ctx context.Context, n Node) error {
	return withConn(ctx, n, func(conn *pgx.Conn) error {
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT pg_promote(true, 60)").Scan(&ok); err != nil {
			return err
		}
		if !ok {
			return errors.New("pg_promote returned false")
		}
		return nil
	})
}

func (l *local) stopWriter() error {
	return l.procs[0].stop(syscall.SIGQUIT, 30*time.Second)
}

func (l *local) swap(i int) { l.procs[0], l.procs[i] = l.procs[i], l.procs[0] }

func (l *local) rebuild(ctx context.Context, i int, app string) (string, error) {
	p, w := l.procs[i], l.procs[0]
	if p.cmd != nil {
		return "", fmt.Errorf("%s is running", p.name)
	}
	how := "pg_rewind"
	var err error
	switch {
	case forceRebuildCopy:
		err = errors.New("copy forced")
	case fileExists(filepath.Join(l.bin, "pg_rewind")):
		if err = l.rewind(ctx, p, w); err != nil {
			l.logf("pgtest: pg_rewind of %s failed; copying the writer's data dir instead: %v", p.name, err)
		}
	default:
		err = errors.New("no pg_rewind")
		l.logf("pgtest: %s has no pg_rewind: rebuilding %s from a copy of the running writer's data dir", l.bin, p.name)
	}
	if err != nil {
		how = "copy"
		if err := l.copyFromWriter(ctx, p, w); err != nil {
			return "", err
		}
	}
	p.name = app
	// Both routes bring the writer's files along: its node file and its
	// ALTER SYSTEM settings (postgresql.auto.conf, read after the node
	// file, would win).
	if err := l.writeFile(filepath.Join(p.node.DataDir, "postgresql.auto.conf"),
		[]byte("# Do not edit this file manually!\n# It will be overwritten by the ALTER SYSTEM command.\n")); err != nil {
		return "", err
	}
	if err := l.writeNodeConf(p, standbyLines(w.node, app, 0)); err != nil {
		return "", err
	}
	if err := l.writeFile(filepath.Join(p.node.DataDir, "standby.signal"), nil); err != nil {
		return "", err
	}
	if err := l.spawn(ctx, p); err != nil {
		return "", err
	}
	return how, nil
}

// rewind runs pg_rewind on p's data dir with the running writer w as the
// source. After an immediate shutdown pg_rewind (PostgreSQL ≥ 13) first runs
// the server in single-user mode to finish crash recovery.
func (l *local) rewind(ctx context.Context, p, w *proc) error {
	t0 := time.Now()
	// pg_rewind reads the source's timeline from its control file, which a
	// promoted server updates at its first checkpoint: until then it would
	// find both on one timeline and rewind nothing.
	if err := withConn(ctx, w.node, func(conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, "CHECKPOINT")
		return err
	}); err != nil {
		return fmt.Errorf("checkpoint on the writer: %w", err)
	}
	src := fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres", w.node.Host, w.node.Port)
	out, err := l.run(ctx, "pg_rewind", "--target-pgdata", p.node.DataDir, "--source-server", src, "--no-sync")
	if err != nil {
		return fmt.Errorf("%w\n%s", err, out)
	}
	l.logf("pgtest: pg_rewind of %s onto %s in %v: %s", p.name, w.name, time.Since(t0).Round(time.Millisecond), lastLine(out))
	return nil
}

// copyFromWriter replaces p's data dir with a copy of the running writer's,
// taken as a low-level base backup: pg_backup_start, a file copy (files may
// change under it; replaying WAL from the backup's start fixes that, with
// full-page writes forced meanwhile), pg_backup_stop, whose backup label
// the copy gets. Its pg_wal starts empty: as a standby it streams the WAL
// from the backup's start from the writer (wal_keep_size keeps it).
func (l *local) copyFromWriter(ctx context.Context, p, w *proc) error {
	t0 := time.Now()
	conn, err := connect(ctx, w.node)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var ver int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&ver); err != nil {
		return err
	}
	start := "SELECT pg_backup_start('pgtest', true)"
	stop := "SELECT labelfile, coalesce(spcmapfile, '') FROM pg_backup_stop(false)"
	if ver < 150000 {
		start = "SELECT pg_start_backup('pgtest', true, false)"
		stop = "SELECT labelfile, coalesce(spcmapfile, '') FROM pg_stop_backup(false, false)"
	}
	if _, err := conn.Exec(ctx, start); err != nil {
		return fmt.Errorf("backup start: %w", err)
	}
	if err := os.RemoveAll(p.node.DataDir); err != nil {
		return err
	}
	if err := copyLive(w.node.DataDir, p.node.DataDir, l.as); err != nil {
		return fmt.Errorf("copy data dir: %w", err)
	}
	var label, spcmap string
	if err := conn.QueryRow(ctx, stop).Scan(&label, &spcmap); err != nil {
		return fmt.Errorf("backup stop: %w", err)
	}
	if err := l.writeFile(filepath.Join(p.node.DataDir, "backup_label"), []byte(label)); err != nil {
		return err
	}
	if spcmap != "" {
		if err := l.writeFile(filepath.Join(p.node.DataDir, "tablespace_map"), []byte(spcmap)); err != nil {
			return err
		}
	}
	l.logf("pgtest: copied the writer's data dir for %s in %v", p.name, time.Since(t0).Round(time.Millisecond))
	return nil
}

// skipInBackup says whether a data dir entry (path relative to the data
// dir) stays out of a base backup, as pg_basebackup leaves it out: the
// server's runtime files, and the contents of directories that are rebuilt
// at startup or streamed (pg_wal).
func skipInBackup(rel string, dir bool) (skip, skipContents bool) {
	switch rel {
	case "postmaster.pid", "postmaster.opts", "backup_label", "tablespace_map", "standby.signal", "recovery.signal":
		return true, false
	case "pg_wal", "pg_replslot", "pg_stat_tmp", "pg_dynshmem", "pg_notify", "pg_serial", "pg_snapshots", "pg_subtrans":
		return false, dir
	}
	return filepath.Base(rel) == "pg_internal.init", false
}

// copyLive copies a running server's data dir: files that vanish while it
// walks are skipped, and what skipInBackup names is left out.
func copyLive(src, dst string, as runAs) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		rel, _ := filepath.Rel(src, path)
		skip, skipContents := skipInBackup(rel, d.IsDir())
		if skip {
			return nil
		}
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			if err := os.Mkdir(target, info.Mode().Perm()); err != nil {
				return err
			}
		case info.Mode().IsRegular():
			err := copyFile(path, target, info.Mode().Perm())
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if err != nil {
				return err
			}
		default:
			return nil // sockets and the like are not data
		}
		if as.cred != nil {
			if err := os.Lchown(target, as.uid, as.gid); err != nil {
				return err
			}
		}
		if skipContents {
			return fs.SkipDir
		}
		return nil
	})
}

// lastLine returns the last non-empty line of a tool's output.
func lastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}
