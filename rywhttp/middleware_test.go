package rywhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgryw/pgryw"

	"github.com/pgryw/pgryw/internal/lsn"
	"github.com/pgryw/pgryw/internal/token"
)

// tok returns the unsigned token of position n on generation 1/1.
func tok(n uint64) string {
	return token.Token{SystemID: 1, Timeline: 1, LSN: lsn.LSN(n)}.String()
}

// write stands for a handler's committed write at position n: the
// request's Session takes in a token of it (signed with testKey, which a
// Session with no keys, or with testKey, accepts).
func write(r *http.Request, n uint64) {
	t := token.Token{SystemID: 1, Timeline: 1, LSN: lsn.LSN(n)}
	if err := pgryw.SessionFrom(r.Context()).Observe(token.Sign(t, testKey)); err != nil {
		panic(err)
	}
}

// testKey signs write's tokens; tests of signed tokens use it.
var testKey = []byte("0123456789abcdef0123456789abcdef")

// spyWriter records the response headers as they were when the first byte
// went out: the first WriteHeader of a final status, Write or Flush.
type spyWriter struct {
	h       http.Header
	sent    http.Header // snapshot at the first byte; nil before
	code    int
	body    strings.Builder
	flushes int
}

func newSpy() *spyWriter { return &spyWriter{h: http.Header{}} }

func (s *spyWriter) Header() http.Header { return s.h }
func (s *spyWriter) snap(code int) {
	if s.sent == nil {
		s.sent, s.code = s.h.Clone(), code
	}
}
func (s *spyWriter) WriteHeader(code int) {
	if code >= 200 {
		s.snap(code)
	}
}
func (s *spyWriter) Write(p []byte) (int, error) {
	s.snap(200)
	return s.body.Write(p)
}
func (s *spyWriter) Flush() {
	s.snap(200)
	s.flushes++
}

// serve runs h through Middleware with opts on req and returns the spy;
// a handler that returns without writing gets the headers as they are then.
func serve(h http.HandlerFunc, req *http.Request, opts ...Option) *spyWriter {
	s := newSpy()
	Middleware(h, opts...).ServeHTTP(s, req)
	s.snap(200)
	return s
}

func get(header string, cookies ...*http.Cookie) *http.Request {
	r := httptest.NewRequest("GET", "/", nil)
	if header != "" {
		r.Header.Set(TokenHeader, header)
	}
	for _, c := range cookies {
		r.AddCookie(c)
	}
	return r
}

func seen(t *testing.T, want string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if got := pgryw.SessionFrom(r.Context()).Token(); got != want {
			t.Errorf("handler's session: %q, want %q", got, want)
		}
	}
}

func TestMiddlewareReadsHeaderAndCookie(t *testing.T) {
	for _, c := range []struct {
		name   string
		header string
		cookie string
		opts   []Option
		want   string
	}{
		{"none", "", "", nil, ""},
		{"header", tok(10), "", nil, tok(10)},
		{"cookie", "", tok(20), nil, tok(20)},
		{"both, cookie later", tok(10), tok(20), nil, tok(20)},
		{"both, header later", tok(30), tok(20), nil, tok(30)},
		{"header off", tok(30), tok(20), []Option{Header(false)}, tok(20)},
		{"cookie off", tok(10), tok(20), []Option{NoCookie()}, tok(10)},
	} {
		t.Run(c.name, func(t *testing.T) {
			var cookies []*http.Cookie
			if c.cookie != "" {
				cookies = append(cookies, &http.Cookie{Name: DefaultTokenCookie, Value: c.cookie})
			}
			var st Stats
			s := serve(seen(t, c.want), get(c.header, cookies...), append(c.opts, Counters(&st))...)
			if s.sent.Get(TokenHeader) != "" || s.sent.Get("Set-Cookie") != "" {
				t.Errorf("a request that wrote nothing got a token: %v", s.sent)
			}
			if st.TokensRejected.Load() != 0 || st.TokensSent.Load() != 0 {
				t.Errorf("stats: rejected %d, sent %d", st.TokensRejected.Load(), st.TokensSent.Load())
			}
		})
	}
	// Another cookie name: the default one is not read.
	r := get("", &http.Cookie{Name: DefaultTokenCookie, Value: tok(5)}, &http.Cookie{Name: "ryw", Value: tok(7)})
	serve(seen(t, tok(7)), r, CookieName("ryw"))
}

func TestMiddlewareBadTokensIgnored(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	good := token.Sign(token.Token{SystemID: 1, Timeline: 1, LSN: 10}, key)
	tampered := []byte(good)
	tampered[len(tampered)-5] ^= 1
	forged := token.Sign(token.Token{SystemID: 1, Timeline: 1, LSN: 1 << 40}, []byte("someone else's key"))
	var st Stats
	r := get("not a token", &http.Cookie{Name: DefaultTokenCookie, Value: string(tampered)})
	r.Header.Add(TokenHeader, forged)
	r.Header.Add(TokenHeader, tok(99)) // unsigned: refused with keys
	s := serve(seen(t, ""), r, Keys(key), Counters(&st))
	if s.code != 200 {
		t.Fatalf("status %d", s.code)
	}
	if n := st.TokensRejected.Load(); n != 4 {
		t.Fatalf("TokensRejected = %d, want 4", n)
	}
	// The good one among bad ones is taken.
	r = get("garbage", &http.Cookie{Name: DefaultTokenCookie, Value: good})
	serve(seen(t, good), r, Keys(key), Counters(&st))
	if st.TokensRejected.Load() != 5 || st.TokensObserved.Load() != 1 {
		t.Fatalf("rejected %d, observed %d", st.TokensRejected.Load(), st.TokensObserved.Load())
	}
	// Without keys a malformed token is still rejected.
	var st2 Stats
	serve(seen(t, ""), get("1.1.1.ZZ"), Counters(&st2))
	if st2.TokensRejected.Load() != 1 {
		t.Fatalf("malformed without keys: rejected %d", st2.TokensRejected.Load())
	}
}

// The new token is in the headers that go out with the first byte, however
// the handler starts its response.
func TestMiddlewareHeadersBeforeFirstByte(t *testing.T) {
	starts := map[string]func(w http.ResponseWriter){
		"WriteHeader": func(w http.ResponseWriter) { w.WriteHeader(201) },
		"Write":       func(w http.ResponseWriter) { io.WriteString(w, "hello") },
		"Flush":       func(w http.ResponseWriter) { w.(http.Flusher).Flush() },
		"ResponseController.Flush": func(w http.ResponseWriter) {
			if err := http.NewResponseController(w).Flush(); err != nil {
				t.Error(err)
			}
		},
		"return":        func(http.ResponseWriter) {},
		"103 then body": func(w http.ResponseWriter) { w.WriteHeader(103); io.WriteString(w, "x") },
	}
	for name, start := range starts {
		t.Run(name, func(t *testing.T) {
			var st Stats
			s := serve(func(w http.ResponseWriter, r *http.Request) {
				write(r, 42)
				start(w)
				w.Header().Set("X-After", "1") // too late, as for any header
			}, get(tok(10)), Counters(&st))
			if got := s.sent.Get(TokenHeader); got != tok(42) {
				t.Errorf("%s header at the first byte: %q, want %q", TokenHeader, got, tok(42))
			}
			resp := http.Response{Header: s.sent}
			cs := resp.Cookies()
			if len(cs) != 1 || cs[0].Value != tok(42) {
				t.Fatalf("cookies at the first byte: %v", cs)
			}
			c := cs[0]
			if c.Name != DefaultTokenCookie || !c.HttpOnly || !c.Secure || c.SameSite != http.SameSiteLaxMode || c.Path != "/" || c.MaxAge != 60 {
				t.Errorf("default cookie attributes: %s", c)
			}
			if st.TokensSent.Load() != 1 || st.LateTokens.Load() != 0 {
				t.Errorf("sent %d, late %d", st.TokensSent.Load(), st.LateTokens.Load())
			}
		})
	}
}

func TestMiddlewareCookieOptions(t *testing.T) {
	s := serve(func(w http.ResponseWriter, r *http.Request) { write(r, 7) }, get(""),
		CookieName("ryw"), CookieSecure(false), CookieHTTPOnly(false),
		CookieSameSite(http.SameSiteStrictMode), CookiePath("/app"),
		CookieDomain("example.com"), MaxAge(5*time.Second), Header(false))
	if s.sent.Get(TokenHeader) != "" {
		t.Errorf("header off, yet sent: %v", s.sent)
	}
	want := "ryw=" + tok(7) + "; Path=/app; Domain=example.com; Max-Age=5; SameSite=Strict"
	if got := s.sent.Get("Set-Cookie"); got != want {
		t.Errorf("Set-Cookie %q\nwant       %q", got, want)
	}
	s = serve(func(w http.ResponseWriter, r *http.Request) { write(r, 7) }, get(""), NoCookie())
	if s.sent.Get("Set-Cookie") != "" || s.sent.Get(TokenHeader) != tok(7) {
		t.Errorf("no cookie: %v", s.sent)
	}
}

func TestMiddlewareSignedTokens(t *testing.T) {
	key := testKey
	s := serve(func(w http.ResponseWriter, r *http.Request) { write(r, 7) }, get(""), Keys(key))
	sent := s.sent.Get(TokenHeader)
	got, err := token.Parse(sent, [][]byte{key})
	if err != nil || got.LSN != 7 {
		t.Fatalf("sent %q: %+v, %v", sent, got, err)
	}
	// A key rotation: the old key still verifies.
	serve(seen(t, token.Sign(got, []byte("new key"))), get(sent), Keys([]byte("new key"), key))
}

// Writes after the first byte: their token cannot be in the headers. It goes
// out as a trailer (where the response can carry one) and to the store, and
// the handler can put it in the body: the escape hatch.
func TestMiddlewareWriteAfterBody(t *testing.T) {
	var st Stats
	store := NewMemoryTokenStore()
	rec := httptest.NewRecorder()
	h := func(w http.ResponseWriter, r *http.Request) {
		write(r, 10)
		io.WriteString(w, "streaming...\n")
		write(r, 20) // committed after the first byte
		fmt.Fprintf(w, "token %s\n", pgryw.SessionFrom(r.Context()).Token())
	}
	mw := Middleware(http.HandlerFunc(h), Counters(&st), Store(store, func(*http.Request) string { return "u" }))
	mw.ServeHTTP(rec, get(""))
	res := rec.Result()
	if got := res.Header.Get(TokenHeader); got != tok(10) {
		t.Errorf("header: %q, want the token of the writes before the first byte %q", got, tok(10))
	}
	if got := res.Trailer.Get(TokenHeader); got != tok(20) {
		t.Errorf("trailer: %q, want %q", got, tok(20))
	}
	if st.LateTokens.Load() != 1 || st.TokensSent.Load() != 1 {
		t.Errorf("late %d, sent %d", st.LateTokens.Load(), st.TokensSent.Load())
	}
	if got, _ := store.Load(context.Background(), "u"); got != tok(20) {
		t.Errorf("store: %q, want %q", got, tok(20))
	}
	// The client takes the token from the body and sends it back.
	body, _ := io.ReadAll(res.Body)
	var fromBody string
	for _, l := range strings.Split(string(body), "\n") {
		if f, ok := strings.CutPrefix(l, "token "); ok {
			fromBody = f
		}
	}
	if fromBody != tok(20) {
		t.Fatalf("body %q", body)
	}
	serve(seen(t, tok(20)), get(fromBody))
}

// A request that wrote nothing (its pgryw.Session kept the observed token) gets
// no token back, and does not touch the store.
func TestMiddlewareNoWriteNoToken(t *testing.T) {
	st := &countingStore{TokenStore: NewMemoryTokenStore()}
	var c Stats
	h := func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "read only") }
	s := serve(h, get(tok(10)), Store(st, func(*http.Request) string { return "u" }), Counters(&c))
	if len(s.sent.Values(TokenHeader)) != 0 || len(s.sent.Values("Set-Cookie")) != 0 {
		t.Fatalf("headers: %v", s.sent)
	}
	if st.advances != 0 || c.TokensSent.Load() != 0 {
		t.Fatalf("advances %d, sent %d", st.advances, c.TokensSent.Load())
	}
}

type countingStore struct {
	TokenStore
	mu       sync.Mutex
	advances int
}

func (c *countingStore) Advance(ctx context.Context, key, tok string, ttl time.Duration) error {
	c.mu.Lock()
	c.advances++
	c.mu.Unlock()
	return c.TokenStore.Advance(ctx, key, tok, ttl)
}

// Two devices of one user, sharing nothing but the key.
func TestMiddlewareStoreAcrossDevices(t *testing.T) {
	store := NewMemoryTokenStore()
	user := func(r *http.Request) string { return r.Header.Get("X-User") }
	opts := []Option{Store(store, user), MaxAge(30 * time.Second)}
	phone := get("")
	phone.Header.Set("X-User", "ann")
	serve(func(w http.ResponseWriter, r *http.Request) { write(r, 50) }, phone, opts...)
	laptop := get("")
	laptop.Header.Set("X-User", "ann")
	serve(seen(t, tok(50)), laptop, opts...)
	other := get("")
	other.Header.Set("X-User", "bob")
	serve(seen(t, ""), other, opts...)
	anon := get("")
	serve(seen(t, ""), anon, opts...)
}

type failingStore struct{}

func (failingStore) Load(context.Context, string) (string, error) { return "", errors.New("down") }
func (failingStore) Advance(context.Context, string, string, time.Duration) error {
	return errors.New("down")
}

func TestMiddlewareStoreErrorsCounted(t *testing.T) {
	var st Stats
	s := serve(func(w http.ResponseWriter, r *http.Request) { write(r, 5) }, get(""),
		Store(failingStore{}, func(*http.Request) string { return "u" }), Counters(&st))
	if s.code != 200 || s.sent.Get(TokenHeader) != tok(5) {
		t.Fatalf("code %d, headers %v", s.code, s.sent)
	}
	if st.StoreErrors.Load() != 2 {
		t.Fatalf("StoreErrors = %d, want 2 (Load, Advance)", st.StoreErrors.Load())
	}
}

func TestMemoryTokenStoreMaxMerge(t *testing.T) {
	ctx := context.Background()
	m := NewMemoryTokenStore()
	load := func() string {
		s, err := m.Load(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	adv := func(s string) error { return m.Advance(ctx, "k", s, time.Minute) }
	if load() != "" {
		t.Fatal("empty store")
	}
	for _, s := range []string{tok(10), tok(5), tok(10)} {
		if err := adv(s); err != nil {
			t.Fatal(err)
		}
	}
	if load() != tok(10) {
		t.Fatalf("after 10, 5, 10: %q", load())
	}
	adv(tok(11))
	if load() != tok(11) {
		t.Fatalf("after 11: %q", load())
	}
	// Compared as positions, not text: 0x100 > 0xff.
	adv(tok(0xff))
	adv(tok(0x100))
	adv(tok(0xff))
	if load() != tok(0x100) {
		t.Fatalf("hex: %q", load())
	}
	// A signed token of the same position is not needed; a later one is
	// stored with its signature.
	signed := token.Sign(token.Token{SystemID: 1, Timeline: 1, LSN: 0x200}, []byte("k"))
	adv(signed)
	if load() != signed {
		t.Fatalf("signed: %q", load())
	}
	// A later timeline wins whatever the LSN; an older one never does.
	tl2 := token.Token{SystemID: 1, Timeline: 2, LSN: 1}.String()
	adv(tl2)
	adv(tok(1 << 30))
	if load() != tl2 {
		t.Fatalf("timeline: %q", load())
	}
	// Another system: the newer observation.
	sys := token.Token{SystemID: 9, Timeline: 1, LSN: 1}.String()
	adv(sys)
	if load() != sys {
		t.Fatalf("system: %q", load())
	}
	// Malformed: an error, never stored.
	for _, bad := range []string{"", "x", "1.1.1.g", "2.1.1.1", tok(1 << 40)[:3]} {
		if err := adv(bad); err == nil {
			t.Errorf("Advance(%q) accepted", bad)
		}
	}
	if err := m.Advance(ctx, "new", "garbage", time.Minute); err == nil {
		t.Error("garbage accepted")
	}
	if s, _ := m.Load(ctx, "new"); s != "" {
		t.Errorf("garbage stored: %q", s)
	}
	if err := m.Advance(ctx, "k", tok(1<<50), 0); err == nil || load() != sys {
		t.Errorf("ttl 0: %v, %q", err, load())
	}
}

func TestMemoryTokenStoreTTL(t *testing.T) {
	ctx := context.Background()
	m := NewMemoryTokenStore()
	now := time.Unix(1000, 0)
	m.now = func() time.Time { return now }
	m.Advance(ctx, "k", tok(10), 10*time.Second)
	now = now.Add(9 * time.Second)
	if s, _ := m.Load(ctx, "k"); s != tok(10) {
		t.Fatalf("before the TTL: %q", s)
	}
	// A lower token leaves the position but refreshes the expiry.
	m.Advance(ctx, "k", tok(5), 10*time.Second)
	now = now.Add(9 * time.Second)
	if s, _ := m.Load(ctx, "k"); s != tok(10) {
		t.Fatalf("after a refresh: %q", s)
	}
	// A short ttl never shortens the expiry.
	m.Advance(ctx, "k", tok(11), 100*time.Millisecond)
	now = now.Add(500 * time.Millisecond)
	if s, _ := m.Load(ctx, "k"); s != tok(11) {
		t.Fatalf("short ttl: %q", s)
	}
	now = now.Add(time.Second)
	if s, _ := m.Load(ctx, "k"); s != "" {
		t.Fatalf("expired: %q", s)
	}
	// An expired entry is replaced, even by a lower token.
	m.Advance(ctx, "j", tok(100), time.Second)
	now = now.Add(time.Second)
	m.Advance(ctx, "j", tok(3), time.Second)
	if s, _ := m.Load(ctx, "j"); s != tok(3) {
		t.Fatalf("after expiry: %q", s)
	}
	// Expired entries are swept by Advance.
	for i := range 100 {
		m.Advance(ctx, fmt.Sprint(i), tok(1), time.Second)
	}
	now = now.Add(2 * time.Second)
	for range 200 {
		m.Advance(ctx, "live", tok(1), time.Second)
	}
	m.mu.Lock()
	n := len(m.entries)
	m.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d entries left after a sweep, want 1", n)
	}
}

// Concurrent Advances never lose the maximum; concurrent requests through
// one middleware, store and counters (run with -race).
func TestMiddlewareConcurrent(t *testing.T) {
	ctx := context.Background()
	m := NewMemoryTokenStore()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				if err := m.Advance(ctx, "k", tok(uint64(g*1000+i+1)), time.Minute); err != nil {
					t.Error(err)
				}
				m.Load(ctx, "k")
			}
		}()
	}
	wg.Wait()
	if s, _ := m.Load(ctx, "k"); s != tok(7500) {
		t.Fatalf("max lost: %q", s)
	}

	var st Stats
	store := NewMemoryTokenStore()
	mw := Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := token.Parse(r.URL.Query().Get("n"), nil)
		write(r, uint64(n.LSN))
		io.WriteString(w, "ok")
	}), Counters(&st), Store(store, func(r *http.Request) string { return "u" }))
	const workers, each = 8, 100
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			prev := ""
			for i := range each {
				r := get(prev)
				q := r.URL.Query()
				q.Set("n", tok(uint64(g*each+i+1)))
				r.URL.RawQuery = q.Encode()
				rec := httptest.NewRecorder()
				mw.ServeHTTP(rec, r)
				if h := rec.Result().Header.Get(TokenHeader); h != "" {
					prev = h
				}
			}
		}()
	}
	wg.Wait()
	if s, _ := store.Load(ctx, "u"); s != tok(workers*each) {
		t.Fatalf("store after concurrent requests: %q", s)
	}
	if st.TokensRejected.Load() != 0 || st.StoreErrors.Load() != 0 || st.TokensSent.Load() == 0 {
		t.Fatalf("rejected %d, store errors %d, sent %d", st.TokensRejected.Load(), st.StoreErrors.Load(), st.TokensSent.Load())
	}
}
