package pgryw

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgryw/pgryw/internal/ctxsleep"
	"github.com/pgryw/pgryw/internal/lsn"
)

// sqlSystem is pgryw's own statement for the node's system identifier.
const (
	// sqlSystem is the node's system identifier, where the role may read
	// it (NULL where not: nothing is compared then). The monitor sends it
	// behind its probe of each replica, and once to the primary: a standby
	// of another cluster (a blue/green migration's, an old major
	// version's) has positions of another history, which say nothing of
	// this one.
	sqlSystem = "SELECT CASE WHEN pg_catalog.has_function_privilege('pg_catalog.pg_control_system()', 'EXECUTE')" +
		" THEN (SELECT s.system_identifier::pg_catalog.text FROM pg_catalog.pg_control_system() s) END"
)

// The monitor watches every replica in the background, one goroutine per
// node. With read_your_writes on it polls each replica's replay position,
// so that reads find replicas already known to be caught up (and skip their
// check), replicas known to be hopelessly behind are not waited on, and a
// promoted replica (or the writer, among the writer's candidate hosts) is
// seen not to be in recovery; it holds one connection per node and sends one
// small query to each per interval (per notStandbyInterval to a node that
// is not a standby, which may become one again), and more often while reads
// wait on the node (waitList): it polls for all of them. With read_your_writes off
// it sends nothing to a healthy replica. Either way it probes a node that
// failed (see node.markDown), after an exponential backoff, and brings it
// back into reads when it answers: reads never connect to a node known to be
// down. It starts with the pool's first connection and stops when the pool
// is closed (database/sql calls Connector.Close from DB.Close).
const (
	monitorInterval    = 100 * time.Millisecond
	notStandbyInterval = time.Second
	monitorTimeout     = time.Second
)

type monitor struct {
	once   sync.Once
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex // guards closed against a start racing Close
	closed bool
}

// startMonitor starts the monitor once, if there is anything to monitor.
func (c *Connector) startMonitor() {
	if c.plain {
		return
	}
	c.mon.once.Do(func() {
		c.mon.mu.Lock()
		defer c.mon.mu.Unlock()
		if c.mon.closed {
			return
		}
		ctx, cancel := context.WithCancel(context.Background())
		c.mon.cancel = cancel
		c.mon.done = make(chan struct{})
		go c.runMonitor(ctx)
	})
}

// Close implements io.Closer: it stops the background monitor and the
// catalog worker, and waits for both to close their connections. Open
// connections are closed by database/sql as usual.
func (c *Connector) Close() error {
	c.stopCatalog()
	c.mon.mu.Lock()
	if !c.mon.closed && c.clusterScope != nil {
		c.clusterScope.release()
	}
	c.mon.closed = true
	cancel, done := c.mon.cancel, c.mon.done
	c.mon.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	for _, n := range c.topo.replicas {
		n.idle.close()
	}
	return nil
}

func (c *Connector) runMonitor(ctx context.Context) {
	defer close(c.mon.done)
	defer c.startSampler(ctx)() // max_replica_lag's primary sampler, stopped with the monitor
	var wg sync.WaitGroup
	for _, n := range c.topo.replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.watch(ctx, n)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.settleInflight(ctx)
	}()
	wg.Wait()
}

// settleInflight settles, every monitorInterval, the captures of writes
// that returned before their positions arrived and that nothing has needed
// since (deferred.go): their positions teach the lag estimates when the
// primary was where.
func (c *Connector) settleInflight(ctx context.Context) {
	t := time.NewTicker(monitorInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sctx, cancel := context.WithTimeout(ctx, monitorTimeout)
		c.inflight.settle(sctx)
		cancel()
	}
}

// every is how often the monitor looks at each node.
func (c *Connector) every() time.Duration {
	if c.monitorEvery > 0 {
		return c.monitorEvery
	}
	return monitorInterval
}

// watch probes one node whenever it is due, until ctx ends, and logs what
// changed about it. While reads wait on the node (waitList) it probes at
// the cadence their nearest target needs, and wakes those it saw replayed.
func (c *Connector) watch(ctx context.Context, n *node) {
	w := watcher{c: c, n: n, kick: n.waiting.follow(), t: time.NewTimer(0), due: time.Now()}
	defer w.stop()
	for w.sleep(ctx) {
		probed := w.probe(ctx, time.Now())
		c.noteHealth(n)
		w.settle(probed)
		if n.notStandby.Load() || n.foreign.Load() || n.down.Load() {
			// Out of reads: its idle connections lead to a primary, to
			// another cluster, or nowhere.
			n.idle.drain()
		} else {
			n.idle.expire(time.Now().Add(-lentIdleTime))
		}
	}
}

// watcher is watch's state: the monitor's connection to its node, when it
// probes next and why.
type watcher struct {
	c    *Connector
	n    *node
	b    *backend
	last time.Time // the last probe
	t    *time.Timer
	due  time.Time     // when t fires
	next time.Duration // the monitor's own interval to the next probe
	soon time.Duration // the next probe is this close: slept precisely
	kick <-chan struct{}
}

// stop closes the watcher's connection and wakes the reads still waiting.
func (w *watcher) stop() {
	w.t.Stop()
	w.n.waiting.unfollow()
	if w.b != nil {
		w.b.close()
	}
}

// sleep waits until the next probe is due; false when ctx ended.
func (w *watcher) sleep(ctx context.Context) bool {
	if w.soon > 0 {
		// A Go timer would be late by up to a millisecond, which the
		// waiting reads would wait on top (see ctxsleep).
		return ctxsleep.Sleep(ctx, w.soon) == nil
	}
	for {
		select {
		case <-ctx.Done():
			return false
		case <-w.t.C:
			// The timer was set early by timerSlack: the rest is slept
			// precisely.
			if rest := time.Until(w.due); rest > 0 {
				return ctxsleep.Sleep(ctx, rest) == nil
			}
			return true
		case <-w.kick:
		}
		// A read began waiting: probe when its target may be there, if
		// that is sooner than planned.
		wm, k, ok := w.n.waiting.nearest()
		if !ok {
			continue
		}
		d := w.c.followDelay(w.n, wm, k)
		if !time.Now().Add(d).Before(w.due) {
			continue
		}
		if d < followAfter {
			return ctxsleep.Sleep(ctx, d) == nil
		}
		w.reset(d)
	}
}

// timerSlack is how much earlier than due the watcher's timer is set: a Go
// timer fires up to about a millisecond late, which every read waiting on
// the node would wait on top; the rest is slept precisely (ctxsleep).
const timerSlack = time.Millisecond

// reset makes the next probe due in d.
func (w *watcher) reset(d time.Duration) {
	w.due = time.Now().Add(d)
	if d > 2*timerSlack {
		d -= timerSlack
	}
	w.t.Reset(d)
}

// probe probes the node if it is due for one at now, and says whether it
// did; w.next is the monitor's own interval to the next one.
func (w *watcher) probe(ctx context.Context, now time.Time) (probed bool) {
	c, n := w.c, w.n
	w.next = c.every()
	switch {
	case n.down.Load():
		if wait := time.Duration(n.retryAt.Load() - now.UnixNano()); wait > 0 {
			w.next = min(wait, w.next)
			return false
		}
	case !c.cfg.ReadYourWrites && !c.topo.lag.on && !n.notStandby.Load():
		// read_your_writes=off without max_replica_lag: nothing of
		// pgryw's goes to a healthy replica.
		if w.b != nil {
			w.b.close()
			w.b = nil
		}
		return false
	case n.notStandby.Load() && now.Sub(w.last) < notStandbyInterval:
		return false
	}
	w.b, w.last = c.probe(ctx, n, w.b), now
	return true
}

// settle wakes the reads waiting on the node that the probe saw through,
// and sets when to probe next: at the monitor's interval, or sooner for
// the reads still waiting.
func (w *watcher) settle(probed bool) {
	n := w.n
	if probed {
		n.waiting.polled()
	}
	// Reads waiting on a node that did not answer, or that is out of
	// reads, are woken to find out for themselves.
	out := w.b == nil || !n.usable(time.Now().UnixNano())
	next := w.next
	w.soon = 0
	if wm, k, ok := n.waiting.wake(n.knownReplay(), out); ok {
		next = min(next, w.c.followDelay(n, wm, k))
		if next < followAfter {
			w.soon = next
		}
	}
	w.reset(next)
}

// pooledConnAge is how long the monitor keeps one connection to a node
// behind a pooler before it opens another: by time, not by probes, since
// it probes far more often while reads wait on the node.
const pooledConnAge = 2 * time.Second

// probe polls one node and returns the connection to keep for next time.
func (c *Connector) probe(ctx context.Context, n *node, b *backend) *backend {
	ctx, cancel := context.WithTimeout(ctx, monitorTimeout)
	defer cancel()
	if b = c.probeConn(ctx, n, b); b == nil {
		return nil
	}
	q := sqlPoll
	if b.major >= 19 {
		q = sqlRecovery
	}
	sent := time.Now().UnixNano()
	row, null, err := b.control(ctx, q)
	if err != nil {
		if isRefusal(err) {
			// The session's defaults (SERIALIZABLE) cannot run there.
			n.probeAnswered()
			n.markRefused()
			return b
		}
		b.close()
		if !errors.Is(ctx.Err(), context.Canceled) {
			n.probeFailed()
		}
		return nil
	}
	c.probed(ctx, n, b, row, null, sent)
	return b
}

// probeConn returns the monitor's connection to n, connecting anew when it
// has none, when it broke, or behind a pooler every pooledConnAge;
// nil when n cannot be reached.
func (c *Connector) probeConn(ctx context.Context, n *node, b *backend) *backend {
	if b != nil && b.peer.Unnamed {
		// Behind a pooler, a connection kept for good would see one
		// server for good (in session mode): a repointed pooler's new
		// server would go unseen.
		if b.probedSince == 0 {
			b.probedSince = time.Now().UnixNano()
		} else if time.Since(time.Unix(0, b.probedSince)) > pooledConnAge {
			b.close()
			b = nil
		}
	}
	if b != nil && !b.closed() {
		return b
	}
	if b != nil {
		b.close()
	}
	dc, err := c.dial(ctx, n, forMonitor)
	if err != nil {
		if !errors.Is(ctx.Err(), context.Canceled) { // not the monitor stopping
			n.probeFailed()
		}
		return nil
	}
	n.system.Store(0) // a new connection may reach another server: read it again
	return newBackend(dc, n)
}

// probed takes in a probe's answer, sent at sent: n answers, is or is not a
// standby, and has replayed what it says.
func (c *Connector) probed(ctx context.Context, n *node, b *backend, row []string, null []bool, sent int64) {
	r, err := parseRecovery(row, null)
	l, known := r.replay, r.known
	if cur, inst := n.replay.load(); err == nil && r.inRecovery && known && l < cur && inst == b.peer.Instance {
		// Within one standby's history replay only moves forward; a lower
		// position means the node was restarted, rebuilt or changed
		// timeline, and what we knew of it no longer holds. Forgotten
		// before the node is back in reads.
		n.replay.update(l, inst, true)
	}
	n.probeAnswered()
	n.downUntil.Store(0)
	if r.timeline != 0 {
		n.timeline.Store(r.timeline)
	}
	if err != nil || !r.inRecovery {
		n.notStandby.Store(true)
		return
	}
	n.notStandby.Store(false)
	c.checkSystem(ctx, n, b)
	if known && !n.foreign.Load() {
		c.topo.observe(n, b.peer.Instance, l, sent, time.Now().UnixNano())
	}
}

// checkSystem compares the system identifier of standby n (read over b,
// its monitor connection, the first time) with the writer's (read once, on
// a connection of its own): a mismatch keeps n out of reads, for good.
// Where the role may not read either, nothing is compared.
func (c *Connector) checkSystem(ctx context.Context, n *node, b *backend) {
	if n.system.Load() == 0 {
		row, null, err := b.control(ctx, sqlSystem)
		if err != nil || len(row) != 1 {
			return
		}
		sys := systemUnknown // the role may not read it: not asked again on this connection
		if !null[0] {
			if v, err := strconv.ParseUint(row[0], 10, 64); err == nil && v != 0 {
				sys = v
			}
		}
		n.system.Store(sys)
	}
	sys := n.system.Load()
	if sys == systemUnknown {
		return // nothing to compare: the writer is not asked
	}
	w := c.writerSystem(ctx)
	n.foreign.Store(w != 0 && sys != w)
}

// systemUnknown marks a node whose system identifier cannot be read.
const systemUnknown = ^uint64(0)

// writerSystem returns the writer's system identifier, asking it (at most
// once a second while it does not answer) when it is not known yet; 0 when
// unknown.
func (c *Connector) writerSystem(ctx context.Context) uint64 {
	if s := c.sysID.Load(); s != 0 || c.sysTried.Load() {
		return s
	}
	now := time.Now().UnixNano()
	if last := c.sysAsked.Load(); now-last < int64(time.Second) || !c.sysAsked.CompareAndSwap(last, now) {
		return 0
	}
	dc, err := c.dial(ctx, c.topo.primary, forPrimary)
	if err != nil {
		return 0
	}
	b := newBackend(dc, c.topo.primary)
	defer b.close()
	row, null, err := b.control(ctx, sqlSystem)
	switch {
	case err != nil || len(row) != 1:
	case null[0]:
		c.sysTried.Store(true) // the role may not know it
	default:
		if sys, err := strconv.ParseUint(row[0], 10, 64); err == nil && sys != 0 {
			c.sysID.CompareAndSwap(0, sys)
		}
	}
	return c.sysID.Load()
}

// waitList is the reads waiting for one replica to replay their watermarks
// by polling (before PostgreSQL 19, whose WAIT FOR sleeps on the server).
// The monitor's goroutine for the node polls for all of them, at the cadence
// the lag history predicts for the nearest target, and wakes each one whose
// target it saw replayed: one poll loop per replica, however many reads
// wait on it. A read woken this way reads without a check when the
// position was seen on the server instance its own connection reaches
// (node.knownReplayOn); any other wake is news for it to check itself.
type waitList struct {
	mu        sync.Mutex
	list      []*replayWaiter
	kick      chan struct{} // a read began waiting: the monitor resets its timer
	polls     int           // the monitor's polls for the reads waiting, since one was woken or the first came
	following atomic.Bool   // the node's monitor goroutine runs
}

// replayWaiter is one read in a waitList.
type replayWaiter struct {
	target lsn.LSN
	woken  chan struct{} // receives once, when the read is woken
}

// follow says the node's monitor goroutine runs from now on, and returns
// the channel on which waiting reads kick it.
func (w *waitList) follow() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.kick == nil {
		w.kick = make(chan struct{}, 1)
	}
	w.following.Store(true)
	return w.kick
}

// unfollow says the monitor goroutine has stopped, and wakes every read
// still waiting.
func (w *waitList) unfollow() {
	w.following.Store(false)
	w.wake(0, true)
}

// await waits until the monitor wakes the read, for at most d: it saw the
// replica replay target, or has news of the node (a failed probe, no longer
// a standby, left out of reads). followed is false at once when no monitor
// goroutine follows the node: the caller polls on its own then.
func (w *waitList) await(ctx context.Context, target lsn.LSN, d time.Duration) (followed bool, err error) {
	if !w.following.Load() {
		return false, nil
	}
	r := &replayWaiter{target: target, woken: make(chan struct{}, 1)}
	w.mu.Lock()
	if len(w.list) == 0 {
		w.polls = 0
	}
	w.list = append(w.list, r)
	kick := w.kick
	w.mu.Unlock()
	if !w.following.Load() {
		// Stopped meanwhile (unfollow stores false before it wakes the
		// list): nothing may wake r.
		w.remove(r)
		return false, nil
	}
	select {
	case kick <- struct{}{}:
	default:
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.woken:
		return true, nil
	case <-t.C:
	case <-ctx.Done():
		err = ctx.Err()
	}
	w.remove(r)
	return true, err
}

func (w *waitList) remove(r *replayWaiter) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if i := slices.Index(w.list, r); i >= 0 {
		w.list = slices.Delete(w.list, i, i+1)
	}
}

// wake wakes the reads whose targets are at or below replay, or all of
// them, and returns the nearest target of those left waiting.
func (w *waitList) wake(replay lsn.LSN, all bool) (nearest lsn.LSN, polls int, waiting bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	keep := w.list[:0]
	for _, r := range w.list {
		if all || r.target <= replay {
			r.woken <- struct{}{}
			continue
		}
		keep = append(keep, r)
	}
	clear(w.list[len(keep):])
	woke := len(keep) < len(w.list)
	w.list = keep
	if woke {
		w.polls = 0 // the replica moves: poll at the nearest target's pace again
	}
	return w.nearestLocked()
}

// nearest returns the nearest target waited for, and the monitor's polls
// for the list so far.
func (w *waitList) nearest() (nearest lsn.LSN, polls int, waiting bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.nearestLocked()
}

// nearestLocked is nearest, with w.mu held.
func (w *waitList) nearestLocked() (nearest lsn.LSN, polls int, waiting bool) {
	if len(w.list) == 0 {
		return 0, 0, false
	}
	for i, r := range w.list {
		if i == 0 || r.target < nearest {
			nearest = r.target
		}
	}
	return nearest, w.polls, true
}

// polled counts one of the monitor's polls for the reads waiting.
func (w *waitList) polled() {
	w.mu.Lock()
	if len(w.list) > 0 {
		w.polls++
	}
	w.mu.Unlock()
}
