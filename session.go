package pgryw

import (
	"context"

	"github.com/pgryw/pgryw/internal/lsn"
)

// A session is whatever owns a read-your-writes watermark: each connection
// has one, and with session_scope=db the connector has one more shared by the
// whole pool. A committed write advances every watermark its connection
// answers to; a replica read waits for the highest of them.

// session is the watermark state of one scope.
type session struct {
	wm lsn.Watermark
	// lost is set when a write committed but its position could not be read
	// (the capture query failed). The next replica read must then capture a
	// position first: any later capture covers the lost commit.
	lost atomicBool
}

type ctxKey int

const (
	ctxPrimary ctxKey = iota
	ctxReplica
)

// WithPrimary returns a context that sends every statement run with it to the
// writer, whatever its classification. Use it for reads that must see other
// sessions' latest writes too.
func WithPrimary(ctx context.Context) context.Context {
	return context.WithValue(ctx, ctxPrimary, true)
}

func wantsPrimary(ctx context.Context) bool {
	v, _ := ctx.Value(ctxPrimary).(bool)
	return v
}

// WithReplica returns a context that sends reads run with it to a replica
// even on a connection pinned to the writer by session state, like a
// /* pgryw:replica */ comment; a statement that writes is refused with
// ErrReplicaHint. The read still waits for the session's watermark.
func WithReplica(ctx context.Context) context.Context {
	return context.WithValue(ctx, ctxReplica, true)
}

func wantsReplica(ctx context.Context) bool {
	v, _ := ctx.Value(ctxReplica).(bool)
	return v
}
