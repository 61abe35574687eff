package redisstore

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgryw/pgryw/internal/lsn"
	"github.com/pgryw/pgryw/internal/token"
	"github.com/redis/go-redis/v9"
)

// tokenStore mirrors pgryw's TokenStore interface.
type tokenStore interface {
	Load(ctx context.Context, key string) (string, error)
	Advance(ctx context.Context, key, token string, ttl time.Duration) error
}

var _ tokenStore = (*Store)(nil)

const hour = time.Hour

func tok(sys uint64, tli uint32, pos uint64) string {
	return token.Token{SystemID: sys, Timeline: tli, LSN: lsn.LSN(pos)}.String()
}

// newStore returns a Store with a prefix of its own for t.
func newStore(t *testing.T) (*Store, redis.UniversalClient) {
	c := newClient(t)
	return New(c, WithPrefix("test:"+t.Name()+":")), c
}

func mustAdvance(t *testing.T, s *Store, key, v string, ttl time.Duration) {
	t.Helper()
	if err := s.Advance(context.Background(), key, v, ttl); err != nil {
		t.Fatalf("Advance(%q): %v", v, err)
	}
}

func wantLoad(t *testing.T, s *Store, key, want string) {
	t.Helper()
	got, err := s.Load(context.Background(), key)
	if err != nil {
		t.Fatalf("Load(%q): %v", key, err)
	}
	if got != want {
		t.Fatalf("Load(%q) = %q, want %q", key, got, want)
	}
}

func TestLoadMissing(t *testing.T) {
	s, _ := newStore(t)
	wantLoad(t, s, "nobody", "")
}

func TestAdvanceThenLoad(t *testing.T) {
	s, c := newStore(t)
	v := tok(0x65efd3c798b32086, 1, 0x3016a40)
	mustAdvance(t, s, "u1", v, hour)
	wantLoad(t, s, "u1", v)
	wantLoad(t, s, "u2", "")
	// The key carries the prefix.
	raw, err := c.Get(context.Background(), "test:"+t.Name()+":u1").Result()
	if err != nil || raw != v {
		t.Fatalf("raw GET = %q, %v; want %q", raw, err, v)
	}
}

func TestDefaultPrefix(t *testing.T) {
	c := newClient(t)
	s := New(c)
	key := "default-prefix-" + t.Name()
	v := tok(1, 1, 1)
	mustAdvance(t, s, key, v, time.Minute)
	defer c.Del(context.Background(), DefaultPrefix+key)
	if raw, err := c.Get(context.Background(), DefaultPrefix+key).Result(); err != nil || raw != v {
		t.Fatalf("GET %s%s = %q, %v", DefaultPrefix, key, raw, err)
	}
}

func TestMaxMerge(t *testing.T) {
	s, _ := newStore(t)
	const k = "k"
	steps := []struct {
		name      string
		advance   string
		wantAfter string
	}{
		{"first", tok(0xabc, 2, 0x1000), tok(0xabc, 2, 0x1000)},
		{"older LSN keeps newer", tok(0xabc, 2, 0xfff), tok(0xabc, 2, 0x1000)},
		{"much older LSN (fewer digits) keeps newer", tok(0xabc, 2, 0x9), tok(0xabc, 2, 0x1000)},
		{"larger LSN replaces", tok(0xabc, 2, 0x1001), tok(0xabc, 2, 0x1001)},
		{"more digits replaces", tok(0xabc, 2, 0x10000), tok(0xabc, 2, 0x10000)},
		{"earlier timeline keeps", tok(0xabc, 1, 0xffffffff), tok(0xabc, 2, 0x10000)},
		{"later timeline replaces, even with a smaller LSN", tok(0xabc, 3, 0x5), tok(0xabc, 3, 0x5)},
		{"timeline a replaces 9 (hex order)", tok(0xabc, 0xa, 0x5), tok(0xabc, 0xa, 0x5)},
		{"timeline 9 does not replace a", tok(0xabc, 0x9, 0x50), tok(0xabc, 0xa, 0x5)},
		{"zero token never replaces", "1.0.0.0", tok(0xabc, 0xa, 0x5)},
		{"other system replaces, whatever its position", tok(0xdef, 1, 0x1), tok(0xdef, 1, 0x1)},
		{"other (smaller) system replaces too", tok(0xabc, 1, 0x1), tok(0xabc, 1, 0x1)},
		{"max values", tok(^uint64(0), ^uint32(0), ^uint64(0)), tok(^uint64(0), ^uint32(0), ^uint64(0))},
		{"max LSN kept", tok(^uint64(0), ^uint32(0), ^uint64(0)-1), tok(^uint64(0), ^uint32(0), ^uint64(0))},
	}
	for _, st := range steps {
		mustAdvance(t, s, k, st.advance, hour)
		got, err := s.Load(context.Background(), k)
		if err != nil || got != st.wantAfter {
			t.Fatalf("%s: after Advance(%q) Load = %q, %v; want %q", st.name, st.advance, got, err, st.wantAfter)
		}
	}
}

// TestScriptMatchesTokenMax checks the Lua merge against token.Max on
// random pairs, with numbers of every digit count.
func TestScriptMatchesTokenMax(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	r := rand.New(rand.NewPCG(1, 2))
	num := func(bits int) uint64 {
		if bits == 0 {
			return 0
		}
		return r.Uint64() >> (64 - bits)
	}
	gen := func() token.Token {
		x := token.Token{SystemID: num(r.IntN(3) * 32), Timeline: uint32(num(r.IntN(3))), LSN: lsn.LSN(num(r.IntN(65)))}
		if r.IntN(4) == 0 {
			// Share the system and timeline often, to exercise the LSN order.
			x.SystemID, x.Timeline = 7, 1
		}
		return x
	}
	for i := range 500 {
		a, b := gen(), gen()
		key := "pair"
		if err := s.client.Del(ctx, s.prefix+key).Err(); err != nil {
			t.Fatal(err)
		}
		mustAdvance(t, s, key, a.String(), hour)
		got, err := s.advance(ctx, key, b.String(), hour)
		if err != nil {
			t.Fatal(err)
		}
		if want := token.Max(a, b).String(); got != want {
			t.Fatalf("pair %d: merge(%s, %s) = %s, token.Max says %s", i, a, b, got, want)
		}
	}
}

func TestTTL(t *testing.T) {
	s, c := newStore(t)
	ctx := context.Background()
	raw := s.prefix + "t"
	mustAdvance(t, s, "t", tok(1, 1, 0x100), 150*time.Millisecond)
	wantLoad(t, s, "t", tok(1, 1, 0x100))
	if d := c.PTTL(ctx, raw).Val(); d <= 0 || d > 150*time.Millisecond {
		t.Fatalf("PTTL = %v, want in (0, 150ms]", d)
	}
	// An advance that keeps the stored token still sets the TTL.
	mustAdvance(t, s, "t", tok(1, 1, 0x50), hour)
	wantLoad(t, s, "t", tok(1, 1, 0x100))
	if d := c.PTTL(ctx, raw).Val(); d < hour-time.Minute {
		t.Fatalf("PTTL after a keeping advance = %v, want about 1h", d)
	}
	// A shorter TTL does not shorten the key's.
	mustAdvance(t, s, "t", tok(1, 1, 0x200), 100*time.Millisecond)
	wantLoad(t, s, "t", tok(1, 1, 0x200))
	if d := c.PTTL(ctx, raw).Val(); d < hour-time.Minute {
		t.Fatalf("PTTL after a shorter-TTL advance = %v, want about 1h", d)
	}
	// A replacing advance with a shorter TTL keeps the longer one too.
	mustAdvance(t, s, "t", tok(1, 1, 0x300), 100*time.Millisecond)
	wantLoad(t, s, "t", tok(1, 1, 0x300))
	if d := c.PTTL(ctx, raw).Val(); d < hour-time.Minute {
		t.Fatalf("PTTL after a shorter-TTL replacing advance = %v, want about 1h", d)
	}
	// The longest TTL Go can express is accepted.
	mustAdvance(t, s, "t", tok(1, 1, 0x300), time.Duration(1<<63-1))
	// A key without a TTL (set by someone else) gets one.
	if err := c.Persist(ctx, raw).Err(); err != nil {
		t.Fatal(err)
	}
	mustAdvance(t, s, "t", tok(1, 1, 0x1), time.Minute)
	if d := c.PTTL(ctx, raw).Val(); d <= 0 || d > time.Minute {
		t.Fatalf("PTTL after advancing a persistent key = %v, want in (0, 1m]", d)
	}

	mustAdvance(t, s, "t2", tok(1, 1, 0x60), 100*time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for {
		v, err := s.Load(ctx, "t2")
		if err != nil {
			t.Fatal(err)
		}
		if v == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("key still holds %q 5s after a 100ms TTL", v)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A sub-millisecond TTL rounds up rather than failing.
	mustAdvance(t, s, "t", tok(1, 1, 0x1), time.Microsecond)
	if err := s.Advance(ctx, "t", tok(1, 1, 1), 0); !errors.Is(err, ErrTTL) {
		t.Fatalf("Advance with ttl 0: %v, want ErrTTL", err)
	}
	if err := s.Advance(ctx, "t", tok(1, 1, 1), -time.Second); !errors.Is(err, ErrTTL) {
		t.Fatalf("Advance with negative ttl: %v, want ErrTTL", err)
	}
}

// TestConcurrentAdvance has 16 goroutines, each with its own client
// connection pool, advance one key with random LSNs; the key must end at
// the maximum, which only holds if the merge is atomic on the server.
func TestConcurrentAdvance(t *testing.T) {
	newClient(t) // skip without a server
	prefix := "test:" + t.Name() + ":"
	const workers, each = 16, 200
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		maxL uint64
	)
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := redis.NewClient(&redis.Options{Addr: redisAddr})
			defer c.Close()
			s := New(c, WithPrefix(prefix))
			r := rand.New(rand.NewPCG(uint64(w), 99))
			local := uint64(0)
			for range each {
				p := r.Uint64() >> r.IntN(64)
				local = max(local, p)
				if err := s.Advance(context.Background(), "shared", tok(0x1234, 1, p), hour); err != nil {
					errs <- err
					return
				}
			}
			mu.Lock()
			maxL = max(maxL, local)
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s, _ := newStore(t)
	wantLoad(t, s, "shared", tok(0x1234, 1, maxL))
}

var malformed = []string{
	"",
	"x",
	"1",
	"1.1.1",
	"1.1.1.",
	"2.1.1.1",
	"01.1.1.1",
	"1.01.1.1",
	"1.1.01.1",
	"1.1.1.01",
	"1.00.0.0",
	"1.A.1.1",
	"1.1.1.1F",
	"1.g.1.1",
	" 1.1.1.1",
	"1.1.1.1 ",
	"1.1.1.1\n",
	"1.-1.1.1",
	"1.+1.1.1",
	"1.1.1.1.",
	"1.1.1.1.1",
	"1.1.1.1.1.1",
	"1.12345678901234567.1.1",         // 17-digit system id
	"1.1.123456789.1",                 // 9-digit timeline
	"1.1.1.12345678901234567",         // 17-digit LSN
	"1.1.1.1.AAAAAAAAAAAAAAAAAAAAA",   // 21-character signature
	"1.1.1.1.AAAAAAAAAAAAAAAAAAAAAAA", // 23-character signature
	"1.1.1.1.AAAAAAAAAAAAAAAAAAAAAB",  // unused bits set
	"1.1.1.1.AAAAAAAAAAAAAAAAAAAA=A",  // not base64url
	"1.1.1.1.AAAAAAAAAAAAAAAAAAAA+A",
	"1.1.1.1.AAAAAAAAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAA",
	"1.1.1.1é",
	"1.1.1.1\x00",
	"1.ffffffffffffffff.ffffffff.ffffffffffffffff.AAAAAAAAAAAAAAAAAAAAAA" + strings.Repeat("A", 80),
}

func TestMalformedRejected(t *testing.T) {
	s, c := newStore(t)
	ctx := context.Background()
	good := tok(5, 1, 0x10)
	mustAdvance(t, s, "m", good, hour)
	secret := "1.1.1.1.SECRETSECRETSECRETSECRETSECRET"
	for _, bad := range append(malformed, secret) {
		// Go rejects it before sending anything.
		err := s.Advance(ctx, "m", bad, hour)
		if err == nil || !errors.Is(err, token.ErrMalformed) && !errors.Is(err, token.ErrVersion) {
			t.Errorf("Advance(%q) = %v, want a malformed-token error", bad, err)
		}
		// The script rejects it too, when called directly.
		_, err = advanceScript.Run(ctx, c, []string{s.prefix + "m"}, bad, "3600000").Result()
		if err == nil || !strings.Contains(err.Error(), "redisstore: malformed token") {
			t.Errorf("script with %q = %v, want a malformed-token error", bad, err)
		}
		if strings.Contains(err.Error(), bad) && len(bad) > 8 {
			t.Errorf("script error %q quotes the token", err)
		}
	}
	if err := s.Advance(ctx, "m", secret, hour); err == nil || strings.Contains(err.Error(), "SECRETSECRETSECRETSECRET") {
		t.Errorf("error %v quotes more than a short prefix of the token", err)
	}
	// The script checks the TTL argument too.
	for _, ttl := range []string{"0", "-1", "1.5", "", "x", "01", "10000000000000"} {
		if _, err := advanceScript.Run(ctx, c, []string{s.prefix + "m"}, good, ttl).Result(); err == nil {
			t.Errorf("script with ttl %q succeeded", ttl)
		}
	}
	wantLoad(t, s, "m", good)
}

func TestStoredGarbage(t *testing.T) {
	s, c := newStore(t)
	ctx := context.Background()
	if err := c.Set(ctx, s.prefix+"g", "not a token: secret", 0).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := s.Load(ctx, "g")
	if !errors.Is(err, token.ErrMalformed) || strings.Contains(err.Error(), "secret") {
		t.Fatalf("Load of garbage = %v, want ErrMalformed without the value", err)
	}
	// Advance replaces a stored value that is not a token.
	v := tok(1, 1, 1)
	mustAdvance(t, s, "g", v, hour)
	wantLoad(t, s, "g", v)
}

func TestSignedTokens(t *testing.T) {
	s, _ := newStore(t)
	key := []byte("0123456789abcdef0123456789abcdef")
	sign := func(pos uint64) string {
		return token.Sign(token.Token{SystemID: 0xabc, Timeline: 1, LSN: lsn.LSN(pos)}, key)
	}
	s10, s30 := sign(0x10), sign(0x30)
	if strings.Count(s10, ".") != 4 {
		t.Fatalf("signed token %q has no fifth field", s10)
	}
	steps := []struct{ advance, want string }{
		{s10, s10},                                 // stored with its signature
		{tok(0xabc, 1, 0x5), s10},                  // older unsigned: signed one kept, fifth field and all
		{tok(0xabc, 1, 0x10), s10},                 // same position: stored one (and its signature) kept
		{tok(0xabc, 1, 0x20), tok(0xabc, 1, 0x20)}, // newer unsigned replaces, signature gone
		{s30, s30},                                 // newer signed replaces, with its signature
		{sign(0x25), s30},                          // older signed does not replace
		{"1.0.0.0", s30},                           // zero never replaces
		{token.Sign(token.Token{SystemID: 0xabc, Timeline: 2, LSN: 1}, key), token.Sign(token.Token{SystemID: 0xabc, Timeline: 2, LSN: 1}, key)},
	}
	for i, st := range steps {
		mustAdvance(t, s, "s", st.advance, hour)
		got, err := s.Load(context.Background(), "s")
		if err != nil || got != st.want {
			t.Fatalf("step %d: after Advance(%q) Load = %q, %v; want %q", i, st.advance, got, err, st.want)
		}
	}
	// Signatures are not verified here: a well-formed signature under another
	// key is stored as it is.
	other := token.Sign(token.Token{SystemID: 0xabc, Timeline: 2, LSN: 2}, []byte("another key, another key, 32 b!!"))
	mustAdvance(t, s, "s", other, hour)
	wantLoad(t, s, "s", other)
}

// TestEvalshaFallback flushes the server's script cache: Advance must still
// work (go-redis's Script falls back from EVALSHA to EVAL).
func TestEvalshaFallback(t *testing.T) {
	s, c := newStore(t)
	ctx := context.Background()
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	mustAdvance(t, s, "e", tok(1, 1, 2), hour)
	wantLoad(t, s, "e", tok(1, 1, 2))
	if ok, err := c.ScriptExists(ctx, advanceScript.Hash()).Result(); err != nil || !ok[0] {
		t.Fatalf("script not cached after the fallback: %v, %v", ok, err)
	}
}

func TestRedisDown(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	s := New(c)
	secretTok := tok(0xabc, 1, 0x123456)
	err := s.Advance(context.Background(), "k", secretTok, hour)
	if err == nil || !strings.HasPrefix(err.Error(), "redisstore: advance script:") || strings.Contains(err.Error(), secretTok) {
		t.Fatalf("Advance against no server: %v", err)
	}
	if _, err := s.Load(context.Background(), "k"); err == nil || !strings.HasPrefix(err.Error(), "redisstore: load:") {
		t.Fatalf("Load against no server: %v", err)
	}
}
