package pgryw

import (
	"context"
	"errors"
	"sync"
	"time"
)

// The monitor polls every replica's replay position in the background, so
// that reads find replicas already known to be caught up (and skip their
// check), replicas known to be hopelessly behind are not waited on, and a
// replica that was down is tried again once it answers. It holds one
// connection per replica and sends one small query to each per interval;
// it starts with the pool's first connection and stops when the pool is
// closed (database/sql calls Connector.Close from DB.Close).
const (
	monitorInterval = 100 * time.Millisecond
	monitorTimeout  = time.Second
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
	if c.plain || !c.cfg.ReadYourWrites && !c.topo.lag.on {
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

func (c *Connector) runMonitor(ctx context.Context) {
	defer close(c.mon.done)
	defer c.startSampler(ctx)() // max_replica_lag's primary sampler, stopped with the monitor
	conns := make([]*backend, len(c.topo.replicas))
	defer func() {
		for _, b := range conns {
			if b != nil {
				b.close()
			}
		}
	}()
	t := time.NewTicker(monitorInterval)
	defer t.Stop()
	for {
		for i, n := range c.topo.replicas {
			conns[i] = c.probe(ctx, n, conns[i])
			c.noteHealth(n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// probe polls one replica and returns the connection to keep for next time.
func (c *Connector) probe(ctx context.Context, n *node, b *backend) *backend {
	ctx, cancel := context.WithTimeout(ctx, monitorTimeout)
	defer cancel()
	if b == nil || b.closed() {
		dc, err := c.dial(ctx, n)
		if err != nil {
			if !errors.Is(ctx.Err(), context.Canceled) { // not the monitor stopping
				n.markDown()
			}
			return nil
		}
		b = newBackend(dc, n)
	}
	row, null, err := b.control(ctx, sqlPoll)
	if err != nil {
		if isRefusal(err) {
			// The session's defaults (SERIALIZABLE) cannot run there.
			n.markRefused()
			return b
		}
		b.close()
		n.markDown()
		return nil
	}
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
