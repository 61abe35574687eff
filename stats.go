package pgryw

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"sync/atomic"
	"time"
)

// NodeStats is what one node (the primary or a replica) did for the
// connector's connections since the connector was created, and what is
// known of it now. Counters only grow.
type NodeStats struct {
	Addr string // host:port, as configured
	Host string
	Port uint16
	Role Role
	// Health is the node's state as pgryw sees it now.
	Health Health

	// Statements the node ran for the application: every statement,
	// including those inside transactions; not BEGIN, COMMIT or ROLLBACK
	// of database/sql transactions (see Transactions).
	Statements int64
	// Reads and Writes split Statements when the connector routes (it has
	// replicas): Writes may have written (or call a function not known to
	// be read-only), Reads did not (reads, and session or transaction
	// control). Without replicas nothing is classified and both stay 0.
	Reads, Writes int64
	// Transactions begun on the node through database/sql (BeginTx).
	Transactions int64
	// StaleReads: reads the replica served without having replayed the
	// session's watermark (on_timeout=stale).
	StaleReads int64

	// Waits: reads that waited for this replica to replay the session's
	// watermark (a WAIT FOR LSN or PolarDB wait, or polling after a failed
	// check), as Stats.Waits counts them; WaitTime holds their durations.
	Waits        int64
	WaitTimeouts int64 // waits whose budget ran out
	WaitTime     WaitHistogram

	// Fallbacks, on the primary: reads (and read-only transactions) it
	// served in place of a replica, by reason. Their total is
	// Stats.Fallbacks.
	Fallbacks FallbackCounts
	// Misses, on a replica: reads it did not serve as asked, by reason (it
	// was behind beyond the budget, whatever on_timeout then did; it could
	// not be reached or failed the read; it had been promoted; it refused
	// the transaction). Each went to another replica, to the primary, or
	// (on_timeout=error) failed.
	Misses FallbackCounts

	// Position is the node's last known WAL position in bytes (as
	// pg_wal_lsn_diff counts them): the primary's insert position last
	// read, a replica's replay position last seen. 0 when unknown.
	Position uint64
	// Lag is a replica's replay lag as last measured (a lower bound, from
	// this process's clock: how long the primary had been past the
	// position the replica reported), and LagAt when; LagAt is zero before
	// the first measurement.
	Lag   time.Duration
	LagAt time.Time
	// Timeline is a replica's timeline, of the last record it replayed,
	// as the monitor read it from pg_stat_recovery (PostgreSQL 19 and
	// later, for a role with pg_read_all_stats); 0 when unknown.
	Timeline uint32

	// Pinned, on the primary: connections whose reads stay there now
	// because of session state they hold (Stats.Pinned; Stats.PinnedBy
	// says why).
	Pinned int64
}

// Health is a node's state as pgryw sees it.
type Health uint8

// Node states.
const (
	HealthUnknown    Health = iota // not contacted yet
	HealthUp                       // answering
	HealthDown                     // a connect or a statement failed; left alone until a retry
	HealthRefused                  // refused the session's transactions (a SERIALIZABLE default on a standby); left alone for a minute
	HealthNotStandby               // a replica that says it is not in recovery (promoted); reads leave it alone
	HealthForeign                  // a standby of another cluster (its system identifier is not the writer's); reads leave it alone
)

var healthNames = [...]string{
	HealthUnknown:    "unknown",
	HealthUp:         "up",
	HealthDown:       "down",
	HealthRefused:    "refused",
	HealthNotStandby: "not a standby",
	HealthForeign:    "another cluster's standby",
}

// String names the state: "unknown", "up", "down", "refused", "not a
// standby".
func (h Health) String() string {
	if int(h) < len(healthNames) {
		return healthNames[h]
	}
	return "unknown"
}

// FallbackCounts counts reads by Fallback reason: counts[FallbackBehind] and
// so on (index FallbackNone stays 0).
type FallbackCounts [fallbackCount]int64

// Total returns the sum over all reasons.
func (f FallbackCounts) Total() int64 {
	var t int64
	for _, n := range f {
		t += n
	}
	return t
}

// WaitHistogram is a histogram of wait durations with fixed buckets:
// Counts[i] waits took at most Bounds[i] (and more than Bounds[i-1]);
// the last count, one longer than Bounds, holds the waits longer than
// every bound.
type WaitHistogram struct {
	Bounds []time.Duration
	Counts []int64
	Count  int64         // all waits
	Sum    time.Duration // their total duration
}

// waitBounds are the histogram's upper bounds: from a wait that a healthy
// replica ends within a round trip to the longest budgets.
var waitBounds = [...]time.Duration{
	250 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond,
	10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
}

// nodeObs holds a node's counters. Recording is a few atomic additions and
// allocates nothing.
type nodeObs struct {
	statements, reads, writes, transactions, staleReads atomic.Int64
	waits, waitTimeouts                                 atomic.Int64
	waitCounts                                          [len(waitBounds) + 1]atomic.Int64
	waitSum                                             atomic.Int64 // ns
	fallbacks, misses                                   [fallbackCount]atomic.Int64
	health                                              atomic.Uint32 // Health last noted (noteHealth)
	refusedUntil                                        atomic.Int64  // the downUntil markRefused set
}

// observeWait adds a wait of d to the histogram.
func (o *nodeObs) observeWait(d time.Duration) {
	i := 0
	for i < len(waitBounds) && d > waitBounds[i] {
		i++
	}
	o.waitCounts[i].Add(1)
	o.waitSum.Add(int64(d))
}

// NodeStats returns the counters and state of every node: the primary
// first, then the replicas in configuration order.
func (c *Connector) NodeStats() []NodeStats {
	out := make([]NodeStats, 0, 1+len(c.topo.replicas))
	out = append(out, c.nodeStats(c.topo.primary, RolePrimary))
	for _, r := range c.topo.replicas {
		out = append(out, c.nodeStats(r, RoleReplica))
	}
	return out
}

func (c *Connector) nodeStats(n *node, role Role) NodeStats {
	o := &n.obs
	h := n.health(time.Now().UnixNano())
	if h == HealthUp && Health(o.health.Load()) == HealthUnknown {
		h = HealthUnknown // never contacted: nothing says it is up
	}
	s := NodeStats{
		Addr: n.addr, Host: n.host, Port: n.port, Role: role, Health: h,
		Statements: o.statements.Load(), Reads: o.reads.Load(), Writes: o.writes.Load(),
		Transactions: o.transactions.Load(), StaleReads: o.staleReads.Load(),
		Waits: o.waits.Load(), WaitTimeouts: o.waitTimeouts.Load(),
		WaitTime: WaitHistogram{
			Bounds: append([]time.Duration(nil), waitBounds[:]...),
			Counts: make([]int64, len(o.waitCounts)),
			Sum:    time.Duration(o.waitSum.Load()),
		},
	}
	for i := range o.waitCounts {
		s.WaitTime.Counts[i] = o.waitCounts[i].Load()
		s.WaitTime.Count += s.WaitTime.Counts[i]
	}
	for i := range o.fallbacks {
		s.Fallbacks[i] = o.fallbacks[i].Load()
		s.Misses[i] = o.misses[i].Load()
	}
	if role == RolePrimary {
		s.Pinned = c.stats.pinned.Load()
		s.Position = uint64(c.topo.hist.latest())
	} else {
		s.Position = uint64(n.knownReplay())
		s.Timeline = n.timeline.Load()
		if at := n.lagAt.Load(); at != 0 {
			s.Lag, s.LagAt = time.Duration(n.lag.Load()), time.Unix(0, at)
		}
	}
	return s
}

// ConnectorOf returns the Connector behind a pool opened with
// sql.Open("pgryw", dsn) (or sql.OpenDB), for its Stats, NodeStats,
// SetLogger and SetServedBy. It takes a connection from the pool (opening
// one if none is idle) to reach it, and sees through wrappers whose
// connections have a Raw() driver.Conn method (such as otelsql). It fails
// for a pool of another driver. Keep the result: it does not change.
func ConnectorOf(db *sql.DB) (*Connector, error) { return connectorOf(db) }

// StatsOf returns the connector-wide counters of a pool opened with
// sql.Open("pgryw", dsn) (see ConnectorOf).
func StatsOf(db *sql.DB) (Stats, error) {
	c, err := connectorOf(db)
	if err != nil {
		return Stats{}, err
	}
	return c.Stats(), nil
}

// NodeStatsOf returns the per-node counters of a pool opened with
// sql.Open("pgryw", dsn) (see ConnectorOf).
func NodeStatsOf(db *sql.DB) ([]NodeStats, error) {
	c, err := connectorOf(db)
	if err != nil {
		return nil, err
	}
	return c.NodeStats(), nil
}

// Stats counts what the connector's connections did since it was created.
type Stats struct {
	ReplicaReads int64 // reads served by a replica
	PrimaryReads int64 // reads served by the primary (no replica usable, pinned, hinted, or fallback)
	Fallbacks    int64 // reads sent to the primary because a replica was behind, unreachable or promoted
	StaleReads   int64 // reads served by a replica behind the watermark (on_timeout=stale)
	BehindErrors int64 // reads that returned ErrReplicaBehind (on_timeout=error)
	Waits        int64 // reads that made a replica wait: a WAIT FOR, or polling after a failed check
	WaitTimeouts int64 // waits whose budget ran out (or that the replica cancelled: statement_timeout)
	// WaitRefusals counts waits a replica refused to start (PostgreSQL
	// 19's 55000: its session held a lock); each such read went to another
	// node, and the replica connection was closed.
	WaitRefusals    int64
	Captures        int64 // primary positions read after a commit
	CaptureFailures int64 // commits whose position could not be read (the next read re-captures)
	TokensClamped   int64 // Session positions beyond anything the primary had written, lowered to its position
	TokensRebased   int64 // Session positions from another primary generation, moved to the current one
	// SnapshotMoves counts read-only REPEATABLE READ transactions begun on
	// a replica that moved to the primary after their first statement had
	// taken their snapshot: the rest of each ran under the primary's
	// snapshot, taken at the move (docs/guarantees.md, "A read-only
	// REPEATABLE READ transaction that moves").
	SnapshotMoves int64
	// Pinned counts the connections pinned to the primary now: session
	// state they hold (an advisory lock, LISTEN, a temporary table...)
	// keeps their reads there until it is released.
	Pinned int64
	// PinnedBy counts pinned connections by reason ("advisory lock",
	// "LISTEN", "temporary table", "prepared statement", "cursor WITH
	// HOLD", "setting a standby refuses", "set_config with a computed
	// name", "LOAD or setseed", "state not read back yet"); a connection
	// may count under several. Reasons with no connection are left out.
	PinnedBy map[string]int64

	// Overload bounds (docs/overload.md).
	FallbackPeak     int64 // the most reads on the primary at once for lack of a fresh replica (what max_fallback bounds)
	FallbackWaits    int64 // such reads that found max_fallback reached and waited (on_max_fallback=wait)
	FallbacksRefused int64 // such reads that got no place on the primary: failed, or served stale, per on_max_fallback
	WaitPeak         int64 // the most reads waiting at once on one replica (what max_waits bounds)
	WaitsRefused     int64 // times a read found max_waits reads already waiting on a replica and did not wait there
	LagSkips         int64 // times a replica was passed over because it was not known to be within max_replica_lag
}

type counters struct {
	replicaReads, primaryReads, fallbacks, staleReads, behindErrors atomic.Int64
	waits, waitTimeouts, captures, captureFailures                  atomic.Int64
	waitFors                                                        atomic.Int64 // checks sent as WAIT FOR LSN
	waitRefusals                                                    atomic.Int64
	tokensClamped, tokensRebased                                    atomic.Int64
	snapshotMoves                                                   atomic.Int64
	pinned                                                          atomic.Int64
	pinnedBy                                                        [numPinReasons]atomic.Int64
	fallbackWaits, fallbacksRefused, waitsRefused                   atomic.Int64
	writerChanges                                                   atomic.Int64 // new timelines seen after the first
}

// Stats returns the connector's counters.
func (c *Connector) Stats() Stats {
	s := &c.stats
	st := Stats{
		ReplicaReads: s.replicaReads.Load(), PrimaryReads: s.primaryReads.Load(), Fallbacks: s.fallbacks.Load(),
		StaleReads: s.staleReads.Load(), BehindErrors: s.behindErrors.Load(), Waits: s.waits.Load(),
		WaitTimeouts: s.waitTimeouts.Load(), WaitRefusals: s.waitRefusals.Load(), Captures: s.captures.Load(), CaptureFailures: s.captureFailures.Load(),
		TokensClamped: s.tokensClamped.Load(), TokensRebased: s.tokensRebased.Load(), SnapshotMoves: s.snapshotMoves.Load(),
		Pinned: s.pinned.Load(), PinnedBy: map[string]int64{},
		FallbackPeak: c.over.fallback.peak.Load(), FallbackWaits: s.fallbackWaits.Load(),
		FallbacksRefused: s.fallbacksRefused.Load(), WaitPeak: c.over.waitPeak.Load(),
		WaitsRefused: s.waitsRefused.Load(), LagSkips: c.topo.lag.skips.Load(),
	}
	for i := range s.pinnedBy {
		if n := s.pinnedBy[i].Load(); n != 0 {
			st.PinnedBy[pinReasonNames[i]] = n
		}
	}
	return st
}

// connectorOf reaches the Connector behind a pool through one of its
// connections.
func connectorOf(db *sql.DB) (*Connector, error) {
	conn, err := db.Conn(context.Background())
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var c *Connector
	err = conn.Raw(func(dc any) error {
		// Wrappers (otelsql's, for one) hand out their own connections
		// and reach the driver's through Raw.
		for range 8 {
			w, ok := dc.(interface{ Raw() driver.Conn })
			if !ok {
				break
			}
			dc = w.Raw()
		}
		pc, ok := dc.(*Conn)
		if !ok {
			return ErrNotPgryw
		}
		c = pc.c
		return nil
	})
	return c, err
}
