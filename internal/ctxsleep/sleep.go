// Package ctxsleep holds the one sleep pgryw and its tools use: it ends
// early, with the context's error, when the context does.
package ctxsleep

import (
	"context"
	"time"
)

// Short is the longest sleep taken on the sleeping thread itself (see
// Sleep); 0 where there is no such sleep.
const Short = short

// Sleep waits for d or until ctx is done, whichever comes first, and returns
// ctx.Err() in the second case.
//
// A Go timer shorter than a millisecond fires about a millisecond late in a
// process with nothing else to run (the runtime's network poller waits in
// whole milliseconds on Linux), five times the 200 µs a replica poll means
// to wait. Where the operating system offers a precise sleep (Linux:
// nanosleep, late by the thread's timer slack, which it sets to 1 µs), a sleep up
// to Short takes it on the calling thread instead; the context is looked at
// before and after, so it is overrun by at most Short.
func Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	if d <= Short {
		threadSleep(d)
		return ctx.Err()
	}
	return timerSleep(ctx, d)
}

// Timer is Sleep on the runtime's timer, whatever d: for a sleep among
// many at once, where threads each sleeping would hold the runtime's
// processors (a thread in a system call keeps its processor until the
// runtime's monitor takes it back, up to milliseconds later), and where
// the process is busy enough to fire a timer on time: its processors
// look at their timers between goroutines.
func Timer(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	return timerSleep(ctx, d)
}

func timerSleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
