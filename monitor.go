package pgryw

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// The monitor watches every replica in the background, one goroutine per
// node. With read_your_writes on it polls each replica's replay position,
// so that reads find replicas already known to be caught up (and skip their
// check), replicas known to be hopelessly behind are not waited on, and a
// promoted replica (or the writer, among the writer's candidate hosts) is
// seen not to be in recovery; it holds one connection per node and sends one
// small query to each per interval (per notStandbyInterval to a node that
// is not a standby, which may become one again). With read_your_writes off
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
	c.mon.closed = true
	cancel, done := c.mon.cancel, c.mon.done
	c.mon.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	return nil
}

// probeKey marks the monitor's contexts (tests tell its connections from
// reads' by it).
type probeKey struct{}

func (c *Connector) runMonitor(ctx context.Context) {
	defer close(c.mon.done)
	ctx = context.WithValue(ctx, probeKey{}, true)
	var wg sync.WaitGroup
	for _, n := range c.topo.replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.watch(ctx, n)
		}()
	}
	wg.Wait()
}

// watch probes one node whenever it is due, until ctx ends, and logs what
// changed about it.
func (c *Connector) watch(ctx context.Context, n *node) {
	var b *backend
	defer func() {
		if b != nil {
			b.close()
		}
	}()
	var seen nodeSeen
	var last time.Time // the last probe
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		next := monitorInterval
		switch {
		case n.down.Load():
			if wait := time.Duration(n.retryAt.Load() - now.UnixNano()); wait > 0 {
				next = min(wait, monitorInterval)
				break
			}
			b, last = c.probe(ctx, n, b), now
		case !c.cfg.ReadYourWrites && !n.notStandby.Load():
			// read_your_writes=off: nothing of pgryw's goes to a healthy
			// replica.
			if b != nil {
				b.close()
				b = nil
			}
		case n.notStandby.Load() && now.Sub(last) < notStandbyInterval:
		default:
			b, last = c.probe(ctx, n, b), now
		}
		c.report(n, &seen)
		t.Reset(next)
	}
}

// nodeSeen is what the monitor last logged about a node.
type nodeSeen struct {
	logged, down, notStandby bool
}

// report logs a node's changes of health and role since the last report, at
// Warn when it leaves reads and at Info when it comes back.
func (c *Connector) report(n *node, s *nodeSeen) {
	down, notStandby := n.down.Load(), n.notStandby.Load()
	first := !s.logged
	s.logged = true
	role := "replica"
	if n.candidate {
		role = "writer candidate"
	}
	if down != s.down || first && down {
		if down {
			c.logAt(slog.LevelWarn, "pgryw: node down: no reads go to it until it answers a probe",
				slog.String("node", n.addr), slog.String("role", role), slog.Int("failures", int(n.fails.Load())),
				slog.Duration("next_probe", time.Duration(n.retryAt.Load()-time.Now().UnixNano()).Round(time.Millisecond)))
		} else {
			c.logAt(slog.LevelInfo, "pgryw: node answers again", slog.String("node", n.addr), slog.String("role", role))
		}
	}
	if notStandby != s.notStandby || first && notStandby {
		if notStandby {
			level := slog.LevelWarn
			if first && n.candidate {
				level = slog.LevelInfo // the writer, most likely
			}
			c.logAt(level, "pgryw: node is not in recovery (the writer, or promoted): no reads go to it",
				slog.String("node", n.addr), slog.String("role", role))
		} else {
			c.logAt(slog.LevelInfo, "pgryw: node is a standby again: reads may go to it", slog.String("node", n.addr), slog.String("role", role))
		}
	}
	s.down, s.notStandby = down, notStandby
}

// probe polls one node and returns the connection to keep for next time.
func (c *Connector) probe(ctx context.Context, n *node, b *backend) *backend {
	ctx, cancel := context.WithTimeout(ctx, monitorTimeout)
	defer cancel()
	if b == nil || b.closed() {
		if b != nil {
			b.close()
		}
		dc, err := c.dial(ctx, n)
		if err != nil {
			if !errors.Is(ctx.Err(), context.Canceled) { // not the monitor stopping
				n.probeFailed()
			}
			return nil
		}
		b = newBackend(dc, n)
	}
	row, null, err := b.control(ctx, sqlPoll)
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
	n.probeAnswered()
	n.downUntil.Store(0)
	l, known, inRecovery, err := parsePoll(row, null)
	if err != nil || !inRecovery {
		n.notStandby.Store(true)
		return b
	}
	n.notStandby.Store(false)
	if known {
		// Within one standby's history replay only moves forward; a lower
		// position means the node was rebuilt or changed timeline, and what
		// we knew of it no longer holds.
		if l < n.knownReplay() {
			n.replay.Store(uint64(l))
		}
		c.topo.observe(n, l, time.Now().UnixNano())
	}
	return b
}
