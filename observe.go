package pgryw

import (
	"context"
	"database/sql"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/pgryw/pgryw/internal/lsn"
	"github.com/pgryw/pgryw/internal/sqlclass"
)

// Which node served a statement, and why: the served-by hook, the per-node
// counters behind NodeStats, and the log lines about routing and node
// state. The routing code calls in here at the few points where it knows
// something (a replica passed over, a wait, a fallback, a statement
// answered); everything here is counting and reporting, never deciding.
//
// With no hook and no logger enabled for Debug, a statement costs a few
// atomic additions here and allocates nothing.

// Role is what a node is in the connector's configuration.
type Role uint8

// Roles.
const (
	RolePrimary Role = iota + 1 // the writer
	RoleReplica                 // a node listed in replicas
)

// String returns "primary" or "replica".
func (r Role) String() string {
	switch r {
	case RolePrimary:
		return "primary"
	case RoleReplica:
		return "replica"
	}
	return "unknown"
}

// Route says why a statement ran on the node that ran it.
type Route uint8

// Routes.
const (
	// RouteReplica: a read, on a replica that had replayed the session's
	// watermark (or, with ServedBy.Stale, that had not: on_timeout=stale).
	RouteReplica Route = iota + 1
	// RouteReplicaHint: a read with /* pgryw:replica */ or WithReplica, on
	// a replica (also on a connection pinned to the primary).
	RouteReplicaHint
	// RouteWrite: a statement that may write, or that the classifier
	// cannot vouch for, on the primary.
	RouteWrite
	// RoutePinned: a statement that changes or depends on session state
	// (SET, PREPARE, LISTEN, temporary tables, advisory locks, ...), or a
	// read on a connection such a statement pinned to the primary.
	RoutePinned
	// RoutePrimaryHint: a read with /* pgryw:primary */ or WithPrimary.
	RoutePrimaryHint
	// RouteTransaction: transaction control (an Exec'd BEGIN, COMMIT...),
	// a statement inside a transaction, or the BEGIN of a database/sql
	// transaction, on the node that runs the transaction.
	RouteTransaction
	// RouteFallback: a read (or a read-only transaction) on the primary
	// because no replica could serve it; ServedBy.Fallback says why.
	RouteFallback
	// RouteNoReplicas: the connector has no replicas; nothing is routed.
	RouteNoReplicas
	// RouteNodeLocal: a read of node identity or node-local state
	// (pg_is_in_recovery(), SHOW transaction_read_only, pg_locks, a
	// sequence's own columns...), on the primary, which answers it as a
	// connection to the primary alone would.
	RouteNodeLocal
)

var routeNames = [...]string{
	RouteReplica:     "replica",
	RouteReplicaHint: "replica hint",
	RouteWrite:       "write",
	RoutePinned:      "pinned",
	RoutePrimaryHint: "primary hint",
	RouteTransaction: "transaction",
	RouteFallback:    "fallback",
	RouteNoReplicas:  "no replicas",
	RouteNodeLocal:   "node-local",
}

// String names the route: "replica", "replica hint", "write", "pinned",
// "primary hint", "transaction", "fallback", "no replicas".
func (r Route) String() string {
	if int(r) < len(routeNames) && routeNames[r] != "" {
		return routeNames[r]
	}
	return "unknown"
}

// Fallback says why a read could not be served by a replica.
type Fallback uint8

// Fallback reasons.
const (
	FallbackNone Fallback = iota
	// FallbackBehind: the replica had not replayed the session's watermark
	// within wait_timeout, or by its measured lag could not have.
	FallbackBehind
	// FallbackUnreachable: connecting to the replica failed, or it failed
	// the read before any row reached the caller (its connection broke, it
	// was shutting down, a recovery conflict).
	FallbackUnreachable
	// FallbackPromoted: the replica said it is no longer in recovery.
	FallbackPromoted
	// FallbackRefused: the replica refused to start the transaction under
	// the session's defaults (SERIALIZABLE on a standby).
	FallbackRefused
	// FallbackNoReplica: every replica was already known to be down,
	// promoted or refusing when the read started.
	FallbackNoReplica
	// FallbackPositionLost: the session's position had been lost and could
	// not be read again from the primary, so no replica could be checked.
	FallbackPositionLost
	// FallbackCannotWait: the replica refused to wait for the watermark
	// here and now (PostgreSQL 19 refuses a wait while the session holds a
	// lock); nothing is wrong with the node.
	FallbackCannotWait
	// FallbackForeign: the replica connection reached a standby of another
	// cluster (its system identifier is not the writer's).
	FallbackForeign

	fallbackCount // the size of FallbackCounts
)

var fallbackNames = [...]string{
	FallbackNone:         "",
	FallbackBehind:       "replica behind",
	FallbackUnreachable:  "replica unreachable",
	FallbackPromoted:     "replica promoted",
	FallbackRefused:      "replica refused",
	FallbackNoReplica:    "no replica usable",
	FallbackPositionLost: "position lost",
	FallbackCannotWait:   "replica cannot wait",
	FallbackForeign:      "another cluster's standby",
}

// String names the reason ("replica behind", "replica unreachable",
// "replica promoted", "replica refused", "no replica usable", "position
// lost", "replica cannot wait", "another cluster's standby"), or "" for
// FallbackNone.
func (f Fallback) String() string {
	if int(f) < len(fallbackNames) {
		return fallbackNames[f]
	}
	return "unknown"
}

// ServedBy describes where one statement ran and why. It never carries the
// statement's text or arguments.
type ServedBy struct {
	Addr  string // the node's host:port, as configured
	Host  string // the node's host
	Port  uint16 // the node's port
	Role  Role
	Route Route
	// Fallback says why a read went to the primary (Route is
	// RouteFallback), or, on a replica, why the replica tried before it
	// could not serve it.
	Fallback Fallback
	// Wait is how long pgryw waited for replicas to replay the session's
	// watermark before the statement was answered, including the round
	// trips that carried the checks (the read's own, for a check riding in
	// front of it). Zero when no replica had to be waited for.
	Wait time.Duration
	// Stale: a replica served the read without having replayed the
	// session's watermark (on_timeout=stale).
	Stale bool
	// Begin: the statement was the BEGIN of a database/sql transaction.
	Begin bool
	// Watermark is, for a replica read, the WAL position the replica was
	// known or checked to have replayed before its answer was used: the
	// watermark the read answered to, as pg_lsn's 64 bits
	// (fmt.Sprintf("%X/%X", w>>32, uint32(w)) prints it as PostgreSQL
	// does). Zero when it answered to none (read_your_writes=off, nothing
	// written yet), and for statements on the primary.
	Watermark uint64
	// Checked: a catch-up check (a replay poll or WAIT FOR) rode with the
	// read on the replica; false when the replica was already known to
	// have replayed the watermark.
	Checked bool
}

// ServedByFunc receives a ServedBy once per statement that reached a server
// (and once per database/sql transaction's BEGIN), on the goroutine that
// ran it, after its answer arrived (for a query, before its rows are read),
// with the statement's context. It is not called for a statement pgryw
// refused itself (ErrReplicaHint) or that ended while waiting for a replica
// (ErrReplicaBehind, the context's end). It must be quick: the statement
// waits for it.
type ServedByFunc func(ctx context.Context, s ServedBy)

type servedByKey struct{}

// servedByUsed: WithServedBy was called in this process. Until then no
// statement looks for a hook in its context.
var servedByUsed atomic.Bool

// WithServedBy returns a context whose statements report where they ran to
// f (see ServedByFunc): for request logs and ORMs that want to say which
// node answered. It replaces a hook set on ctx before; nil removes it. A
// hook set with Connector.SetServedBy is called as well.
func WithServedBy(ctx context.Context, f ServedByFunc) context.Context {
	servedByUsed.Store(true)
	return context.WithValue(ctx, servedByKey{}, f)
}

// servedByFrom returns the hook attached with WithServedBy, or nil.
func servedByFrom(ctx context.Context) ServedByFunc {
	if !servedByUsed.Load() {
		return nil
	}
	f, _ := ctx.Value(servedByKey{}).(ServedByFunc)
	return f
}

// connObs is the connector's share: the pool-wide hook.
type connObs struct {
	hook atomic.Pointer[ServedByFunc]
}

// SetServedBy sets a hook that every statement of the connector's pool
// reports to (see ServedByFunc), as well as to a hook in its context; nil
// removes it. Reach the connector of a sql.Open pool with ConnectorOf.
func (c *Connector) SetServedBy(f ServedByFunc) {
	if f == nil {
		c.obs.hook.Store(nil)
		return
	}
	c.obs.hook.Store(&f)
}

// stmtObs is what the routing of the statement under way on a Conn learned
// for its report: why the replicas tried could not serve it, and how long
// they were waited for. onReplica starts it afresh; the report of the
// statement clears it.
type stmtObs struct {
	reason Fallback      // why the last replica passed over could not serve
	last   *node         // that replica (nil: none was tried)
	waited bool          // pipelined polled again after a failed check
	wait   time.Duration // time spent waiting for replicas
	// wm and checked: the watermark a replica read answered to, and
	// whether a check rode with it (ServedBy.Watermark, Checked).
	wm      lsn.LSN
	checked bool
}

// skip records that replica n (nil: none in particular) cannot serve the
// read under way, and why.
func (cn *Conn) skip(n *node, why Fallback) {
	cn.obs.reason, cn.obs.last = why, n
	c := cn.c
	if n != nil {
		n.obs.misses[why].Add(1)
		c.noteHealth(n)
	}
	if c.debug() {
		addr := ""
		if n != nil {
			addr = n.addr
		}
		c.logAt(slog.LevelDebug, "pgryw: replica could not serve the read as asked", slog.String("node", addr), slog.String("reason", why.String()))
	}
}

// fellBack counts a read (or a read-only transaction) sent to the primary
// in place of a replica, by the reason last recorded, and looks at every
// replica's state: a fallback is when their state changes are news.
func (cn *Conn) fellBack() {
	if cn.obs.reason == FallbackNone {
		cn.obs.reason = FallbackNoReplica
	}
	c := cn.c
	c.topo.primary.obs.fallbacks[cn.obs.reason].Add(1)
	for _, r := range c.topo.replicas {
		c.noteHealth(r)
	}
}

// fellBackFrom counts a read-only transaction moved from replica n to the
// primary because n refused it.
func (cn *Conn) fellBackFrom(n *node, why Fallback) {
	cn.skip(n, why)
	cn.fellBack()
}

// servedPlain reports a statement (or a BEGIN) of a connector without
// replicas.
func (cn *Conn) servedPlain(ctx context.Context, begin bool) {
	n := cn.c.topo.primary
	if begin {
		n.obs.transactions.Add(1)
	} else {
		n.obs.statements.Add(1)
	}
	cn.report(ctx, n, RolePrimary, begin, RouteNoReplicas)
}

// servedReplica reports a read (or a read-only transaction's BEGIN) that
// replica n answered, by the route its plan gave.
func (cn *Conn) servedReplica(ctx context.Context, n *node, route Route, begin bool) {
	o := &n.obs
	if begin {
		o.transactions.Add(1)
	} else {
		o.statements.Add(1)
		o.reads.Add(1)
	}
	if cn.stale(n) {
		o.staleReads.Add(1)
	}
	cn.report(ctx, n, RoleReplica, begin, route)
}

// stale reports that n serves the read under way although it was found
// behind the watermark (on_timeout=stale).
func (cn *Conn) stale(n *node) bool {
	return cn.obs.reason == FallbackBehind && cn.obs.last == n && cn.c.cfg.OnTimeout == OnTimeoutStale
}

// servedPrimary reports a statement run on the primary outside a
// database/sql transaction, by its plan's route.
func (cn *Conn) servedPrimary(ctx context.Context, cls *sqlclass.Result, p *plan) {
	if !p.tried {
		cn.obs = stmtObs{} // a read that failed before left its notes
	}
	c := cn.c
	n := c.topo.primary
	n.obs.statements.Add(1)
	if c.mayWrite(cls) {
		n.obs.writes.Add(1)
	} else {
		n.obs.reads.Add(1)
	}
	cn.report(ctx, n, RolePrimary, false, p.route)
}

// servedBegin reports the BEGIN of a database/sql transaction on the
// primary, by its plan's route.
func (cn *Conn) servedBegin(ctx context.Context, p *plan) {
	n := cn.c.topo.primary
	n.obs.transactions.Add(1)
	cn.report(ctx, n, RolePrimary, true, p.route)
}

// report finishes a statement's observation: it notes the serving node's
// state if it was not known to be up, calls the hooks and writes the Debug
// line. route is only computed when someone will see it.
func (cn *Conn) report(ctx context.Context, n *node, role Role, begin bool, route Route) {
	c := cn.c
	if Health(n.obs.health.Load()) != HealthUp {
		c.noteHealth(n)
	}
	var pool ServedByFunc
	if p := c.obs.hook.Load(); p != nil {
		pool = *p
	}
	own := servedByFrom(ctx)
	debug := c.debugCtx(ctx)
	if pool == nil && own == nil && !debug {
		cn.obs = stmtObs{}
		return
	}
	s := ServedBy{
		Addr: n.addr, Host: n.host, Port: n.port, Role: role, Route: route,
		Fallback: cn.obs.reason, Wait: cn.obs.wait, Stale: role == RoleReplica && cn.stale(n), Begin: begin,
		Watermark: uint64(cn.obs.wm), Checked: cn.obs.checked,
	}
	if s.Route == RouteFallback && s.Fallback == FallbackNone {
		s.Fallback = FallbackNoReplica
	}
	cn.obs = stmtObs{}
	if pool != nil {
		pool(ctx, s)
	}
	if own != nil {
		own(ctx, s)
	}
	if debug {
		c.logRoute(ctx, s)
	}
}

// logRoute writes a statement's Debug line: where and why, never what.
func (c *Connector) logRoute(ctx context.Context, s ServedBy) {
	msg := "pgryw: statement routed"
	if s.Begin {
		msg = "pgryw: transaction routed"
	}
	attrs := [6]slog.Attr{
		slog.String("node", s.Addr),
		slog.String("role", s.Role.String()),
		slog.String("route", s.Route.String()),
	}
	k := 3
	if s.Fallback != FallbackNone {
		attrs[k] = slog.String("fallback", s.Fallback.String())
		k++
	}
	if s.Wait > 0 {
		attrs[k] = slog.Duration("wait", s.Wait)
		k++
	}
	if s.Stale {
		attrs[k] = slog.Bool("stale", true)
		k++
	}
	if l := c.logger(); l != nil {
		l.LogAttrs(ctx, slog.LevelDebug, msg, attrs[:k]...)
	}
}

// debug reports whether the connector logs at Debug, so that callers build
// a line's attributes only when it will be written.
func (c *Connector) debug() bool { return c.debugCtx(context.Background()) }

func (c *Connector) debugCtx(ctx context.Context) bool {
	l := c.logger()
	return l != nil && l.Enabled(ctx, slog.LevelDebug)
}

// noteHealth looks at n's state and, when it changed since it was last
// looked at, logs the change: down, refusing and not a standby at Warn
// (a writer candidate first seen out of recovery at Info: most likely the
// writer), up and a standby again at Info. It is the one place node state
// changes are logged, whoever noticed them (a read, the monitor).
func (c *Connector) noteHealth(n *node) {
	h := n.health(time.Now().UnixNano())
	old := Health(n.obs.health.Swap(uint32(h)))
	if old == h {
		return
	}
	role := RoleReplica
	if n.index < 0 {
		role = RolePrimary
	}
	node, r := slog.String("node", n.addr), slog.String("role", role.String())
	if n.candidate {
		r = slog.String("role", "writer candidate")
	}
	switch h {
	case HealthUp:
		if old == HealthNotStandby {
			c.logAt(slog.LevelInfo, "pgryw: node is a standby again: reads may go to it", node, r)
			return
		}
		c.logAt(slog.LevelInfo, "pgryw: node up", node, r)
	case HealthDown:
		c.logAt(slog.LevelWarn, "pgryw: node down", node, r, slog.Int("failures", int(n.fails.Load())),
			slog.Duration("retry_in", time.Duration(n.retryAt.Load()-time.Now().UnixNano()).Round(time.Millisecond)))
	case HealthRefused:
		c.logAt(slog.LevelWarn, "pgryw: node refuses the session's transactions (a SERIALIZABLE default on a standby?)", node, r,
			slog.Duration("retry_in", time.Duration(n.downUntil.Load()-time.Now().UnixNano()).Round(time.Second)))
	case HealthForeign:
		c.logAt(slog.LevelError, "pgryw: node is a standby of another cluster (its system identifier is not the writer's): reads leave it alone",
			node, r, slog.Uint64("system_identifier", n.system.Load()), slog.Uint64("writer_system_identifier", c.sysID.Load()))
		return
	case HealthNotStandby:
		level := slog.LevelWarn
		if old == HealthUnknown && n.candidate {
			level = slog.LevelInfo // the writer, most likely
		}
		c.logAt(level, "pgryw: node is not in recovery (the writer, or promoted): no reads go to it", node, r)
	}
}

// logger returns the connector's logger, or nil when none is set.
func (c *Connector) logger() *slog.Logger { return c.log.Load() }

// logAt writes one line at level when a logger is set and enabled for it.
// Callers pass attributes, never statement text, arguments or passwords.
func (c *Connector) logAt(level slog.Level, msg string, attrs ...slog.Attr) {
	l := c.logger()
	if l == nil || !l.Enabled(context.Background(), level) {
		return
	}
	l.LogAttrs(context.Background(), level, msg, attrs...)
}

// SetLogger replaces the connector's logger (Config.Logger); nil stops
// logging.
func (c *Connector) SetLogger(l *slog.Logger) { c.log.Store(l) }

// SetLogger sets the logger of a pool opened with sql.Open("pgryw", dsn),
// which has no Config to carry one. It takes a connection from the pool
// (opening one if none is idle) to reach pgryw's connector, and fails for a
// pool of another driver.
func SetLogger(db *sql.DB, l *slog.Logger) error {
	c, err := connectorOf(db)
	if err != nil {
		return err
	}
	c.SetLogger(l)
	return nil
}
