package pgryw

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// newCatalogConnector returns a connector with one replica whose catalog
// worker dials through dial instead of a server.
func newCatalogConnector(t *testing.T, dial func(ctx context.Context, n *node, why dialFor) (driver.Conn, error)) *Connector {
	t.Helper()
	cfg, err := ParseDSN("host=primary.invalid user=app replicas=replica.invalid")
	if err != nil {
		t.Fatal(err)
	}
	c, err := newConnector(cfg, connHooks{})
	if err != nil {
		t.Fatal(err)
	}
	c.mon.closed = true
	c.dial = dial
	t.Cleanup(func() { c.Close() })
	return c
}

func (fc *funcCatalog) state() (pending, queued int, running bool) {
	fc.mu.RLock()
	defer fc.mu.RUnlock()
	return len(fc.pending), len(fc.queued), fc.running
}

// A primary that refuses connections is asked once per backoff period,
// about every name waiting, not once per statement or per name.
func TestCatalogFailureBackoff(t *testing.T) {
	var (
		mu    sync.Mutex
		dials []time.Time
	)
	c := newCatalogConnector(t, func(ctx context.Context, n *node, why dialFor) (driver.Conn, error) {
		if n.index >= 0 {
			t.Errorf("catalog dialled replica %s", n.addr)
		}
		mu.Lock()
		dials = append(dials, time.Now())
		mu.Unlock()
		return nil, errors.New("connection refused")
	})
	const backoff = 100 * time.Millisecond // catalogBackoffMin's part, shortened
	c.funcs.backoffMin = backoff
	start := time.Now()
	for time.Since(start) < backoff+40*time.Millisecond {
		for i := 0; i < 10; i++ {
			if c.funcReadOnly(fmt.Sprintf("f%d", i)) {
				t.Fatalf("f%d read-only without an answer", i)
			}
		}
		time.Sleep(time.Millisecond)
	}
	mu.Lock()
	got := append([]time.Time(nil), dials...)
	mu.Unlock()
	if len(got) != 2 || got[1].Sub(got[0]) < backoff {
		var at []time.Duration
		for _, d := range got {
			at = append(at, d.Sub(start).Round(time.Millisecond))
		}
		t.Fatalf("dials at %v; want two, %v apart", at, backoff)
	}
	c.Close()
	if _, _, running := c.funcs.state(); running {
		t.Fatal("worker still running after Close")
	}
}

// At most catalogMaxPending names wait, over one connection attempt; Close
// cancels the attempt and returns only once the worker has ended, after
// which no name starts another.
func TestCatalogPendingBoundAndClose(t *testing.T) {
	var (
		dials    atomic.Int32
		returned atomic.Bool
		started  = make(chan struct{})
		once     sync.Once
	)
	c := newCatalogConnector(t, func(ctx context.Context, n *node, why dialFor) (driver.Conn, error) {
		dials.Add(1)
		once.Do(func() { close(started) })
		<-ctx.Done()
		returned.Store(true)
		return nil, ctx.Err()
	})
	c.funcReadOnly("f0")
	<-started
	for i := 1; i < 3*catalogMaxPending; i++ {
		c.funcReadOnly(fmt.Sprintf("g%d", i))
	}
	if p, _, _ := c.funcs.state(); p != catalogMaxPending {
		t.Fatalf("%d names pending, want the bound %d", p, catalogMaxPending)
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d dials, want 1", n)
	}
	done := make(chan struct{})
	go func() { c.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	if !returned.Load() {
		t.Fatal("Close returned while the worker was still connecting")
	}
	if c.funcReadOnly("late"); dials.Load() != 1 {
		t.Fatal("a name after Close dialled")
	}
	if _, _, running := c.funcs.state(); running {
		t.Fatal("a worker started after Close")
	}
}

// The worker ends when idle and starts again for the next name.
func TestCatalogIdleWorkerEnds(t *testing.T) {
	var dials atomic.Int32
	c := newCatalogConnector(t, func(ctx context.Context, n *node, why dialFor) (driver.Conn, error) {
		dials.Add(1)
		return nil, errors.New("connection refused")
	})
	c.funcs.idle = 50 * time.Millisecond
	c.funcs.backoffMin = 50 * time.Millisecond
	c.funcReadOnly("f")
	deadline := time.Now().Add(2 * time.Second)
	for {
		if _, _, running := c.funcs.state(); !running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("idle worker did not end")
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.funcReadOnly("g")
	if _, _, running := c.funcs.state(); !running {
		t.Fatal("no worker started for a new name")
	}
	for dials.Load() < 2 {
		if time.Now().After(deadline.Add(catalogBackoffMin)) {
			t.Fatal("the new worker never asked")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Names no catalog can hold are writes at once, and never sent.
func TestCatalogBadNames(t *testing.T) {
	c := newCatalogConnector(t, func(ctx context.Context, n *node, why dialFor) (driver.Conn, error) {
		t.Error("dialled for a name no catalog holds")
		return nil, errors.New("no")
	})
	for _, f := range []string{"a\x00b", "\xff"} {
		if c.funcReadOnly(f) {
			t.Errorf("%q read-only", f)
		}
		if ro, ok := c.funcs.lookup(f); !ok || ro {
			t.Errorf("%q: known=%v read-only=%v, want a known write", f, ok, ro)
		}
	}
}

// topology.pick rotates through the replicas across the wrap of its uint32
// counter; on 32-bit platforms int(next) went negative past 2^31 and
// indexed out of range.
func TestPickWrapsAround(t *testing.T) {
	var top topology
	for i := 0; i < 3; i++ {
		top.replicas = append(top.replicas, &node{index: i, addr: fmt.Sprintf("r%d", i)})
	}
	for _, at := range []uint32{math.MaxUint32 - 2, math.MaxInt32 - 2} {
		top.next.Store(at)
		seen := map[int]int{}
		for k := 0; k < 12; k++ {
			r, hopeless := top.pick(0, 0, time.Second)
			if r == nil || hopeless {
				t.Fatalf("pick from next=%d: %v, hopeless=%v", at, r, hopeless)
			}
			seen[r.index]++
		}
		if len(seen) != 3 {
			t.Errorf("from next=%d, picks went to %v; want all three replicas", at, seen)
		}
	}
}
