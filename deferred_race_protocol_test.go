package pgryw_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgryw/pgryw"
)

// session_scope=db: a write on one connection returns before its capture's
// answer (deferred.go), and the pending capture is what makes a read on
// another connection of the pool wait for it. When some other goroutine
// settles that capture (the writing connection's next statement, the
// monitor's settleInflight, another reader), the capture must not leave
// the pool's set of pending captures before its position is in the pool's
// watermark: a read that looks at the set in between finds nothing pending
// and nothing lost, and is served against the watermark from before the
// write, without a check. Here the settling goroutine is held right after
// it has taken the capture out of the set and before it raises the
// watermark (the primary-position history it records the position in is
// locked), and a read on the other connection runs meanwhile: it must see
// the write (here: wait for the standby, which never gets there, and fall
// back to the writer), not the standby's old row.
func TestProtocolSettledCaptureCoversPoolUntilApplied(t *testing.T) {
	t.Parallel()
	pc := newProtoCluster(t, "15.4", "wait_timeout=100ms")
	pc.db.SetMaxOpenConns(2)
	ctx := context.Background()
	writer, err := pc.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	reader, err := pc.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()

	// The write returns at its own ReadyForQuery; its capture's answer is
	// held back, so the capture stays pending (for the pool's watermark).
	pc.w.mu.Lock()
	pc.w.holdCapture, pc.w.release = true, make(chan struct{})
	pc.w.mu.Unlock()
	release := pgryw.HoldPositionHistory(pc.c)
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	if _, err := writer.ExecContext(ctx, protoInsert, 1); err != nil {
		t.Fatal(err)
	}
	if wm := pgryw.PoolWatermark(pc.c); protoAt(wm) >= protoAt(protoLSN) {
		t.Fatalf("the pool's watermark is %s as the write returns: its capture was not left pending", wm)
	}
	// The capture's answer comes now; the writing connection's next
	// statement (or the monitor) takes it off the wire and settles it, and
	// stops where the position is recorded.
	pc.w.mu.Lock()
	pc.w.holdCapture = false
	close(pc.w.release)
	pc.w.mu.Unlock()
	// (The fake sends the held answer from a goroutine of its own: let it
	// go out before the next statement's answer.)
	time.Sleep(20 * time.Millisecond)
	settler := make(chan error, 1)
	go func() {
		var v string
		settler <- writer.QueryRowContext(ctx, protoReadWriter, 7).Scan(&v)
	}()
	time.Sleep(100 * time.Millisecond)

	// A read on the other connection, while the capture is being settled.
	type result struct {
		v   string
		sb  pgryw.ServedBy
		err error
	}
	readDone := make(chan result, 1)
	go func() {
		var r result
		r.err = reader.QueryRowContext(pgryw.WithServedBy(ctx, func(_ context.Context, s pgryw.ServedBy) { r.sb = s }), protoRead, 7).Scan(&r.v)
		readDone <- r
	}()
	time.Sleep(100 * time.Millisecond)
	release()
	released = true
	r := <-readDone
	if err := <-settler; err != nil {
		t.Fatal(err)
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Logf("read: %q, served %+v", r.v, r.sb)
	if r.v == "old" {
		t.Fatalf("a read on another connection of the pool, after the write returned, was served by the standby against watermark %X/%X (the write's is %s): it read the row from before the write",
			r.sb.Watermark>>32, uint32(r.sb.Watermark), protoLSN)
	}
}
