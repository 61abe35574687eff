package pgryw

import (
	"context"
	"sync/atomic"

	"github.com/pgryw/pgryw/internal/lsn"
)

// A session is whatever owns a read-your-writes watermark: each connection
// has one, and with session_scope=db the connector has one more shared by the
// whole pool. A committed write advances every watermark its connection
// answers to; a replica read waits for the highest of them. A read raises
// only its connection's watermark, to a position at or past everything it
// saw (monotonic reads): the pool's watermark moves with writes alone, so
// one session's reads never make another session wait.

// session is the watermark state of one scope.
type session struct {
	wm lsn.Watermark
	// lost counts commits (or, for a connection, reads) whose position is
	// not known: the capture failed, the connection broke, or the caller's
	// context ended while the answer was on its way. covered is the highest
	// lost count that a later capture is known to cover. While lost exceeds
	// covered, the next replica read captures a position first: a capture
	// sent after the lost event covers it. Counting, rather than a flag,
	// lets a capture that was already on its way when another connection
	// lost a position leave that loss pending.
	lost    atomic.Uint64
	covered atomic.Uint64
}

// markLost records a commit or read whose position is unknown.
func (s *session) markLost() { s.lost.Add(1) }

// pending returns the lost count to pass to cover once a capture sent after
// this call has returned, and whether any loss is still uncovered.
func (s *session) pending() (uint64, bool) {
	l := s.lost.Load()
	return l, l > s.covered.Load()
}

// cover records that a capture sent when lost was at seen has been applied
// to the watermark.
func (s *session) cover(seen uint64) {
	for {
		cur := s.covered.Load()
		if seen <= cur || s.covered.CompareAndSwap(cur, seen) {
			return
		}
	}
}

type ctxKey int

const (
	ctxPrimary ctxKey = iota
	ctxReplica
)

// WithPrimary returns a context that sends every statement run with it to the
// primary, whatever its classification. Use it for reads that must see other
// sessions' latest writes too.
func WithPrimary(ctx context.Context) context.Context {
	return context.WithValue(ctx, ctxPrimary, true)
}

func wantsPrimary(ctx context.Context) bool {
	v, _ := ctx.Value(ctxPrimary).(bool)
	return v
}

// WithReplica returns a context that sends reads run with it to a replica
// even on a connection pinned to the primary by session state, like a
// /* pgryw:replica */ comment; a statement that writes is refused with
// ErrReplicaHint. The read still waits for the session's watermark.
func WithReplica(ctx context.Context) context.Context {
	return context.WithValue(ctx, ctxReplica, true)
}

func wantsReplica(ctx context.Context) bool {
	v, _ := ctx.Value(ctxReplica).(bool)
	return v
}
