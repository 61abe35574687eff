package pgryw_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// TestIntegrationForgedTokens observes unsigned tokens forged in every
// field, each read with the same Session several times: at most one clamp
// or rebase (a capture on the primary), and then no read waits, times out
// or falls back because of the token, and every read sees the session's
// rows. The fields are taken from a real token of the cluster and changed
// one or several at a time.
func TestIntegrationForgedTokens(t *testing.T) {
	pgtest.Require(t, cluster)
	ctx := context.Background()
	setDelay(t, 50*time.Millisecond)
	table := newTable(t)
	db, c := openDB(t, "wait_timeout=1s&session_scope=conn")
	real := pgryw.NewSession()
	if _, err := db.ExecContext(pgryw.WithSession(ctx, real), fmt.Sprintf("INSERT INTO %s VALUES (1, 1)", table)); err != nil {
		t.Fatal(err)
	}
	tok := real.Token()
	f := strings.Split(tok, ".")
	if len(f) != 4 {
		t.Fatalf("token %q", tok)
	}
	sys, tl, pos := f[1], f[2], f[3]
	tlv, _ := strconv.ParseUint(tl, 16, 32)
	posv, _ := strconv.ParseUint(pos, 16, 64)
	hex := func(v uint64) string { return strconv.FormatUint(v, 16) }
	far := hex(posv + 1<<40)
	forged := map[string]string{
		"position far ahead":                     "1." + sys + "." + tl + "." + far,
		"largest position":                       "1." + sys + "." + tl + ".ffffffffffffffff",
		"later timeline, position far ahead":     "1." + sys + "." + hex(tlv+5) + "." + far,
		"later timeline, same position":          "1." + sys + "." + hex(tlv+5) + "." + pos,
		"largest timeline, largest position":     "1." + sys + ".ffffffff.ffffffffffffffff",
		"earlier timeline, position far ahead":   "1." + sys + ".0." + far,
		"other system, position far ahead":       "1." + hex(12345) + "." + tl + "." + far,
		"no system, position far ahead":          "1.0." + tl + "." + far,
		"no system, no timeline, far ahead":      "1.0.0." + far,
		"other system, later timeline, far":      "1.ffffffffffffffff.ffffffff." + far,
		"position just ahead of the primary now": "1." + sys + "." + tl + "." + hex(posv+1<<20),
	}
	for name, ft := range forged {
		t.Run(name, func(t *testing.T) {
			s := pgryw.NewSession()
			if err := s.Observe(ft); err != nil {
				t.Fatalf("Observe(%q): %v", ft, err)
			}
			sctx := pgryw.WithSession(ctx, s)
			before := c.Stats()
			for i := 0; i < 5; i++ {
				start := time.Now()
				var n int
				if err := db.QueryRowContext(sctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
					t.Fatalf("read %d: %v", i, err)
				}
				if took := time.Since(start); took > 300*time.Millisecond {
					t.Errorf("read %d took %v", i, took)
				}
				if n != 1 {
					t.Errorf("read %d: %d rows", i, n)
				}
			}
			after := c.Stats()
			fixes := (after.TokensClamped - before.TokensClamped) + (after.TokensRebased - before.TokensRebased)
			waits := after.WaitTimeouts - before.WaitTimeouts
			falls := after.Fallbacks - before.Fallbacks
			t.Logf("%q: clamped %d, rebased %d, waits %d, timeouts %d, fallbacks %d; token now %q", ft,
				after.TokensClamped-before.TokensClamped, after.TokensRebased-before.TokensRebased, after.Waits-before.Waits, waits, falls, s.Token())
			if fixes > 1 || waits != 0 || falls != 0 {
				t.Errorf("a forged token cost %d clamps or rebases, %d wait timeouts, %d fallbacks", fixes, waits, falls)
			}
		})
	}
}
