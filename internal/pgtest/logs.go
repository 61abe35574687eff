package pgtest

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// Logs is a slog.Handler that keeps every record as one line of text,
// "LEVEL message key=value ...", for tests to read.
type Logs struct {
	mu    sync.Mutex
	lines []string
}

// Enabled implements slog.Handler: every level.
func (h *Logs) Enabled(context.Context, slog.Level) bool { return true }

// WithAttrs implements slog.Handler; pgryw adds attributes per record.
func (h *Logs) WithAttrs([]slog.Attr) slog.Handler { return h }

// WithGroup implements slog.Handler; pgryw uses no groups.
func (h *Logs) WithGroup(string) slog.Handler { return h }

// Handle implements slog.Handler.
func (h *Logs) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%s", a.Key, a.Value)
		return true
	})
	h.mu.Lock()
	h.lines = append(h.lines, b.String())
	h.mu.Unlock()
	return nil
}

// Lines returns every line so far.
func (h *Logs) Lines() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.lines...)
}

// Take returns the lines so far and forgets them.
func (h *Logs) Take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	l := h.lines
	h.lines = nil
	return l
}

// WaitFor waits up to within for a line at index from or later that starts
// with prefix and holds contains, and returns its index; false when none
// came.
func (h *Logs) WaitFor(from int, prefix, contains string, within time.Duration) (int, bool) {
	deadline := time.Now().Add(within)
	for {
		h.mu.Lock()
		for i := from; i < len(h.lines); i++ {
			if l := h.lines[i]; strings.HasPrefix(l, prefix) && strings.Contains(l, contains) {
				h.mu.Unlock()
				return i, true
			}
		}
		h.mu.Unlock()
		if time.Now().After(deadline) {
			return 0, false
		}
		time.Sleep(20 * time.Millisecond)
	}
}
