package pgryw

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgryw/pgryw/internal/lsn"
)

// node is what the connector knows about one server, shared by all its
// connections: where it is, the last replay position it reported, whether it
// answered, and whether it is still a standby. Every connection that talks to
// the node updates it, so one connection's wait teaches the others.
type node struct {
	index int // replica index; -1 for the primary
	addr  string
	host  string
	port  uint16
	// candidate: one of the writer's hosts in the DSN, tried as a replica
	// while it is a standby (and perhaps never listed in replicas).
	candidate bool

	// replay is the highest replay position seen on one server instance
	// of this node's address, and that instance.
	replay replaySeen
	// pooledSeen: a connection to the node met a server connection other
	// than its own between flushes (its prepared statement gone, or
	// someone else's there): new connections are treated as behind a
	// transaction pooler.
	pooledSeen atomic.Bool
	downUntil  atomic.Int64  // unix nanos; out of reads until then (refused the session's defaults)
	notStandby atomic.Bool   // reported not in recovery (or a promotion pending): promoted, or the writer
	timeline   atomic.Uint32 // of the last record it replayed, where the monitor could read it (PostgreSQL 19); 0: unknown
	// system: the node's system identifier as the monitor read it (0:
	// unknown); foreign: it is not the writer's, so the node is a standby
	// of another cluster and stays out of reads.
	system  atomic.Uint64
	foreign atomic.Bool
	lag     atomic.Int64 // lower bound on replay lag, ns (see history)
	lagAt   atomic.Int64 // when lag was measured, unix ns; 0 = never
	waits   atomic.Int64 // reads waiting on this replica (max_waits, overload.go)
	// fastFails counts fast-path captures (backend.injectCapture) left
	// unanswered by a connection that broke, since the last one answered.
	// An error answer, or fastCaptureTries of those, turns the node's fast
	// path off until fastOffUntil (unix nanos; 0: on): something between
	// pgryw and the server may not take FunctionCall messages. It comes
	// back on by itself, since connections also break for other reasons
	// (a failover breaks them all at once).
	fastFails    atomic.Int32
	fastOffUntil atomic.Int64
	// fastState: whether a fast-path capture was seen to get through to
	// this node and back (Conn.probeFastPath); captures take the fast path
	// only when fastOK. Back to fastUnknown when it fails.
	fastState atomic.Int32

	obs nodeObs // counters and last noted state (stats.go)

	// down: a connection or a query failed; out of reads until the
	// monitor's probe answers (reads never connect to a node known down).
	down    atomic.Bool
	fails   atomic.Int32 // failures in a row, for the probe backoff
	retryAt atomic.Int64 // unix nanos; when the monitor probes a down node next
	// probeMin is the first probe backoff (0: probeBackoffMin); tests
	// shorten it.
	probeMin time.Duration
	// ups counts the node's returns from down: a connection opened before
	// the last one most likely died with the server (see Conn.replica).
	ups atomic.Uint32
}

// node.fastState values.
const (
	fastUnknown int32 = iota
	fastProbing
	fastOK
)

// A failed node is probed after probeBackoffMin, and after each failure in a
// row twice as long as before, up to probeBackoffMax: a node that is down for
// good costs a connection attempt every few seconds, and one that comes back
// serves reads at most probeBackoffMax later.
const (
	probeBackoffMin = 100 * time.Millisecond
	probeBackoffMax = 5 * time.Second
)

// probeBackoff is how long a node that failed k times in a row (k ≥ 1)
// waits for its next probe.
func probeBackoff(k int32) time.Duration { return backoffFrom(probeBackoffMin, k) }

// backoffFrom is probeBackoff from first instead of probeBackoffMin.
func backoffFrom(first time.Duration, k int32) time.Duration {
	d := first
	for i := int32(1); i < k && d < probeBackoffMax; i++ {
		d *= 2
	}
	return min(d, probeBackoffMax)
}

// backoff is n's probeBackoff.
func (n *node) backoff(k int32) time.Duration {
	if n.probeMin > 0 {
		return backoffFrom(n.probeMin, k)
	}
	return probeBackoff(k)
}

// replaySeen is a replay position and the server instance
// (wire.Peer.Instance; 0: none known, as with pooler=none) that reported
// it, read together without a lock (a sequence lock: writers take mu and
// make seq odd while they write). What one instance replayed says nothing
// of another behind the same address (a pooler repointed, a DNS name
// moved).
type replaySeen struct {
	mu   sync.Mutex
	seq  atomic.Uint64
	inst atomic.Uint64
	pos  atomic.Uint64
}

// load returns the position and its instance, as one.
func (r *replaySeen) load() (lsn.LSN, uint64) {
	for {
		s := r.seq.Load()
		if s&1 == 0 {
			p, i := r.pos.Load(), r.inst.Load()
			if r.seq.Load() == s {
				return lsn.LSN(p), i
			}
		}
		runtime.Gosched()
	}
}

// update records position l of instance inst: the highest of that
// instance's (or exactly l, with lower), replacing another instance's.
func (r *replaySeen) update(l lsn.LSN, inst uint64, lower bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inst.Load() == inst && uint64(l) <= r.pos.Load() && !lower {
		return
	}
	r.seq.Add(1)
	r.inst.Store(inst)
	r.pos.Store(uint64(l))
	r.seq.Add(1)
}

// knownReplay returns the highest replay position seen on n: for choosing
// among replicas and for the lag, not for skipping a connection's check
// (knownReplayOn).
func (n *node) knownReplay() lsn.LSN {
	p, _ := n.replay.load()
	return p
}

// knownReplayOn returns what n is known to have replayed on the server
// that b's reads reach: nothing when that server may change under b (a
// transaction pooler) or is another instance than the one seen.
func (n *node) knownReplayOn(b *backend) lsn.LSN {
	if b.peer.TxPooled {
		return 0
	}
	p, inst := n.replay.load()
	if inst != b.peer.Instance {
		return 0
	}
	return p
}

// sawReplay records a replay position reported by n's server instance
// inst: a position of another instance than the last one replaces what
// was known.
func (n *node) sawReplay(l lsn.LSN, inst uint64) { n.replay.update(l, inst, false) }

func (n *node) usable(now int64) bool {
	return !n.notStandby.Load() && !n.foreign.Load() && !n.down.Load() && n.downUntil.Load() <= now
}

// usableBy is usable, reading the clock only for a node out of reads until
// some time.
func (n *node) usableBy(clock func() int64) bool {
	if n.notStandby.Load() || n.foreign.Load() || n.down.Load() {
		return false
	}
	until := n.downUntil.Load()
	return until == 0 || until <= clock()
}

// markDown records that a read found n failing (it could not connect, or
// its connection failed): n is out of reads until the monitor's probe
// answers, which it sends after the backoff. Reads that fail together count
// once.
func (n *node) markDown() {
	if n.down.Load() {
		return
	}
	n.retryAt.Store(time.Now().Add(n.backoff(n.fails.Load() + 1)).UnixNano())
	if n.down.CompareAndSwap(false, true) {
		n.fails.Add(1)
	}
}

// probeFailed records that the monitor's probe of n failed: the next one
// waits twice as long as the last.
func (n *node) probeFailed() {
	k := n.fails.Add(1)
	n.retryAt.Store(time.Now().Add(n.backoff(k)).UnixNano())
	n.down.Store(true)
}

// probeAnswered records that n answered the monitor's probe: a down node is
// back in reads, keeping its count of failures (a node that answers probes
// but fails every read is probed ever less often); a node that answers again
// while up has its count cleared. It reports whether n was down.
func (n *node) probeAnswered() bool {
	if n.down.Load() {
		n.ups.Add(1)
		n.down.Store(false)
		return true
	}
	if n.fails.Load() != 0 {
		n.fails.Store(0)
	}
	return false
}

// topology holds every node of one connector.
type topology struct {
	primary  *node
	replicas []*node
	next     atomic.Uint32 // rotates the starting replica between reads
	hist     history
	lag      lagBound // max_replica_lag (overload.go)
}

// pick chooses a replica for a read that needs the watermark wm: a usable
// replica already known to have replayed wm, rotating among those; else the
// usable replica known to be least behind among those whose measured lag
// lets them catch up within budget. When every usable replica is known to
// be too far behind, or not known to be within max_replica_lag, it returns
// the least behind of them with hopeless set.
// Replicas whose bit is set in tried are skipped. It returns nil when none
// is usable. It does not allocate.
func (t *topology) pick(wm lsn.LSN, tried uint64, budget time.Duration) (best *node, hopeless bool) {
	n := len(t.replicas)
	if n == 0 {
		return nil, false
	}
	// The clock is read only when something needs it: a replica out of
	// reads until some time, a lag bound, or one that has not replayed wm.
	var now int64
	clock := func() int64 {
		if now == 0 {
			now = time.Now().UnixNano()
		}
		return now
	}
	start := 0
	if n > 1 {
		// In uint32: on 32-bit platforms int(next) turns negative past
		// 2^31. Not with one replica: an atomic add on a word every
		// connection of the pool writes costs more than the read's
		// routing otherwise does.
		start = int(t.next.Add(1) % uint32(n))
	}
	var lost *node
	for k := 0; k < n; k++ {
		r := t.replicas[(start+k)%n]
		if tried&(1<<uint(r.index%64)) != 0 || !r.usableBy(clock) {
			continue
		}
		switch t.rate(r, wm, budget, clock) {
		case rateReady:
			return r, false
		case rateHopeless:
			lost = further(lost, r)
		default:
			best = further(best, r)
		}
	}
	if best == nil && lost != nil {
		return lost, true
	}
	return best, false
}

// A replica's rating for a read that needs a watermark.
const (
	rateBehind   = iota // it may catch up within the budget
	rateReady           // known to have replayed the watermark
	rateHopeless        // it will not catch up in time, or is not within max_replica_lag
)

// rate rates replica r for a read that needs wm within budget.
func (t *topology) rate(r *node, wm lsn.LSN, budget time.Duration, clock func() int64) int {
	if t.lag.on && !t.lag.allows(r, clock()) {
		// Not known to be within max_replica_lag: as good as hopeless.
		t.lag.skips.Add(1)
		return rateHopeless
	}
	if r.knownReplay() >= wm {
		return rateReady
	}
	if t.hopeless(r, wm, budget, clock()) {
		return rateHopeless
	}
	return rateBehind
}

// further returns whichever of best (perhaps nil) and r is known to have
// replayed further; best on a tie.
func further(best, r *node) *node {
	if best == nil || r.knownReplay() > best.knownReplay() {
		return r
	}
	return best
}

// history remembers when the primary was seen at which WAL positions (from
// captures and the monitor), so a replica's replay position can be turned
// into a lag in time: a replica that has replayed P, observed at t, while the
// primary was already past P at T, is at least t−T behind. All times are this
// process's clock; no server clocks are compared.
type history struct {
	mu   sync.Mutex
	tli  uint32 // the timeline the entries are on
	lsn  [historySize]uint64
	at   [historySize]int64
	n    int // entries used
	head int // index of the oldest entry
}

const historySize = 256

// add records that the primary was at l on timeline tli at time t. Positions
// only rise within a timeline; a later timeline (a new writer) starts the
// history afresh, and a position of an earlier one is ignored.
func (h *history) add(l lsn.LSN, t int64, tli uint32) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case tli > h.tli:
		h.tli, h.n, h.head = tli, 0, 0
	case tli < h.tli:
		return
	}
	if h.n > 0 {
		last := (h.head + h.n - 1) % historySize
		if uint64(l) <= h.lsn[last] {
			return
		}
	}
	var i int
	if h.n < historySize {
		i = (h.head + h.n) % historySize
		h.n++
	} else {
		i = h.head
		h.head = (h.head + 1) % historySize
	}
	h.lsn[i], h.at[i] = uint64(l), t
}

// latest returns the highest primary position recorded, or 0.
func (h *history) latest() lsn.LSN {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == 0 {
		return 0
	}
	return lsn.LSN(h.lsn[(h.head+h.n-1)%historySize])
}

// firstAfter returns the time the primary was first seen past l (strictly if
// strict, else at or past), and false when it never was (as far as we know).
func (h *history) firstAfter(l lsn.LSN, strict bool) (int64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	lo, hi := 0, h.n
	for lo < hi {
		mid := (lo + hi) / 2
		v := h.lsn[(h.head+mid)%historySize]
		if v > uint64(l) || !strict && v == uint64(l) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	if lo == h.n {
		return 0, false
	}
	return h.at[(h.head+lo)%historySize], true
}

// observe records that n had replayed p at time t and updates its lag.
func (t *topology) observe(n *node, inst uint64, p lsn.LSN, at int64) {
	n.sawReplay(p, inst)
	if T, ok := t.hist.firstAfter(p, true); ok && at > T {
		n.setLag(at-T, at)
	} else {
		n.setLag(0, at)
	}
}

// reached records that n was seen at or past target at time at (a wait
// succeeded). The lag can only have been as long as the time since the
// primary was first seen at target.
func (t *topology) reached(n *node, inst uint64, target lsn.LSN, at int64) {
	n.sawReplay(target, inst)
	if T, ok := t.hist.firstAfter(target, false); ok {
		if ub := at - T; ub < n.lag.Load() {
			n.setLag(max(ub, 0), at)
		}
	}
}

func (n *node) setLag(d, at int64) {
	n.lag.Store(d)
	n.lagAt.Store(at)
}

// lagFresh bounds how old a lag measurement may be and still send reads to
// the primary without trying the replica.
const lagFresh = int64(time.Second)

// eta returns when n is expected to have replayed wm, by its last measured
// lag: wm was first seen on the primary at T, so n gets there at about T+lag
// at the earliest. ok is false without a fresh lag or a known T.
func (t *topology) eta(n *node, wm lsn.LSN) (at int64, ok bool) {
	lagAt := n.lagAt.Load()
	if lagAt == 0 || time.Now().UnixNano()-lagAt > lagFresh {
		return 0, false
	}
	T, ok := t.hist.firstAfter(wm, false)
	if !ok {
		return 0, false
	}
	return T + n.lag.Load(), true
}

// hopeless reports that n, at its last measured lag, cannot replay wm within
// budget. Reads then do not hold a replica connection for the whole budget.
func (t *topology) hopeless(n *node, wm lsn.LSN, budget time.Duration, now int64) bool {
	eta, ok := t.eta(n, wm)
	return ok && eta-now > int64(budget)
}
