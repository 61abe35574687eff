package pgryw

import (
	"runtime"
	"slices"
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
	lag     atomic.Int64 // replay lag, ns: a lower bound, or the upper one it was brought under (topology.bounds)
	lagAt   atomic.Int64 // when lag was measured, unix ns; 0 = never
	// lagHigh is an upper bound on the lag, ns, measured at lagHighAt
	// (0: none holds): where pollAt aims.
	lagHigh   atomic.Int64
	lagHighAt atomic.Int64
	waits     atomic.Int64 // reads waiting on this replica (max_waits, overload.go)
	// roundTrip is a quick round trip to the node, ns (0: none seen yet):
	// what a read on the primary takes when it falls back, for the
	// reserve a caller's deadline keeps for it (Connector.budget).
	roundTrip atomic.Int64
	// firstDelay is how long after a write a read's first check is sent
	// to this replica, ns (pace.go): learned from first checks, so that
	// about one in four finds the replica behind (unless capped at
	// paceMax).
	firstDelay atomic.Int64
	// pacing counts the reads in a pacing pause before their first check
	// (pace.go): the first sleeps on its thread, the others on timers.
	pacing atomic.Int32
	// waiting is the reads that wait for it to replay their watermarks
	// by polling: the monitor polls for them (monitor.go).
	waiting waitList
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

	// idle: a replica's server connections that no Conn holds, lent to
	// one for a read (Conn.replica) and given back when it returns to its
	// pool (Conn.releaseReplicas).
	idle lendPool
}

// lendPool is a replica's idle server connections: a Conn borrows one for
// its reads and gives it back when database/sql (or the Pool) takes the
// Conn back, so that a replica holds about as many connections as reads
// run on it at once, not one per Conn. Last in, first out: a Conn that
// reads again at once gets the connection it gave back, settings and all.
// It holds at most as many as the connector has Conns open, so the limits
// the application puts on its pool (idle connections, lifetime, idle
// time) bound the replicas' connections too: each Conn closed trims it.
// And a connection no Conn has borrowed for lentIdleTime is closed
// (expire, by the node's monitor): a burst of reads leaves no more
// connections behind than the reads after it use, even in a pool that
// keeps its own connections open.
type lendPool struct {
	mu     sync.Mutex
	idle   []*backend
	since  []time.Time // when each of idle was given back (monotonic)
	closed bool        // the connector closed: what comes back is closed
}

// lentIdleTime is how long a lent replica connection may wait, unborrowed,
// before it is closed.
const lentIdleTime = time.Minute

// get returns an idle connection of the node's up generation ups, or nil;
// those of an earlier one (opened before the node was last down) are
// closed on the way.
func (p *lendPool) get(ups uint32) *backend {
	for {
		p.mu.Lock()
		if len(p.idle) == 0 {
			p.mu.Unlock()
			return nil
		}
		b := p.idle[len(p.idle)-1]
		p.idle[len(p.idle)-1] = nil
		p.idle = p.idle[:len(p.idle)-1]
		p.since = p.since[:len(p.idle)]
		p.mu.Unlock()
		if b.current(ups) {
			return b
		}
		b.close()
	}
}

// put takes b back, or closes it once the connector is closed or when the
// pool already holds most idle connections.
func (p *lendPool) put(b *backend, most int) {
	p.mu.Lock()
	if p.closed || len(p.idle) >= most {
		p.mu.Unlock()
		b.close()
		return
	}
	p.idle = append(p.idle, b)
	p.since = append(p.since, time.Now())
	p.mu.Unlock()
}

// trim closes the idle connections beyond most, those given back longest
// ago first.
func (p *lendPool) trim(most int) {
	p.mu.Lock()
	n := len(p.idle) - max(most, 0)
	if n <= 0 {
		p.mu.Unlock()
		return
	}
	p.closeOldest(n)
}

// expire closes the idle connections given back before before, the
// oldest first (they are at the bottom: last in, first out).
func (p *lendPool) expire(before time.Time) {
	p.mu.Lock()
	n := 0
	for n < len(p.since) && p.since[n].Before(before) {
		n++
	}
	if n == 0 {
		p.mu.Unlock()
		return
	}
	p.closeOldest(n)
}

// closeOldest closes the n connections at the bottom of the pool. Call it
// with p.mu held; it releases it before closing them.
func (p *lendPool) closeOldest(n int) {
	old := slices.Clone(p.idle[:n])
	p.idle = append(p.idle[:0], p.idle[n:]...)
	clear(p.idle[len(p.idle):cap(p.idle)])
	p.since = append(p.since[:0], p.since[n:]...)
	p.mu.Unlock()
	for _, b := range old {
		b.close()
	}
}

// close closes every idle connection, and those given back later.
func (p *lendPool) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.drain()
}

// drain closes every idle connection.
func (p *lendPool) drain() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.since = nil, nil
	p.mu.Unlock()
	for _, b := range idle {
		b.close()
	}
}

// size is how many idle connections the pool holds.
func (p *lendPool) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
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
// (wire.Peer.Instance; 0: none known, which vouches for nothing) that reported
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
// transaction pooler), is another instance than the one seen, or either
// instance is unknown (0: the identity could not be read). An unknown
// identity is no identity: two zeros say nothing of being one server.
func (n *node) knownReplayOn(b *backend) lsn.LSN {
	if b.peer.TxPooled || b.peer.Instance == 0 {
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

const historySize = 256

// lagFresh bounds how old a lag measurement may be and still send reads to
// the primary without trying the replica.
const lagFresh = int64(time.Second)

// refusedBackoff is how long a replica that refused to start a transaction
// under the session's defaults is left out: the defaults come from the DSN,
// the role or the database, and rarely change.
const refusedBackoff = time.Minute

// markRefused leaves n out of reads for refusedBackoff.
func (n *node) markRefused() {
	n.downUntil.Store(time.Now().Add(refusedBackoff).UnixNano())
	n.obs.refusedUntil.Store(n.downUntil.Load())
}

// nodeEvent is what an attempt teaches about its node.
type nodeEvent uint8

// record applies what an attempt on n taught about it.
func (n *node) record(e nodeEvent) {
	switch e {
	case eventDown:
		n.markDown()
	case eventRefused:
		n.markRefused()
	case eventPromoted:
		n.notStandby.Store(true)
	}
}

// health returns n's state at now (unix ns), from what the routing code and
// the monitor recorded on it.
func (n *node) health(now int64) Health {
	if n.index >= 0 && n.foreign.Load() {
		return HealthForeign
	}
	if n.index >= 0 && n.notStandby.Load() {
		return HealthNotStandby
	}
	if n.down.Load() {
		return HealthDown // until the monitor's probe answers
	}
	switch until := n.downUntil.Load(); {
	case until <= now:
		return HealthUp
	case until == n.obs.refusedUntil.Load():
		return HealthRefused // the backoff is the refusal's, not a later failure's
	}
	return HealthDown
}

// fastPathOn reports whether captures on n may take the fast path.
func (n *node) fastPathOn() bool {
	until := n.fastOffUntil.Load()
	if until == 0 {
		return true
	}
	if time.Now().UnixNano() < until {
		return false
	}
	n.fastOffUntil.CompareAndSwap(until, 0)
	return true
}

// fastPathOff turns n's fast path off for fastCaptureOff, after which a
// probe must see it work again.
func (n *node) fastPathOff() {
	n.fastFails.Store(0)
	n.fastOffUntil.Store(time.Now().Add(fastCaptureOff).UnixNano())
	n.fastState.Store(fastUnknown)
}

// maxRoundTripSample caps one sample of sawRoundTrip: a long statement
// says nothing of the network.
const maxRoundTripSample = time.Second

// sawRoundTrip takes in a round trip of d to n: the estimate falls to a
// quicker one at once and rises towards a slower one by an eighth of the
// difference, so it follows what a quick read takes, not the slow ones.
func (n *node) sawRoundTrip(d time.Duration) {
	v := int64(min(max(d, 0), maxRoundTripSample))
	for {
		old := n.roundTrip.Load()
		next := v
		if old != 0 && v > old {
			next = old + (v-old)/8
		}
		if next == old || n.roundTrip.CompareAndSwap(old, next) {
			return
		}
	}
}
