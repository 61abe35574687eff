package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgryw/pgryw/internal/ctxsleep"
)

// Server cost per strategy: what the servers executed and how much CPU they
// burnt while one strategy ran, divided by its iterations. Only one strategy
// runs at a time, so a slice's deltas are that strategy's, plus the
// background every slice shares: the replica monitors of the pgryw pools
// (one poll per replica per 100ms each) and the servers' own background
// processes. That background is measured for a second with every pool open
// and nothing running, and its rate times each slice's duration is taken
// off.
//
// Statements come from pg_stat_statements (-pgss: loaded into a local
// cluster, or already installed on given servers); CPU from /proc (local
// cluster only: the postmaster's process tree, as root or as its owner).

// nodeMeter measures one server.
type nodeMeter struct {
	name string
	db   *sql.DB // pg_stat_statements queries; nil without them
	pm   int     // postmaster pid; 0 without /proc access
	own  int     // the backend serving db, left out of the CPU readings
}

// nodeSnap is one reading of a node.
type nodeSnap struct {
	calls    int64         // pg_stat_statements calls, summed
	dealloc  int64         // pg_stat_statements_info.dealloc: entries evicted
	all      time.Duration // CPU of the postmaster and all its children
	backends time.Duration // CPU of the client backends alone
}

// costMeter reads every node before and after each measured slice.
type costMeter struct {
	primary  *nodeMeter
	replicas []*nodeMeter
	stmts    bool // pg_stat_statements answers on every node
	cpu      bool // /proc works for every node
	bg       costRate
}

// costRate is a background rate: statements and CPU nanoseconds per second.
type costRate struct {
	primCalls, replCalls float64
	primAll, primBack    float64
	replAll, replBack    float64
	measured             bool
}

// background measures the background rate over d with nothing running.
func (m *costMeter) background(ctx context.Context, d time.Duration) error {
	if !m.enabled() {
		return nil
	}
	before, err := m.snapshot(ctx)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := ctxsleep.Sleep(ctx, d); err != nil {
		return err
	}
	after, err := m.snapshot(ctx)
	if err != nil {
		return err
	}
	var delta costDelta
	delta.add(m, before, after, 0)
	sec := time.Since(t0).Seconds()
	m.bg = costRate{
		primCalls: delta.primCalls / sec, replCalls: delta.replCalls / sec,
		primAll: delta.primAll / sec, primBack: delta.primBack / sec,
		replAll: delta.replAll / sec, replBack: delta.replBack / sec,
		measured: true,
	}
	return nil
}

// costSnap is one reading of every node: the primary's, and the replicas'
// summed.
type costSnap struct {
	primary, replicas nodeSnap
}

func (m *costMeter) enabled() bool { return m != nil && (m.stmts || m.cpu) }

// snapshot reads every node.
func (m *costMeter) snapshot(ctx context.Context) (costSnap, error) {
	var s costSnap
	if !m.enabled() {
		return s, nil
	}
	var err error
	if s.primary, err = m.read(ctx, m.primary); err != nil {
		return s, err
	}
	for _, r := range m.replicas {
		n, err := m.read(ctx, r)
		if err != nil {
			return s, err
		}
		s.replicas.calls += n.calls
		s.replicas.dealloc += n.dealloc
		s.replicas.all += n.all
		s.replicas.backends += n.backends
	}
	return s, nil
}

func (m *costMeter) read(ctx context.Context, n *nodeMeter) (nodeSnap, error) {
	var s nodeSnap
	if m.stmts {
		// showtext false: the texts live in a file the function would
		// otherwise read whole. This query counts itself in the next
		// reading; costDelta.add takes it off.
		// Its own backend's CPU is left out: reading thousands of entries
		// (one per WAIT FOR text, say) costs milliseconds.
		err := n.db.QueryRowContext(ctx, "SELECT (SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements(false)), (SELECT dealloc FROM pg_stat_statements_info), pg_backend_pid()").
			Scan(&s.calls, &s.dealloc, &n.own)
		if err != nil {
			return s, fmt.Errorf("%s: reading pg_stat_statements: %w", n.name, err)
		}
	}
	if m.cpu {
		var err error
		if s.all, s.backends, err = treeCPU(n.pm, n.own); err != nil {
			return s, fmt.Errorf("%s: reading /proc: %w", n.name, err)
		}
	}
	return s, nil
}

// costDelta accumulates what the servers did during one strategy's slices:
// statements, and CPU in nanoseconds.
type costDelta struct {
	stmts, cpu        bool
	evicted           bool // pg_stat_statements dropped entries: counts too low
	primCalls         float64
	replCalls         float64
	primAll, primBack float64
	replAll, replBack float64
}

// add adds one slice's readings taken before and after it, less the
// background over the slice's duration dur.
func (d *costDelta) add(m *costMeter, before, after costSnap, dur time.Duration) {
	if !m.enabled() {
		return
	}
	d.stmts, d.cpu = m.stmts, m.cpu
	sec := dur.Seconds()
	if m.stmts {
		// Minus the reading before the slice, counted in the one after.
		d.primCalls += float64(after.primary.calls-before.primary.calls-1) - m.bg.primCalls*sec
		d.replCalls += float64(after.replicas.calls-before.replicas.calls-int64(len(m.replicas))) - m.bg.replCalls*sec
		if after.primary.dealloc != before.primary.dealloc || after.replicas.dealloc != before.replicas.dealloc {
			d.evicted = true
		}
	}
	if m.cpu {
		d.primAll += float64(after.primary.all-before.primary.all) - m.bg.primAll*sec
		d.primBack += float64(after.primary.backends-before.primary.backends) - m.bg.primBack*sec
		d.replAll += float64(after.replicas.all-before.replicas.all) - m.bg.replAll*sec
		d.replBack += float64(after.replicas.backends-before.replicas.backends) - m.bg.replBack*sec
	}
}

// costSummary is a strategy's server cost per iteration ("op": a write and
// its read, or the one call of a write-only or read-only strategy). CPU in
// microseconds. Absent values were not measured.
type costSummary struct {
	ReplicaStatements *float64 `json:"replica_statements_per_op,omitempty"`
	PrimaryStatements *float64 `json:"primary_statements_per_op,omitempty"`
	StatementsEvicted bool     `json:"statements_evicted,omitempty"`
	ReplicaBackendCPU *float64 `json:"replica_backend_cpu_us_per_op,omitempty"`
	ReplicaAllCPU     *float64 `json:"replica_all_cpu_us_per_op,omitempty"`
	PrimaryBackendCPU *float64 `json:"primary_backend_cpu_us_per_op,omitempty"`
	PrimaryAllCPU     *float64 `json:"primary_all_cpu_us_per_op,omitempty"`
}

func (d *costDelta) summarize(ops int) *costSummary {
	if ops == 0 || !d.stmts && !d.cpu {
		return nil
	}
	per := func(v float64) *float64 { x := v / float64(ops); return &x }
	us := func(ns float64) *float64 { return per(ns / 1e3) }
	var c costSummary
	if d.stmts {
		c.ReplicaStatements, c.PrimaryStatements = per(d.replCalls), per(d.primCalls)
		c.StatementsEvicted = d.evicted
	}
	if d.cpu {
		c.ReplicaBackendCPU, c.ReplicaAllCPU = us(d.replBack), us(d.replAll)
		c.PrimaryBackendCPU, c.PrimaryAllCPU = us(d.primBack), us(d.primAll)
	}
	return &c
}

// postmasterPID reads a data directory's postmaster.pid.
func postmasterPID(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	pid, err := strconv.Atoi(strings.TrimSpace(string(line)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("%s/postmaster.pid: no pid on its first line", dataDir)
	}
	return pid, nil
}

// clockTick is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on every
// Linux platform Go supports.
const clockTick = 10 * time.Millisecond

// treeCPU returns the CPU time of postmaster pm and its children but skip
// (time on CPU from /proc/<pid>/schedstat, in nanoseconds; plus, at
// clock-tick resolution, the children that have exited, from the
// postmaster's cutime and cstime), and of the client backends alone
// (children whose process title shows a client address: "host(port)" or
// "[local]").
func treeCPU(pm, skip int) (all, backends time.Duration, err error) {
	own, err := schedCPU(pm)
	if err != nil {
		return 0, 0, err
	}
	st, err := procStat(pm)
	if err != nil {
		return 0, 0, err
	}
	// Fields after the command: state is field 3, cutime 16, cstime 17.
	cu, _ := strconv.ParseInt(st[16-3], 10, 64)
	cs, _ := strconv.ParseInt(st[17-3], 10, 64)
	all = own + time.Duration(cu+cs)*clockTick
	kids, err := children(pm)
	if err != nil {
		return 0, 0, err
	}
	for _, pid := range kids {
		if pid == skip {
			continue
		}
		t, err := schedCPU(pid)
		if err != nil {
			continue // exited meanwhile: its time is in cutime next time
		}
		all += t
		if isClientBackend(pid) {
			backends += t
		}
	}
	return all, backends, nil
}

// procStat returns the fields of /proc/pid/stat after the command name,
// starting with the state (field 3).
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return nil, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	return f, nil
}

// schedCPU returns a process's time on CPU (the first field of
// /proc/pid/schedstat, in ns; PostgreSQL processes have one thread).
func schedCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("/proc/%d/schedstat is empty", pid)
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	return time.Duration(ns), err
}

// children lists pm's child processes: /proc/pm/task/pm/children where the
// kernel has it, else a scan of /proc.
func children(pm int) ([]int, error) {
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pm, pm)); err == nil {
		var out []int
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				out = append(out, pid)
			}
		}
		return out, nil
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := procStat(pid)
		if err != nil {
			continue
		}
		if ppid, _ := strconv.Atoi(st[1]); ppid == pm {
			out = append(out, pid)
		}
	}
	return out, nil
}

// isClientBackend tells a client backend by its process title:
// "postgres: replica0: postgres postgres 127.0.0.1(41234) idle".
func isClientBackend(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	return isClientTitle(string(b))
}

func isClientTitle(title string) bool {
	if strings.Contains(title, "walsender") {
		return false
	}
	if strings.Contains(title, "[local]") {
		return true
	}
	open := strings.IndexByte(title, '(')
	return open > 0 && strings.IndexByte(title[open:], ')') > 0 && title[open-1] != ' '
}

// newCostMeter sets up the cost readings: pg_stat_statements if pgss (it
// must answer on every node), /proc if dataDirs are known (local cluster).
// What cannot be measured is left out with a note on stderr, not an error.
func newCostMeter(ctx context.Context, open func(dsn string) (*sql.DB, error), primaryDSN string, replicaDSNs []string, dataDirs []string, pgss bool) (*costMeter, error) {
	m := &costMeter{}
	nodes := append([]string{primaryDSN}, replicaDSNs...)
	for i, dsn := range nodes {
		n := &nodeMeter{name: "primary"}
		if i > 0 {
			n.name = fmt.Sprintf("replica %d", i-1)
		}
		if pgss {
			db, err := open(dsn)
			if err != nil {
				return m, err
			}
			db.SetMaxOpenConns(1)
			n.db = db
		}
		if i == 0 {
			m.primary = n
		} else {
			m.replicas = append(m.replicas, n)
		}
	}
	if pgss {
		m.stmts = true
		for _, n := range m.all() {
			var x int64
			if err := n.db.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_statements(false)").Scan(&x); err != nil {
				fmt.Fprintf(os.Stderr, "rywbench: -pgss: pg_stat_statements does not answer on the %s (%v); statements are not counted\n", n.name, err)
				m.stmts = false
				break
			}
		}
	}
	if len(dataDirs) == len(nodes) {
		m.cpu = true
		for i, n := range m.all() {
			pid, err := postmasterPID(dataDirs[i])
			if err == nil {
				_, _, err = treeCPU(pid, 0)
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "rywbench: no CPU readings: the %s's processes: %v\n", n.name, err)
				m.cpu = false
				break
			}
			n.pm = pid
		}
	}
	return m, nil
}

func (m *costMeter) all() []*nodeMeter { return append([]*nodeMeter{m.primary}, m.replicas...) }

func (m *costMeter) close() {
	if m == nil {
		return
	}
	for _, n := range m.all() {
		if n != nil && n.db != nil {
			n.db.Close()
		}
	}
}

// processCPU is the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
