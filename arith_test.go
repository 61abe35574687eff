package pgryw

// Unit tests for the pure arithmetic that the integration runs exercise only
// indirectly: the primary-position history, lag and ETA, replica choice, the
// insert-position page boundary, and the parsers of pgryw's own answers.

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgryw/pgryw/internal/lsn"
)

func TestHistoryRing(t *testing.T) {
	var h history
	if _, ok := h.firstAfter(10, false); ok {
		t.Fatal("empty history answered")
	}
	// Positions only rise: a lower or equal one is ignored.
	h.add(100, 1000, 1)
	h.add(100, 1001, 1)
	h.add(90, 1002, 1)
	h.add(200, 2000, 1)
	for _, c := range []struct {
		l      lsn.LSN
		strict bool
		at     int64
		ok     bool
	}{
		{50, false, 1000, true},
		{100, false, 1000, true},
		{100, true, 2000, true},
		{150, false, 2000, true},
		{200, false, 2000, true},
		{200, true, 0, false},
		{300, false, 0, false},
	} {
		at, ok := h.firstAfter(c.l, c.strict)
		if at != c.at || ok != c.ok {
			t.Errorf("firstAfter(%d, strict=%v) = %d, %v; want %d, %v", c.l, c.strict, at, ok, c.at, c.ok)
		}
	}
	// Past its size the ring forgets the oldest entries and stays sorted.
	var r history
	for i := 1; i <= historySize+50; i++ {
		r.add(lsn.LSN(i*10), int64(i), 1)
	}
	if r.n != historySize {
		t.Fatalf("%d entries, want %d", r.n, historySize)
	}
	if at, ok := r.firstAfter(0, false); !ok || at != 51 {
		t.Fatalf("oldest kept = %d, %v; want 51", at, ok)
	}
	if at, ok := r.firstAfter(lsn.LSN((historySize+50)*10-5), false); !ok || at != historySize+50 {
		t.Fatalf("newest = %d, %v", at, ok)
	}
	for i := 51; i < historySize+50; i++ {
		if at, _ := r.firstAfter(lsn.LSN(i*10), true); at != int64(i+1) {
			t.Fatalf("firstAfter(%d, strict) = %d, want %d", i*10, at, i+1)
		}
	}
}

func TestLagAndETA(t *testing.T) {
	var topo topology
	n := &node{index: 0}
	now := time.Now().UnixNano()
	ms := int64(time.Millisecond)
	topo.hist.add(100, now-50*ms, 1)
	topo.hist.add(200, now-20*ms, 1)
	// The replica is seen at 100 now; the primary was past 100 (at 200) 20 ms
	// ago: it is at least 20 ms behind.
	topo.observe(n, 0, 100, now, now)
	if got := n.lag.Load(); got != 20*ms {
		t.Fatalf("lag %v, want 20ms", time.Duration(got))
	}
	if n.knownReplay() != 100 {
		t.Fatalf("known replay %v", n.knownReplay())
	}
	// It gets to 200 at about the time the primary was there, plus the lag.
	eta, ok := topo.eta(n, 200)
	if !ok || eta != now-20*ms+20*ms {
		t.Fatalf("eta %v, %v", eta, ok)
	}
	// Hopeless: the ETA is further away than the budget.
	if topo.hopeless(n, 200, 20*time.Millisecond, now-15*ms) {
		t.Fatal("an ETA 15 ms away fits a 20 ms budget")
	}
	if !topo.hopeless(n, 200, 10*time.Millisecond, now-15*ms) {
		t.Fatal("an ETA 15 ms away does not fit a 10 ms budget")
	}
	// A position the primary was never seen at has no ETA.
	if _, ok := topo.eta(n, 300); ok {
		t.Fatal("eta for an unknown primary position")
	}
	// A wait that succeeded bounds the lag from above.
	topo.reached(n, 0, 200, now-10*ms)
	if got := n.lag.Load(); got != 10*ms {
		t.Fatalf("lag after reached %v, want 10ms", time.Duration(got))
	}
	// Caught up with every position known, a fresh lag is kept (the next
	// write's wait is predicted by it), within the bound the last position
	// gives: the primary was there 20 ms ago.
	topo.observe(n, 0, 200, now, now)
	if got := n.lag.Load(); got != 10*ms {
		t.Fatalf("lag after a caught-up poll %v, want 10ms kept", time.Duration(got))
	}
	topo.hist.add(300, now-ms, 1)
	topo.observe(n, 0, 300, now, now)
	if got := n.lag.Load(); got != ms {
		t.Fatalf("lag after a caught-up poll %v, want 1ms (the primary was at 300 1 ms ago)", time.Duration(got))
	}
	// A stale measurement gives no ETA, and is not kept.
	n.lagAt.Store(now - 2*lagFresh)
	if _, ok := topo.eta(n, 200); ok {
		t.Fatal("eta from a stale lag")
	}
	topo.observe(n, 0, 300, now, now)
	if got := n.lag.Load(); got != 0 {
		t.Fatalf("lag after a caught-up poll with a stale measurement %v, want 0", time.Duration(got))
	}
}

func TestPickReplica(t *testing.T) {
	mk := func(replays ...lsn.LSN) *topology {
		t := &topology{}
		for i, r := range replays {
			n := &node{index: i, addr: string(rune('a' + i))}
			n.replay.update(lsn.LSN(uint64(r)), 0, true)
			t.replicas = append(t.replicas, n)
		}
		return t
	}
	budget := time.Second
	// A replica known to be caught up wins; among several, they rotate.
	topo := mk(50, 200, 300)
	seen := map[int]bool{}
	for i := 0; i < 6; i++ {
		n, hopeless := topo.pick(150, 0, budget)
		if n == nil || hopeless || n.knownReplay() < 150 {
			t.Fatalf("pick = %+v, %v", n, hopeless)
		}
		seen[n.index] = true
	}
	if !seen[1] || !seen[2] || seen[0] {
		t.Fatalf("caught-up replicas picked: %v", seen)
	}
	// None caught up: the least behind.
	if n, _ := topo.pick(400, 0, budget); n == nil || n.index != 2 {
		t.Fatalf("least behind: %+v", n)
	}
	// Tried replicas are skipped; down or promoted ones are not usable.
	if n, _ := topo.pick(400, 1<<2, budget); n == nil || n.index != 1 {
		t.Fatalf("skipping 2: %+v", n)
	}
	topo.replicas[1].markDown()
	topo.replicas[2].notStandby.Store(true)
	if n, _ := topo.pick(400, 0, budget); n == nil || n.index != 0 {
		t.Fatalf("only 0 usable: %+v", n)
	}
	if n, _ := topo.pick(400, 1<<0, budget); n != nil {
		t.Fatalf("nothing usable: %+v", n)
	}
	// Every usable replica too far behind for the budget: the least behind,
	// marked hopeless.
	topo = mk(100, 150)
	now := time.Now().UnixNano()
	topo.hist.add(500, now-time.Millisecond.Nanoseconds(), 1)
	for _, n := range topo.replicas {
		n.setLag(int64(10*time.Second), now)
	}
	n, hopeless := topo.pick(500, 0, budget)
	if n == nil || !hopeless || n.index != 1 {
		t.Fatalf("hopeless pick = %+v, %v", n, hopeless)
	}
	if n, _ := (&topology{}).pick(1, 0, budget); n != nil {
		t.Fatal("no replicas, picked one")
	}
}

func TestAdjustInsertLSN(t *testing.T) {
	const bs = 8192
	for _, c := range []struct{ in, want lsn.LSN }{
		{0x3000100, 0x3000100},                    // mid-page: as is
		{0x3002018, 0x3002000},                    // short header after a page boundary
		{0x3000028, 0x3000000},                    // long header at a segment start
		{0x3002000, 0x3002000},                    // exactly at the boundary
		{0x3002017, 0x3002017},                    // inside the header's span, but not its end
		{lsn.LSN(1<<32 | 0x18), lsn.LSN(1 << 32)}, // across the 32-bit halves
	} {
		if got := adjustInsertLSN(c.in, bs); got != c.want {
			t.Errorf("adjustInsertLSN(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestParseCapture(t *testing.T) {
	b := &backend{node: &node{index: -1}}
	var s slot
	if b.injectCapture(&s); s.name != stmtCapture {
		t.Fatalf("first capture %s, want the whole %s", s.name, stmtCapture)
	}
	if _, err := b.parseCapture([]string{"0/3002018"}); err == nil {
		t.Fatal("a position alone was read before the block size was known")
	}
	p, err := b.parseCapture([]string{"0/3002018", "8192", "000000020000000000000003", ""})
	if err != nil || p != (primaryPos{lsn: 0x3002000, tli: 2}) {
		t.Fatalf("parseCapture = %+v, %v", p, err)
	}
	// Then the position alone, with the block size and timeline kept.
	p, err = b.parseCapture([]string{"0/3004018"})
	if err != nil || p != (primaryPos{lsn: 0x3004000, tli: 2}) {
		t.Fatalf("parseCapture of the position alone = %+v, %v", p, err)
	}
	// No function OID (NULL): the prepared statement.
	if b.injectCapture(&s); s.name != stmtCaptureLSN {
		t.Fatalf("capture %s once the block size is known, with no function OID", s.name)
	}
	// With one: the prepared statement until a probe saw the fast path
	// work on the node, then the fast path, until it fails.
	if _, err := b.parseCapture([]string{"0/3002018", "8192", "000000020000000000000003", "2852"}); err != nil {
		t.Fatal(err)
	}
	if b.injectCapture(&s); s.name != stmtCaptureLSN {
		t.Fatalf("capture %s before the fast path was probed", s.name)
	}
	b.node.fastState.Store(fastOK)
	inj := b.injectCapture(&s)
	if s.name != stmtCaptureFast || !inj.FunctionCall() || !bytes.Equal(s.msgs, []byte{'F', 0, 0, 0, 14, 0, 0, 0x0b, 0x24, 0, 0, 0, 0, 0, 0}) {
		t.Fatalf("capture %s %q, want a FunctionCall of OID 2852", s.name, s.msgs)
	}
	b.captureAnswered(inj, true)
	if b.injectCapture(&s); s.name != stmtCaptureLSN {
		t.Fatalf("capture %s after the fast path failed", s.name)
	}
	// For fastCaptureOff, then on again.
	if off := time.Until(time.Unix(0, b.node.fastOffUntil.Load())); off < fastCaptureOff-time.Second || off > fastCaptureOff {
		t.Fatalf("fast path off for %v, want %v", off, fastCaptureOff)
	}
	b.node.fastOffUntil.Store(time.Now().Add(-time.Millisecond).UnixNano())
	if b.injectCapture(&s); s.name != stmtCaptureLSN || b.node.fastState.Load() != fastUnknown {
		t.Fatalf("capture %s once the fast path's time off is over, before a probe", s.name)
	}
	b.node.fastState.Store(fastOK)
	if inj = b.injectCapture(&s); s.name != stmtCaptureFast {
		t.Fatalf("capture %s once a probe saw the fast path work again", s.name)
	}
	// Unanswered on broken connections: off after fastCaptureTries in a
	// row, an answer in between starting the count again.
	for i := range 2*fastCaptureTries - 2 {
		if i == fastCaptureTries-1 {
			b.captureAnswered(inj, false)
		}
		b.captureUnanswered(inj)
		if b.injectCapture(&s); s.name != stmtCaptureFast {
			t.Fatalf("capture %s after %d unanswered", s.name, i+1)
		}
	}
	b.captureUnanswered(inj)
	if b.injectCapture(&s); s.name != stmtCaptureLSN || b.node.fastState.Load() != fastUnknown {
		t.Fatalf("capture %s after %d unanswered in a row", s.name, fastCaptureTries)
	}
	for _, row := range [][]string{
		{"nope"},
		{"0/3000100", "8192"},
		{"0/3000100", "8192", "x"},
		{"0/3000100", "8192", "000000010000000000000003"}, // no OID column
		{"nope", "8192", "000000010000000000000003", ""},
		{"0/3000100", "0", "000000010000000000000003", ""},
		{"0/3000100", "-1", "000000010000000000000003", ""},
		{"0/3000100", "8k", "000000010000000000000003", ""},
		{"0/3000100", "8192", "000000000000000000000003", ""}, // timeline 0
		{"0/3000100", "8192", "00000001000000000000003", ""},  // 23 digits
		{"0/3000100", "8192", "0000000a0000000000000003", ""}, // lower case
		{"0/3000100", "8192", "+00000010000000000000003", ""},
		{"0/3000100", "8192", "000000010000000000000003", "-1"},
		{"0/3000100", "8192", "000000010000000000000003", "4294967296"},
	} {
		if _, err := b.parseCapture(row); err == nil {
			t.Errorf("parseCapture(%q) accepted", row)
		}
	}
}

func TestParsePoll(t *testing.T) {
	for _, c := range []struct {
		row                   []string
		null                  []bool
		replay                lsn.LSN
		known, recovery, fail bool
	}{
		{[]string{"0/3000100", "t"}, []bool{false, false}, 0x3000100, true, true, false},
		{[]string{"", "t"}, []bool{true, false}, 0, false, true, false}, // a standby that replayed nothing yet
		{[]string{"0/3000100", "f"}, []bool{false, false}, 0, false, false, false},
		{[]string{"", "f"}, []bool{true, false}, 0, false, false, false},
		{[]string{"garbage", "t"}, []bool{false, false}, 0, false, true, true},
		{[]string{"0/3000100"}, []bool{false}, 0, false, false, true},
	} {
		replay, known, recovery, err := parsePoll(c.row, c.null)
		if replay != c.replay || known != c.known || recovery != c.recovery || (err != nil) != c.fail {
			t.Errorf("parsePoll(%q, %v) = %v, %v, %v, %v", c.row, c.null, replay, known, recovery, err)
		}
	}
}

func TestWaitForAnswer(t *testing.T) {
	c := &Connector{}
	b := &backend{node: &node{index: 0}}
	for _, c2 := range []struct {
		row  []string
		want waitResult
		fail bool
	}{
		{[]string{"success"}, waitOK, false},
		{[]string{"timeout"}, waitTimeout, false},
		{[]string{"not in recovery"}, waitNotStandby, false},
		{[]string{"bogus"}, waitTimeout, true},
		{nil, waitTimeout, true},
	} {
		got, err := c.waitForAnswer(b, c2.row, 0x3000100)
		if got != c2.want || (err != nil) != c2.fail {
			t.Errorf("waitForAnswer(%q) = %v, %v", c2.row, got, err)
		}
	}
	if b.node.knownReplay() != 0x3000100 || !b.node.notStandby.Load() {
		t.Fatalf("node after answers: replay %v, notStandby %v", b.node.knownReplay(), b.node.notStandby.Load())
	}
}

func TestWaitForSQL(t *testing.T) {
	for _, c := range []struct {
		l    lsn.LSN
		d    time.Duration
		want string
	}{
		{0x3000100, 500 * time.Millisecond, "WAIT FOR LSN '0/03000100' WITH (MODE 'standby_replay', TIMEOUT '500ms', NO_THROW)"},
		{lsn.LSN(0x1F<<32 | 0xA), 0, "WAIT FOR LSN '1F/0000000A' WITH (MODE 'standby_replay', TIMEOUT '1ms', NO_THROW)"},
		{1, 90 * time.Microsecond, "WAIT FOR LSN '0/00000001' WITH (MODE 'standby_replay', TIMEOUT '1ms', NO_THROW)"},
	} {
		if got := waitForSQL(c.l, c.d); got != c.want {
			t.Errorf("waitForSQL(%v, %v) = %q", c.l, c.d, got)
		}
	}
}

func TestMajorVersion(t *testing.T) {
	for in, want := range map[string]int{"15.18 (Debian 15.18-0+deb12u1)": 15, "19devel": 19, "18.4": 18, "": 0, "x": 0} {
		if got := majorVersion(in); got != want {
			t.Errorf("majorVersion(%q) = %d, want %d", in, got, want)
		}
	}
}

func TestPolarSQL(t *testing.T) {
	got := polarSQL(OnTimeoutPrimary, 0x16B374D848, 500*time.Millisecond)
	want := "SET polar_consistency_mode = 'strict'; SET polar_proxy_wait_timeout_ms = 500; SET polar_xact_split_wait_lsn = '97500059720'"
	if got != want {
		t.Fatalf("polarSQL = %q\nwant       %q", got, want)
	}
	if got := polarSQL(OnTimeoutStale, 1, 0); got != "SET polar_consistency_mode = 'best_effort'; SET polar_proxy_wait_timeout_ms = 1; SET polar_xact_split_wait_lsn = '1'" {
		t.Fatalf("polarSQL(stale) = %q", got)
	}
}

// WAIT FOR's TIMEOUT: whole milliseconds, never 0 (PostgreSQL 19 rounds
// 0.5 ms or less to 0, which waits for ever), never above 2^31-1 (refused).
func TestWaitForMillis(t *testing.T) {
	for _, c := range []struct {
		budget time.Duration
		want   int64
	}{
		{0, 1}, {-time.Second, 1}, {400 * time.Microsecond, 1}, {500 * time.Microsecond, 1}, {1500 * time.Microsecond, 1},
		{200 * time.Millisecond, 200}, {time.Hour, 3600000},
		{(1<<31 - 1) * time.Millisecond, 1<<31 - 1}, {(1 << 31) * time.Millisecond, 1<<31 - 1}, {1 << 62, 1<<31 - 1},
	} {
		if got := waitForMillis(c.budget); got != c.want {
			t.Errorf("waitForMillis(%v) = %d, want %d", c.budget, got, c.want)
		}
		if sql := waitForSQL(1, c.budget); !strings.Contains(sql, fmt.Sprintf("TIMEOUT '%dms'", c.want)) {
			t.Errorf("waitForSQL: %s", sql)
		}
	}
}

// pollAt aims at the eta, or at the lag's upper bound once the bounds are
// close; bounds from polls replace weaker ones only when they contradict.
func TestPollAtAndLagBounds(t *testing.T) {
	var topo topology
	n := &node{index: 0}
	now := time.Now().UnixNano()
	ms := int64(time.Millisecond)
	topo.hist.add(100, now-5*ms, 1)
	n.setLag(10*ms, now)
	if at, ok := topo.pollAt(n, 100); !ok || at != now+5*ms {
		t.Fatalf("pollAt with no upper bound = now%+v, %v; want the eta, 5ms from now", time.Duration(at-now), ok)
	}
	n.lagHigh.Store(20 * ms)
	n.lagHighAt.Store(now)
	if at, _ := topo.pollAt(n, 100); at != now+5*ms {
		t.Fatalf("pollAt = now%+v; want the eta while the bounds are far apart", time.Duration(at-now))
	}
	// A poll finds it behind: the lower bound rises to 14 ms, the upper
	// comes down to the poll's 15 ms.
	topo.hist.add(200, now-4*ms, 1)
	topo.observe(n, 0, 100, now+10*ms, now+10*ms)
	if lo, hi := n.lag.Load(), n.lagHigh.Load(); lo != 14*ms || hi != 15*ms {
		t.Fatalf("bounds %v..%v after a poll found it behind, want 14ms..15ms", time.Duration(lo), time.Duration(hi))
	}
	n.lagHigh.Store(14*ms + int64(lagSpread)/2)
	if at, _ := topo.pollAt(n, 100); at != now-5*ms+14*ms+int64(lagSpread)/2 {
		t.Fatalf("pollAt = now%+v; want the upper bound once the bounds are close", time.Duration(at-now))
	}
	// A poll finding it behind by more than the upper bound replaces it
	// with its own: the primary was at 100 35 ms before.
	topo.observe(n, 0, 100, now+30*ms, now+30*ms)
	if got := n.lagHigh.Load(); got != 35*ms {
		t.Fatalf("upper bound %v after a lower bound above it, want the poll's own 35ms", time.Duration(got))
	}
	// Caught up, a weaker lower bound does not replace a fresh one, nor a
	// weaker upper bound a fresh one.
	topo.observe(n, 0, 200, now+31*ms, now+31*ms)
	if lo, hi := n.lag.Load(), n.lagHigh.Load(); lo != 34*ms || hi != 35*ms {
		t.Fatalf("bounds %v..%v, want 34ms..35ms kept", time.Duration(lo), time.Duration(hi))
	}
}

// A waitList wakes the reads whose targets were replayed and keeps the
// others, counts the monitor's polls only while reads wait, and wakes
// everything when the monitor stops; with no monitor following, a read is
// told at once to poll on its own.
func TestWaitList(t *testing.T) {
	var w waitList
	ctx := context.Background()
	if followed, _ := w.await(ctx, 10, time.Second); followed {
		t.Fatal("await with no monitor following: followed")
	}
	kick := w.follow()
	w.polled() // nobody waits: not counted
	done := make(chan lsn.LSN, 2)
	for _, target := range []lsn.LSN{10, 20} {
		go func() {
			if followed, err := w.await(ctx, target, 10*time.Second); !followed || err != nil {
				t.Errorf("await(%v): %v, %v", target, followed, err)
			}
			done <- target
		}()
	}
	for {
		if _, _, n := w.nearest(); n {
			w.mu.Lock()
			k := len(w.list)
			w.mu.Unlock()
			if k == 2 {
				break
			}
		}
		time.Sleep(time.Millisecond)
	}
	// The kick holds one: a second read's kick while the first is unread
	// is dropped (the monitor reads the list itself).
	select {
	case <-kick:
	case <-time.After(10 * time.Second):
		t.Fatal("no kick from a read that began waiting")
	}
	w.polled()
	w.polled()
	if nearest, polls, ok := w.wake(15, false); !ok || nearest != 20 || polls != 0 {
		t.Fatalf("wake(15) = %v, %d, %v; want 20 left, polls reset by the wake", nearest, polls, ok)
	}
	if got := <-done; got != 10 {
		t.Fatalf("woken: %v, want 10", got)
	}
	w.polled()
	if _, polls, _ := w.nearest(); polls != 1 {
		t.Fatalf("polls %d, want 1", polls)
	}
	w.unfollow()
	if got := <-done; got != 20 {
		t.Fatalf("woken by unfollow: %v, want 20", got)
	}
	if _, _, ok := w.nearest(); ok {
		t.Fatal("reads left waiting after unfollow")
	}
}

// A poll's answer read late (a trailing poll settled by the connection's
// next read): the lower bound on the lag counts from when it was sent, and
// a poll sent before one already taken in says nothing new.
func TestLateObservation(t *testing.T) {
	var topo topology
	n := &node{index: 0}
	now := time.Now().UnixNano()
	ms := int64(time.Millisecond)
	topo.hist.add(100, now-50*ms, 1)
	topo.hist.add(200, now-48*ms, 1) // the primary past 100, 48 ms ago
	// Sent 46 ms ago (2 ms behind then), read now.
	topo.observe(n, 0, 100, now-46*ms, now)
	if got := n.lag.Load(); got != 2*ms {
		t.Fatalf("lag %v from a poll sent 2 ms after the primary passed its position, want 2ms", time.Duration(got))
	}
	// A later poll finds it caught up; an earlier one, read after it, is
	// not taken in.
	topo.observe(n, 0, 200, now-10*ms, now-9*ms)
	lag, at := n.lag.Load(), n.lagAt.Load()
	topo.observe(n, 0, 100, now-40*ms, now)
	if n.lag.Load() != lag || n.lagAt.Load() != at {
		t.Fatalf("an older poll moved the lag to %v (at %d), from %v (at %d)", time.Duration(n.lag.Load()), n.lagAt.Load(), time.Duration(lag), at)
	}
}

// A connection found to hold its reads' snapshot from their first statement
// keeps to unchained checks only under the same settings, and for a while.
func TestSnapshotHeld(t *testing.T) {
	var b backend
	if b.snapshotHeld(0) {
		t.Fatal("held before anything was seen")
	}
	b.holdSnapshot(7)
	if !b.snapshotHeld(7) || b.snapshotHeld(8) {
		t.Fatalf("held under version 7: %v, under 8: %v; want true, false", b.snapshotHeld(7), b.snapshotHeld(8))
	}
	b.snapHeld = time.Now().Add(-time.Millisecond).UnixNano()
	if b.snapshotHeld(7) {
		t.Fatal("still held after snapHeldFor")
	}
}

// A caller's deadline shorter than wait_timeout keeps a reserve for the
// fallback: the wait gets what is left less the most of the floor, four of
// the primary's round trips and a fifth of the time left; nothing when
// that leaves nothing, and then a replica not known to have replayed the
// watermark is given up at once (hopeless), one known to have is still
// ready.
func TestDeadlineBudget(t *testing.T) {
	c := &Connector{cfg: &Config{WaitTimeout: time.Second}, topo: topology{primary: &node{index: -1}}}
	within := func(got, want time.Duration) bool { return got <= want && got > want-5*time.Millisecond }
	if got := c.budget(context.Background()); got != time.Second {
		t.Errorf("no deadline: budget %v, want wait_timeout", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got := c.budget(ctx); got != time.Second {
		t.Errorf("a far deadline: budget %v, want wait_timeout", got)
	}
	for _, tc := range []struct {
		left, rt, want time.Duration
	}{
		{400 * time.Millisecond, 0, 320 * time.Millisecond},                       // a fifth of the time left
		{50 * time.Millisecond, 0, 30 * time.Millisecond},                         // the floor
		{50 * time.Millisecond, 6 * time.Millisecond, 26 * time.Millisecond},      // four round trips
		{15 * time.Millisecond, 0, 0},                                             // nothing left to wait with
		{1100 * time.Millisecond, 0, 880 * time.Millisecond},                      // still under wait_timeout
		{1500 * time.Millisecond, 300 * time.Millisecond, 300 * time.Millisecond}, // 1.5s − 4×0.3s
	} {
		c.topo.primary.roundTrip.Store(int64(tc.rt))
		ctx, cancel := context.WithTimeout(context.Background(), tc.left)
		got := c.budget(ctx)
		cancel()
		if !within(got, tc.want) && !(tc.want == 0 && got == 0) {
			t.Errorf("%v left, round trip %v: budget %v, want about %v", tc.left, tc.rt, got, tc.want)
		}
	}
	topo := &topology{}
	for i, r := range []lsn.LSN{100, 300} {
		n := &node{index: i}
		n.replay.update(r, 7, true)
		topo.replicas = append(topo.replicas, n)
	}
	if n, hopeless := topo.pick(200, 0, 0); n == nil || n.index != 1 || hopeless {
		t.Errorf("no budget, one replica caught up: %+v, hopeless %v", n, hopeless)
	}
	if n, hopeless := topo.pick(400, 0, 0); n == nil || !hopeless {
		t.Errorf("no budget, none caught up: %+v, hopeless %v, want hopeless", n, hopeless)
	}
	if n, hopeless := topo.pick(400, 0, time.Second); n == nil || hopeless {
		t.Errorf("a budget, lag unknown: %+v, hopeless %v, want one to wait on", n, hopeless)
	}
}

// The primary's round trip estimate falls to a quicker sample at once and
// rises by an eighth towards a slower one; one sample is capped.
func TestRoundTripEstimate(t *testing.T) {
	var n node
	n.sawRoundTrip(8 * time.Millisecond)
	if got := n.roundTrip.Load(); got != int64(8*time.Millisecond) {
		t.Fatalf("first sample: %v", time.Duration(got))
	}
	n.sawRoundTrip(time.Millisecond)
	if got := n.roundTrip.Load(); got != int64(time.Millisecond) {
		t.Fatalf("a quicker one: %v", time.Duration(got))
	}
	n.sawRoundTrip(9 * time.Millisecond)
	if got := n.roundTrip.Load(); got != int64(2*time.Millisecond) {
		t.Fatalf("a slower one: %v, want 2ms", time.Duration(got))
	}
	n.sawRoundTrip(time.Hour)
	if got := time.Duration(n.roundTrip.Load()); got > 2*time.Millisecond+maxRoundTripSample/8 {
		t.Fatalf("a long statement moved it to %v", got)
	}
}

// What a node was seen to replay holds for a connection only where both
// name the same server instance: an unknown instance (0) is no identity.
func TestKnownReplayOnUnknownInstance(t *testing.T) {
	n := &node{index: 0}
	n.replay.update(500, 0, true)
	b := &backend{node: n}
	if got := n.knownReplayOn(b); got != 0 {
		t.Errorf("both instances unknown: known replay %v, want none", got)
	}
	n.replay.update(500, 42, true)
	if got := n.knownReplayOn(b); got != 0 {
		t.Errorf("the connection's instance unknown: known replay %v, want none", got)
	}
	b.peer.Instance = 43
	if got := n.knownReplayOn(b); got != 0 {
		t.Errorf("another instance: known replay %v, want none", got)
	}
	b.peer.Instance = 42
	if got := n.knownReplayOn(b); got != 500 {
		t.Errorf("the same instance: known replay %v, want 500", got)
	}
	b.peer.TxPooled = true
	if got := n.knownReplayOn(b); got != 0 {
		t.Errorf("behind a transaction pooler: known replay %v, want none", got)
	}
}
