package ctxsleep

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestSleep(t *testing.T) {
	if err := Sleep(context.Background(), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v", err)
	}
	if time.Since(start) > time.Second {
		t.Fatal("a cancelled sleep did not end at once")
	}
}

// A short sleep ends with the context too, and a sleep of nothing or less
// returns at once.
func TestShortSleep(t *testing.T) {
	for _, d := range []time.Duration{-time.Second, 0, 100 * time.Microsecond, Short} {
		start := time.Now()
		if err := Sleep(context.Background(), d); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < max(d, 0) || took > max(d, 0)+time.Second {
			t.Fatalf("Sleep(%v) took %v", d, took)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ctx, 100*time.Microsecond); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v", err)
	}
}

// Timer sleeps at least d, ends with the context, and returns at once for
// nothing or less.
func TestTimer(t *testing.T) {
	for _, d := range []time.Duration{-time.Second, 0, 100 * time.Microsecond, 2 * time.Millisecond} {
		start := time.Now()
		if err := Timer(context.Background(), d); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < max(d, 0) || took > max(d, 0)+time.Second {
			t.Fatalf("Timer(%v) took %v", d, took)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Timer(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := Timer(ctx, time.Hour); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > time.Second {
		t.Fatalf("got %v after %v", err, time.Since(start))
	}
}
