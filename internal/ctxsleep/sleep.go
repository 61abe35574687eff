// Package ctxsleep holds the one sleep pgryw and its tools use: it ends
// early, with the context's error, when the context does.
package ctxsleep

import (
	"context"
	"time"
)

// Sleep waits for d or until ctx is done, whichever comes first, and returns
// ctx.Err() in the second case.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
