package pgryw

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/pgryw/pgryw/internal/lsn"
)

// TestPaceSettles: fed the outcomes of first checks sent at its delay
// against replay delays drawn from a distribution, a replica's first-check
// delay settles where about one check in four finds the replica behind,
// from below and from above, and stays within [0, paceMax].
func TestPaceSettles(t *testing.T) {
	us := int64(time.Microsecond)
	rng := rand.New(rand.NewPCG(1, 2))
	// replay 200–400 µs after the write, uniformly: its 75th percentile
	// is 350 µs.
	replay := func() int64 { return 200*us + rng.Int64N(200*us) }
	for _, start := range []int64{0, int64(paceMax)} {
		n := &node{}
		n.firstDelay.Store(start)
		for range 4000 {
			d := n.firstDelay.Load()
			res := waitOK
			if replay() > d {
				res = waitBehind
			}
			pacing{n: n, at: d, d: d, paced: true, waited: d > 0}.learn(res, nil)
		}
		misses, sum := 0, int64(0)
		const runs = 4000
		for range runs {
			d := n.firstDelay.Load()
			sum += d
			if d < 0 || d > int64(paceMax) {
				t.Fatalf("from %v: delay %v out of [0, %v]", time.Duration(start), time.Duration(d), paceMax)
			}
			res := waitOK
			if replay() > d {
				res = waitBehind
				misses++
			}
			pacing{n: n, at: d, d: d, paced: true, waited: d > 0}.learn(res, nil)
		}
		share := float64(misses) / runs
		if share < 0.18 || share > 0.32 {
			t.Errorf("from %v: %.2f of first checks found the replica behind, want about 0.25 (delay %v)",
				time.Duration(start), share, time.Duration(n.firstDelay.Load()))
		}
		// (Its steps are a 32nd of it down and three up: it wanders by
		// tens of microseconds around where it settles.)
		if mean := sum / runs; mean < 310*us || mean > 390*us {
			t.Errorf("from %v: delay settled at %v on average, want about 350µs", time.Duration(start), time.Duration(mean))
		}
	}
}

// TestPaceLearns: what moves the delay and what does not.
func TestPaceLearns(t *testing.T) {
	us := int64(time.Microsecond)
	n := &node{}
	n.firstDelay.Store(100 * us)
	p := pacing{n: n, at: 100 * us, d: 100 * us, paced: true}

	p.learn(waitBehind, nil)
	if d := n.firstDelay.Load(); d <= 100*us {
		t.Fatalf("behind: delay %v, want more than 100µs", time.Duration(d))
	}
	n.firstDelay.Store(100 * us)
	p.learn(waitOK, nil)
	if d := n.firstDelay.Load(); d >= 100*us {
		t.Fatalf("there on time: delay %v, want less than 100µs", time.Duration(d))
	}

	// A read sent well after the delay that finds the replica there, an
	// error, an outcome other than behind or there, a read not paced:
	// nothing moves.
	for _, q := range []struct {
		p   pacing
		res waitResult
		err error
	}{
		{pacing{n: n, at: 5000 * us, d: 100 * us, paced: true}, waitOK, nil},
		{p, waitBehind, errCheckLost},
		{p, waitTimeout, nil},
		{pacing{n: n}, waitBehind, nil},
	} {
		n.firstDelay.Store(100 * us)
		q.p.learn(q.res, q.err)
		if d := n.firstDelay.Load(); d != 100*us {
			t.Errorf("%+v, %v, %v: delay moved to %v", q.p, q.res, q.err, time.Duration(d))
		}
	}

	// A read sent long after its write that finds the replica behind: the
	// lag history's to follow, not the delay's.
	n.firstDelay.Store(100 * us)
	pacing{n: n, at: 50000 * us, d: 100 * us, paced: true}.learn(waitBehind, nil)
	if d := n.firstDelay.Load(); d != 100*us {
		t.Errorf("behind 50 ms after its write: delay moved to %v", time.Duration(d))
	}

	// After a sleep, a check sent late by however late the sleep woke is
	// still on time.
	n.firstDelay.Store(100 * us)
	pacing{n: n, at: 400 * us, d: 100 * us, paced: true, waited: true}.learn(waitOK, nil)
	if d := n.firstDelay.Load(); d >= 100*us {
		t.Errorf("there after a late wake: delay %v, want less than 100µs", time.Duration(d))
	}

	// A replica far behind pushes the delay to paceMax, not past it.
	n.firstDelay.Store(0)
	for range 1000 {
		pacing{n: n, paced: true}.learn(waitBehind, nil)
	}
	if d := n.firstDelay.Load(); d != int64(paceMax) {
		t.Errorf("always behind: delay %v, want %v", time.Duration(d), paceMax)
	}
}

// TestPaceFirst: the first check waits until the replica's delay after the
// write has passed, never longer than the delay, and not at all where the
// server waits, where the write is long done, where the replica has a
// steady lag, where max_waits reads pause already, or where the budget or
// the caller's deadline is near. (Bases in the future: the pause is then
// the delay whatever the test's own timing.)
func TestPaceFirst(t *testing.T) {
	c := &Connector{}
	cn := &Conn{c: c}
	n := &node{}
	b := &backend{node: n}
	delay := 300 * time.Microsecond
	n.firstDelay.Store(int64(delay))
	later := time.Now().Add(time.Minute).UnixNano()
	c.topo.hist.add(100, later, 1)
	poll := func() waiting {
		return waiting{cn: cn, b: b, method: WaitPoll, deadline: time.Now().Add(time.Second)}
	}

	w := poll()
	start := time.Now()
	p := w.paceFirst(context.Background(), 100)
	if took := time.Since(start); !p.paced || !p.waited || took < delay || took > delay+time.Second {
		t.Fatalf("just after the write: %+v after %v, want a pause of %v", p, took, delay)
	}
	if n.waits.Load() != 0 || n.pacing.Load() != 0 {
		t.Errorf("after the pause: %d max_waits places, %d pacing, want none", n.waits.Load(), n.pacing.Load())
	}

	// The connection's own write, its position still on its way, the
	// watermark unknown: from when its answer was in.
	cn.pending = &pendingCapture{at: later}
	w = poll()
	w.partial = true
	if p := w.paceFirst(context.Background(), 0); !p.paced || !p.waited {
		t.Errorf("own write just returned: %+v, want a pause", p)
	}
	cn.pending = &pendingCapture{} // a statement that wrote nothing
	if p := w.paceFirst(context.Background(), 0); p.paced {
		t.Errorf("after a statement that wrote nothing: %+v, want not paced", p)
	}
	cn.pending = nil

	// The write long done: paced, with no pause.
	c.topo.hist = history{}
	c.topo.hist.add(100, time.Now().Add(-time.Second).UnixNano(), 1)
	w = poll()
	if p := w.paceFirst(context.Background(), 100); !p.paced || p.waited {
		t.Errorf("a second after the write: %+v, want paced without a pause", p)
	}

	c.topo.hist = history{}
	c.topo.hist.add(100, later, 1)
	for name, w := range map[string]waiting{
		"server waits":   {cn: cn, b: b, method: WaitFor, serverWaits: true, deadline: time.Now().Add(time.Second)},
		"budget near":    {cn: cn, b: b, method: WaitPoll, deadline: time.Now().Add(delay)},
		"not in history": {cn: cn, b: b, method: WaitPoll, deadline: time.Now().Add(time.Second)},
		"no watermark":   {cn: cn, b: b, method: WaitPoll, deadline: time.Now().Add(time.Second)},
	} {
		wm := lsn.LSN(100)
		switch name {
		case "not in history":
			wm = 150
		case "no watermark":
			wm = 0
		}
		if p := w.paceFirst(context.Background(), wm); p.paced {
			t.Errorf("%s: %+v, want not paced", name, p)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), delay)
	defer cancel()
	w = poll()
	if p := w.paceFirst(ctx, 100); p.paced {
		t.Errorf("caller's deadline near: %+v, want not paced", p)
	}

	// A steady lag is the lag history's to wait for.
	n.lag.Store(int64(10 * time.Millisecond))
	n.lagAt.Store(time.Now().UnixNano())
	w = poll()
	if p := w.paceFirst(context.Background(), 100); p.paced {
		t.Errorf("steady lag: %+v, want not paced", p)
	}
	n.lagAt.Store(0)

	// max_waits reads pause already: go at once, and count no refusal.
	c.over.maxWaits = 1
	n.waits.Store(1)
	w = poll()
	if p := w.paceFirst(context.Background(), 100); p.paced {
		t.Errorf("max_waits reached: %+v, want not paced", p)
	}
	if r := c.stats.waitsRefused.Load(); r != 0 {
		t.Errorf("a pause gone without counted %d refused waits", r)
	}
}
