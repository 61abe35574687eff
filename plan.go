package pgryw

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"time"

	"github.com/pgryw/pgryw/internal/sqlclass"
)

// The plan: where a statement outside a transaction of the front end's
// (database/sql's or pgx's), or such a transaction's BEGIN, runs, decided
// once, before anything is sent, from what was collected about it (its
// classification, the hints, the connection's pins and whether a block is
// open on it). The order is fixed: pass through (no replicas), refuse,
// force the primary, or a replica that has replayed the watermark. The
// executors (runPrimary, onReplica) run the plan; only they change its
// route afterwards, when the read falls back to the primary or a replica's
// refusal shows it writes.

// target is where a plan sends a statement.
type target uint8

const (
	targetPrimary target = iota
	targetReplica        // a replica that has replayed the session's watermark
	targetRefused        // a replica hint on a statement that must run on the primary
)

// plan is the decision for one statement. It is a small value on the
// caller's stack: planning allocates nothing.
type plan struct {
	target target
	// route is what ServedBy reports when the statement is served as
	// planned (RouteReplica or RouteReplicaHint for targetReplica).
	route Route
	// read: the statement only reads (Connector.readOnly).
	read bool
	// tried: a replica was tried first (set by fellBack).
	tried bool
}

// planInput is everything a plan depends on.
type planInput struct {
	read        bool // only reads: the classifier, the catalog, read_/write_functions
	node        bool // its answer depends on the node (node identity, node-local state)
	pin         bool // the statement itself pins the connection (session state)
	txControl   bool // BEGIN, COMMIT, SAVEPOINT … sent as a statement
	hintReplica bool // /* pgryw:replica */ or WithReplica(ctx)
	hintPrimary bool // /* pgryw:primary */ or WithPrimary(ctx)
	pinned      bool // session state lives on this connection's primary session
	inBlock     bool // an Exec'd transaction block is open on the primary

	// begin: a database/sql BeginTx, whose options follow.
	begin        bool
	readOnlyTx   bool
	serializable bool
}

// planStmt is the routing decision, a pure function (its whole table is in
// plan_test.go). Which replica, and whether it must be checked first, is
// topology.pick's part; whether the statement pins the connection is
// sqlclass.Result.Pin.
func planStmt(in planInput) plan {
	if in.begin {
		return planBegin(in)
	}
	p := plan{read: in.read}
	switch {
	case in.hintReplica && !in.read:
		p.target = targetRefused
		return p
	case in.read && !in.hintPrimary && !in.inBlock && (in.hintReplica || !in.pinned && !in.node):
		// A replica hint overrides pinning and a node-local answer: the
		// caller says the statement does not depend on this connection's
		// session state, or wants a replica's answer.
		p.target, p.route = targetReplica, replicaRoute(in.hintReplica)
		return p
	}
	p.route = primaryRoute(in)
	return p
}

// primaryRoute is the route of a statement planned for the primary, by the
// first reason that keeps it there.
func primaryRoute(in planInput) Route {
	switch {
	case in.inBlock || in.txControl:
		return RouteTransaction
	case in.pin:
		return RoutePinned
	case !in.read:
		return RouteWrite
	case in.hintPrimary:
		return RoutePrimaryHint
	case in.pinned:
		return RoutePinned
	}
	return RouteNodeLocal
}

// planBegin is planStmt for a database/sql BEGIN. A read-only transaction
// may run wholly on a replica, but not a serializable one: a standby
// refuses SERIALIZABLE ("cannot use serializable mode in a hot standby"),
// so it runs on the primary, where it means what it says.
func planBegin(in planInput) plan {
	p := plan{read: in.readOnlyTx}
	switch {
	case in.readOnlyTx && !in.serializable && !in.pinned && !in.hintPrimary && !in.inBlock:
		p.target, p.route = targetReplica, replicaRoute(in.hintReplica)
	case in.readOnlyTx && in.hintPrimary:
		p.route = RoutePrimaryHint
	case in.readOnlyTx && in.pinned:
		p.route = RoutePinned
	default:
		p.route = RouteTransaction
	}
	return p
}

func replicaRoute(hinted bool) Route {
	if hinted {
		return RouteReplicaHint
	}
	return RouteReplica
}

// fellBack is the route of a planned replica read that the executor moved
// to the primary: a fallback, or a write when a replica's refusal (25006)
// showed it writes.
func (p *plan) fellBack(wrote bool) {
	p.target, p.tried = targetPrimary, true
	if wrote {
		p.route, p.read = RouteWrite, false
		return
	}
	p.route = RouteFallback
}

// planFor collects a statement's inputs and plans it.
func (cn *Conn) planFor(ctx context.Context, cls *sqlclass.Result) plan {
	p := planStmt(planInput{
		read:        cn.c.readOnly(cls),
		node:        cls.Node,
		pin:         cls.Pin,
		txControl:   cls.Tx != sqlclass.TxNone,
		hintReplica: cls.Hint == sqlclass.HintReplica || wantsReplica(ctx),
		hintPrimary: cls.Hint == sqlclass.HintPrimary || wantsPrimary(ctx),
		pinned:      cn.pins != 0,
		inBlock:     !cn.primary.idle(),
	})
	if p.target == targetPrimary && p.read {
		cn.c.stats.primaryReads.Add(1) // pinned, hinted, node-local, or in a block
	}
	return p
}

// planForBegin collects a database/sql BEGIN's inputs and plans it.
func (cn *Conn) planForBegin(ctx context.Context, opts driver.TxOptions) plan {
	return planStmt(planInput{
		begin:        true,
		readOnlyTx:   opts.ReadOnly,
		serializable: sql.IsolationLevel(opts.Isolation) == sql.LevelSerializable,
		hintReplica:  wantsReplica(ctx),
		hintPrimary:  wantsPrimary(ctx),
		pinned:       cn.pins != 0,
		inBlock:      !cn.primary.idle(),
	})
}

// budget is how long a read may wait for a replica: wait_timeout, or, when
// the caller's deadline comes sooner, what is left of it less a reserve for
// what on_timeout does next (fallbackReserve). A wait that took the whole
// deadline would leave the primary read on_timeout=primary promises no time
// to run: a lag spike would turn into failed requests. 0 when nothing is
// left to wait with: a replica not known to have replayed the watermark is
// then given up at once (topology.rate).
func (c *Connector) budget(ctx context.Context) time.Duration {
	budget := c.cfg.WaitTimeout
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		if left = left - c.fallbackReserve(left); left < budget {
			budget = max(left, 0)
		}
	}
	return budget
}

// Reserve for the fallback, kept out of the caller's time left when its
// deadline bounds a wait: the most of reserveFloor, reserveRoundTrips of
// the primary's round trip as measured (node.roundTrip), and
// 1/reserveShare of the time left. Generous on purpose: a fallback read
// that misses the deadline fails the request, where a wait cut short only
// costs the primary one read.
const (
	reserveFloor      = 20 * time.Millisecond
	reserveRoundTrips = 4
	reserveShare      = 5
)

// fallbackReserve is the reserve for a caller with left until its deadline.
func (c *Connector) fallbackReserve(left time.Duration) time.Duration {
	rt := time.Duration(c.topo.primary.roundTrip.Load())
	return max(reserveFloor, reserveRoundTrips*rt, left/reserveShare)
}

type ctxKey int

// WithPrimary returns a context that sends every statement run with it to the
// primary, whatever its classification. Use it for reads that must see other
// sessions' latest writes too.
func WithPrimary(ctx context.Context) context.Context {
	return context.WithValue(ctx, ctxPrimary, true)
}

func wantsPrimary(ctx context.Context) bool {
	v, _ := ctx.Value(ctxPrimary).(bool)
	return v
}

// WithReplica returns a context that sends reads run with it to a replica
// even on a connection pinned to the primary by session state, like a
// /* pgryw:replica */ comment; a statement that writes is refused with
// ErrReplicaHint. The read still waits for the session's watermark.
func WithReplica(ctx context.Context) context.Context {
	return context.WithValue(ctx, ctxReplica, true)
}

func wantsReplica(ctx context.Context) bool {
	v, _ := ctx.Value(ctxReplica).(bool)
	return v
}

const (
	ctxPrimary ctxKey = iota
	ctxReplica
)

type sessionKey struct{}

// WithSession returns a context whose statements use s: committed writes
// advance it (as well as the connection's and the pool's watermarks) and
// replica reads wait for its position too.
func WithSession(ctx context.Context, s *Session) context.Context {
	return context.WithValue(ctx, sessionKey{}, s)
}

// SessionFrom returns the Session attached to ctx by WithSession, or nil.
func SessionFrom(ctx context.Context) *Session {
	s, _ := ctx.Value(sessionKey{}).(*Session)
	return s
}
