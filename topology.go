package pgryw

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgryw/pgryw/internal/lsn"
)

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
	if budget <= 0 || t.hopeless(r, wm, budget, clock()) {
		// (No budget: the caller's deadline left no time to wait.)
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
	first := sort.Search(h.n, func(i int) bool {
		v := h.lsn[(h.head+i)%historySize]
		return v > uint64(l) || !strict && v == uint64(l)
	})
	if first == h.n {
		return 0, false
	}
	return h.at[(h.head+first)%historySize], true
}

// lastAtOrBefore returns the time the primary was last seen at or before l,
// and false when it never was (as far as we know).
func (h *history) lastAtOrBefore(l lsn.LSN) (int64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	past := sort.Search(h.n, func(i int) bool { return h.lsn[(h.head+i)%historySize] > uint64(l) })
	if past == 0 {
		return 0, false
	}
	return h.at[(h.head+past-1)%historySize], true
}

// observe records that n had replayed p, by a poll sent at sent and
// answered by at, and what that says of its lag: if the primary was first
// seen past p at T, the replica is at least sent−T behind (the poll ran
// after sent: not at, which for a poll whose answer is read late, a
// trailing poll settled by the connection's next read, can be seconds
// after it ran); if it was last seen at or before p at T', at most at−T'
// (it has replayed that). Both hold as of sent, and count only when no
// poll sent later was taken in before. A lower bound is kept until a
// higher one or a contradicting upper bound comes, an upper bound until a
// lower one or a contradicting lower bound does, each for lagFresh after
// the last poll it was consistent with. With writes every few milliseconds on a
// replica 50 ms behind, the bounds from many polls close in on the lag,
// which is what predicts the next write's wait (pollAt).
func (t *topology) observe(n *node, inst uint64, p lsn.LSN, sent, at int64) {
	n.sawReplay(p, inst)
	if sent < max(n.lagAt.Load(), n.lagHighAt.Load()) {
		// A poll sent after this one was taken in already: what this
		// one says is older (a trailing poll settled late).
		return
	}
	lb, ub := int64(-1), int64(-1)
	if T, ok := t.hist.firstAfter(p, true); ok && sent > T {
		lb = sent - T
	}
	if T, ok := t.hist.lastAtOrBefore(p); ok {
		ub = max(at-T, 0)
	}
	n.bounds(lb, ub, sent)
}

// reached records that n was seen at or past target at time at (a wait
// succeeded). The lag can only have been as long as the time since the
// primary was first seen at target.
func (t *topology) reached(n *node, inst uint64, target lsn.LSN, at int64) {
	n.sawReplay(target, inst)
	if T, ok := t.hist.firstAfter(target, false); ok {
		n.bounds(-1, max(at-T, 0), at)
	}
}

// bounds takes in a lower bound lb and an upper bound ub on n's lag (-1:
// none) measured at at, as observe says. A lag of lagSteady or more is
// kept while the bounds allow it, even by a replica caught up with every
// position known (no lower bound); a shorter one is the latest lower
// bound, or 0 when caught up.
func (n *node) bounds(lb, ub, at int64) {
	n.lower(lb, ub, at)
	n.upper(lb, ub, at)
}

// lower is bounds' lower bound: the lag.
func (n *node) lower(lb, ub, at int64) {
	lo, loOK := n.lag.Load(), fresh(n.lagAt.Load(), at)
	steady := loOK && lo >= int64(lagSteady)
	switch {
	case lb >= 0 && (!steady || lb >= lo || ub >= 0 && lo > ub):
		n.setLag(lb, at)
	case ub >= 0 && loOK && lo > ub:
		n.setLag(ub, at) // the lag shrank: about ub now
	case !steady:
		n.setLag(0, at)
	default:
		// Still holds: measured again. Caught-up polls renew it too (a
		// rule renewing it only from polls that found the replica behind,
		// or whose upper bound was near it, doubled the polls per wait
		// under a steady 50 ms lag); a lag that is gone is dropped by the
		// first poll whose upper bound is under it.
		n.setLag(lo, at)
	}
}

// upper is bounds' upper bound: what pollAt aims at.
func (n *node) upper(lb, ub, at int64) {
	hi, hiOK := n.lagHigh.Load(), fresh(n.lagHighAt.Load(), at)
	switch {
	case ub >= 0 && (!hiOK || ub <= hi || lb >= 0 && hi < lb):
		n.lagHigh.Store(ub)
		n.lagHighAt.Store(at)
	case lb >= 0 && hiOK && hi < lb:
		n.lagHighAt.Store(0) // the lag grew past it
	case hiOK:
		n.lagHighAt.Store(at) // still holds
	}
}

// fresh reports whether a measurement taken at m (0: none) still holds at at.
func fresh(m, at int64) bool { return m != 0 && at-m <= lagFresh }

func (n *node) setLag(d, at int64) {
	n.lag.Store(d)
	n.lagAt.Store(at)
}

// pollAt returns when to ask n whether it has replayed wm: when it can be
// there at the earliest (eta, by the lower bound on the lag), or, for a
// steady lag (lagSteady), at its fresh upper bound when that is at most
// lagSpread later, where one poll finds it. Not later: a poll that finds
// it there wakes the read, so aiming further into the bounds would make
// the read wait past the replica's reaching wm. ok is false without a
// fresh lag or a known time for wm.
func (t *topology) pollAt(n *node, wm lsn.LSN) (at int64, ok bool) {
	eta, ok := t.eta(n, wm)
	if !ok {
		return 0, false
	}
	lo := n.lag.Load()
	hi := n.lagHigh.Load()
	if lo >= int64(lagSteady) && fresh(n.lagHighAt.Load(), time.Now().UnixNano()) && hi >= lo && hi-lo <= int64(lagSpread) {
		return eta + hi - lo, true
	}
	return eta, true
}

// lagSteady is the shortest lag bounds keep across polls that find less:
// a lag that long (an apply delay, a slow link) holds from one write to the
// next, and predicts when to poll; a shorter one comes and goes with each
// flush and checkpoint, and a read's own retries find it sooner than any
// prediction (a lower bound kept from the slowest recent write would hold
// every read back as long).
const lagSteady = 5 * time.Millisecond

// lagSpread is how close the lag's bounds must be for pollAt to aim at the
// upper one: a read waits at most this much longer than it must.
const lagSpread = 2 * time.Millisecond

// eta returns when n is expected to have replayed wm, by its last measured
// lag: wm was first seen on the primary at T, so n gets there at about T+lag
// (at the earliest while the lag is a lower bound; see bounds for when it
// is brought under an upper one). ok is false without a fresh lag or a
// known T.
func (t *topology) eta(n *node, wm lsn.LSN) (at int64, ok bool) {
	if !fresh(n.lagAt.Load(), time.Now().UnixNano()) {
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

// hopelessLimit names the bound that made pick give up on n: max_replica_lag
// when n is not known to be within it, else "" (its measured lag is too
// long for the budget).
func (c *Connector) hopelessLimit(n *node) string {
	if c.topo.lag.on && !c.topo.lag.allows(n, time.Now().UnixNano()) {
		return "max_replica_lag=" + c.cfg.MaxReplicaLag.String()
	}
	return ""
}

// lagBound is max_replica_lag as pick applies it. A replica is allowed when
// it is known to be within the bound:
//
//   - in bytes: the primary's latest sampled position, sampled within
//     lagFresh, minus the replica's last known replay position. The
//     replica's position only rises, so this is an upper bound of its
//     distance at the sample's time.
//   - in time: now minus when the primary was last sampled at or below the
//     replica's last known replay position (taken before that sample was
//     sent). The replica has everything the primary had then, so this is
//     an upper bound of its staleness now, and it grows by itself while
//     nothing new is learnt.
//
// Unknown (no sample yet, no replay position, the sample too old, the
// position older than the ring) is not allowed.
type lagBound struct {
	on      bool
	bytes   uint64
	dur     int64 // ns
	samples primarySamples
	skips   atomic.Int64 // replicas passed over
}

func (l *lagBound) init(b ReplicaLag) {
	l.on = !b.IsZero()
	l.bytes, l.dur = b.Bytes, int64(b.Duration)
	// Keep entries at least dur/64 apart, so the ring spans twice the
	// bound: a replica within the bound always finds its entry, at most
	// 1/64 of the bound older than the truth.
	l.samples.spacing = l.dur / 64
}

// allows reports whether n is known to be within the bound at now.
func (l *lagBound) allows(n *node, now int64) bool {
	p := n.knownReplay()
	if p == 0 {
		return false
	}
	if l.bytes > 0 {
		latest, at, ok := l.samples.latest()
		return ok && now-at <= lagFresh && (latest <= p || uint64(latest-p) <= l.bytes)
	}
	at, ok := l.samples.atOrBelow(p)
	return ok && now-at <= l.dur
}

// primarySamples is a ring of the primary's WAL positions (adjusted as
// captures are, see lsn.ReplayTarget), each with the time just before the
// query that read it was sent: the primary was at or below the position
// then.
type primarySamples struct {
	mu      sync.Mutex
	lsn     [sampleRing]lsn.LSN
	at      [sampleRing]int64
	n, head int
	spacing int64 // least time between two entries but the newest
}

// add records that the primary was at or below l at time at. The newest
// entry always holds the latest sample; older ones are kept spacing apart.
// A position below the newest means a new primary history: the ring starts
// over.
func (s *primarySamples) add(l lsn.LSN, at int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n > 0 {
		last := (s.head + s.n - 1) % sampleRing
		switch {
		case l < s.lsn[last]:
			s.n, s.head = 0, 0
		case l == s.lsn[last]:
			s.at[last] = at // the primary was still there: a later time bounds more
			return
		case s.n >= 2 && at-s.at[(s.head+s.n-2)%sampleRing] < s.spacing:
			s.lsn[last], s.at[last] = l, at
			return
		}
	}
	i := (s.head + s.n) % sampleRing
	if s.n < sampleRing {
		s.n++
	} else {
		s.head = (s.head + 1) % sampleRing
	}
	s.lsn[i], s.at[i] = l, at
}

// latest returns the newest sample.
func (s *primarySamples) latest() (lsn.LSN, int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == 0 {
		return 0, 0, false
	}
	i := (s.head + s.n - 1) % sampleRing
	return s.lsn[i], s.at[i], true
}

// atOrBelow returns the time of the newest sample at or below p.
func (s *primarySamples) atOrBelow(p lsn.LSN) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	above := sort.Search(s.n, func(i int) bool { return s.lsn[(s.head+i)%sampleRing] > p })
	if above == 0 {
		return 0, false
	}
	return s.at[(s.head+above-1)%sampleRing], true
}

// startSampler starts the primary sampler when max_replica_lag is set, and
// returns a function that waits for it to stop once ctx is done.
func (c *Connector) startSampler(ctx context.Context) (wait func()) {
	if !c.topo.lag.on {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var b *backend
		defer func() {
			if b != nil {
				b.close()
			}
		}()
		t := time.NewTicker(sampleInterval)
		defer t.Stop()
		for {
			b = c.samplePrimary(ctx, b)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() { <-done }
}

// samplePrimary reads the primary's position once on b (connecting first
// when needed) and returns the connection to keep for next time.
func (c *Connector) samplePrimary(ctx context.Context, b *backend) *backend {
	ctx, cancel := context.WithTimeout(ctx, monitorTimeout)
	defer cancel()
	if b == nil || b.closed() {
		dc, err := c.dial(ctx, c.topo.primary, forSampler)
		if err != nil {
			return nil
		}
		b = newBackend(dc, c.topo.primary)
	}
	sent := time.Now().UnixNano()
	l, err := capture(ctx, b)
	if err != nil {
		b.close()
		return nil
	}
	if c.sawPrimary(l) { // not an answer from a writer that has been replaced
		c.topo.lag.samples.add(l.lsn, sent)
	}
	return b
}
