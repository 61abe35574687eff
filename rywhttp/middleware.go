// Package rywhttp carries pgryw's read-your-writes across HTTP requests: a
// Middleware that gives each request a pgryw.Session from the tokens the
// client sends (a header, a cookie, a TokenStore entry) and sends the
// Session's new token back after the request's writes. It uses only pgryw's
// public API; a program that does not import it does not carry it.
package rywhttp

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/pgryw/pgryw"
)

// TokenHeader is the HTTP header that carries a pgryw.Session's token, in requests
// (the client's latest token) and in responses (the token after the
// request's writes).
const TokenHeader = "Pgryw-Token"

// DefaultTokenCookie is the name of the cookie Middleware reads and sets
// unless CookieName says otherwise.
const DefaultTokenCookie = "pgryw_token"

// DefaultTokenMaxAge is how long Middleware's cookie and store entries live
// unless MaxAge says otherwise.
const DefaultTokenMaxAge = 60 * time.Second

// Middleware gives each HTTP request read-your-writes across requests,
// servers and (with a TokenStore) devices. For every request it:
//
//  1. makes a new pgryw.Session (signed with Keys, if given) and merges
//     into it, with Observe, every token the request carries: the
//     TokenHeader header, the cookie (DefaultTokenCookie) and, with
//     Store, the token stored under the request's key. A
//     malformed or badly signed token is ignored (and counted in
//     Stats.TokensRejected): the request runs as if it had not
//     been sent;
//  2. attaches the pgryw.Session to the request's context (pgryw.WithSession): the
//     handler's statements run with r.Context() advance it, and its replica
//     reads wait for it;
//  3. if the handler's writes advanced the pgryw.Session (its Token changed), puts
//     the new token in the TokenHeader response header and the cookie, and
//     advances the store's key, at the last moment before the first byte of
//     the response goes out: the first WriteHeader (1xx codes excepted),
//     Write or Flush of the handler, or the handler's return. A request
//     that wrote nothing gets no token back.
//
// The client keeps the response's TokenHeader value and sends it with its
// next requests (a browser does that with the cookie by itself); any server
// of the application, with its own pool, then sees the client's writes. For
// a browser script on another origin, list TokenHeader in the CORS
// Access-Control-Allow-Headers and Access-Control-Expose-Headers.
//
// Writes committed after the first byte of the response cannot go into its
// headers. At the handler's return the middleware still advances the store,
// and, with the header on, sets the token as an HTTP trailer (TokenHeader),
// which only a chunked HTTP/1.1 or an HTTP/2 response can carry; such
// requests are counted in Stats.LateTokens. A handler that
// streams its body before its last commit should put the token in the body
// itself: pgryw.SessionFrom(r.Context()).Token() after the commit, which the
// client sends back in the TokenHeader header.
//
// The response writer given to the handler implements http.Flusher and
// http.Hijacker, and Unwrap for http.ResponseController.
//
// Without Keys a client can send any position; the pool clamps a
// position beyond the primary's (Stats.TokensClamped), so a forged token
// cannot make reads wait, but use keys wherever clients are not trusted.
func Middleware(next http.Handler, opts ...Option) http.Handler {
	m := &middleware{
		next:     next,
		header:   true,
		cookie:   true,
		name:     DefaultTokenCookie,
		path:     "/",
		secure:   true,
		httpOnly: true,
		sameSite: http.SameSiteLaxMode,
		maxAge:   DefaultTokenMaxAge,
		stats:    &Stats{},
	}
	for _, o := range opts {
		o(m)
	}
	if len(m.keys) > 0 {
		// Copied once here, not for every request's pgryw.Session.
		m.session = []pgryw.SessionOption{pgryw.SessionKeys(m.keys...)}
	}
	return m
}

// Option configures Middleware.
type Option func(*middleware)

// CookieName sets the name of the token cookie (default
// DefaultTokenCookie).
func CookieName(name string) Option {
	return func(m *middleware) { m.name = name }
}

// NoCookie makes Middleware neither read nor set a cookie: tokens
// travel in the TokenHeader header (and the store) only.
func NoCookie() Option {
	return func(m *middleware) { m.cookie = false }
}

// Header turns the TokenHeader request and response header on
// (the default) or off; off, tokens travel in the cookie (and the store)
// only.
func Header(on bool) Option {
	return func(m *middleware) { m.header = on }
}

// CookieSecure sets the cookie's Secure attribute (default true:
// sent over HTTPS only). Turn it off only for plain-HTTP development and
// tests.
func CookieSecure(secure bool) Option {
	return func(m *middleware) { m.secure = secure }
}

// CookieHTTPOnly sets the cookie's HttpOnly attribute (default
// true: scripts cannot read it).
func CookieHTTPOnly(httpOnly bool) Option {
	return func(m *middleware) { m.httpOnly = httpOnly }
}

// CookieSameSite sets the cookie's SameSite attribute (default
// http.SameSiteLaxMode).
func CookieSameSite(s http.SameSite) Option {
	return func(m *middleware) { m.sameSite = s }
}

// CookiePath sets the cookie's Path attribute (default "/").
func CookiePath(path string) Option {
	return func(m *middleware) { m.path = path }
}

// CookieDomain sets the cookie's Domain attribute (default none:
// the cookie goes back to the host that set it only).
func CookieDomain(domain string) Option {
	return func(m *middleware) { m.domain = domain }
}

// MaxAge sets how long a token is kept: the cookie's Max-Age and
// the store's TTL (default DefaultTokenMaxAge, 60 s; d below one second
// means one second). A token matters only until the replicas have replayed
// its position: after that every replica read sees the write anyway, and an
// expired token is harmless. Keep d well above the replicas' worst lag (plus
// wait_timeout): a token dropped while the replicas are still behind it
// lets a read miss the write.
func MaxAge(d time.Duration) Option {
	return func(m *middleware) { m.maxAge = max(d, time.Second) }
}

// Keys passes pgryw.SessionKeys to the Sessions the middleware makes:
// the tokens it sends are signed with the first key, and tokens it receives
// (header, cookie, store) are accepted only when signed with one of them.
func Keys(keys ...[]byte) Option {
	return func(m *middleware) { m.keys = append(m.keys, keys...) }
}

// Store shares tokens between the clients of one principal (a
// user's phone and laptop) through store: for a request whose key(r) is not
// empty (for example the authenticated user's id), the middleware observes
// the token stored under the key before the handler runs, and advances the
// key with the new token when the handler wrote (before the first byte of
// the response, and again at the handler's return for writes after it).
// A store error never fails the request; it is counted in
// Stats.StoreErrors. Store calls use the request's context (the
// last one, after the handler returns, the request's context without its
// cancellation): bound their time inside the store.
func Store(store TokenStore, key func(*http.Request) string) Option {
	return func(m *middleware) { m.store, m.key = store, key }
}

// Counters makes Middleware count into s, which the caller reads
// at any time (its fields are atomic).
func Counters(s *Stats) Option {
	return func(m *middleware) {
		if s != nil {
			m.stats = s
		}
	}
}

// Stats counts what Middleware did; see Counters. Do
// not copy a Stats in use.
type Stats struct {
	// TokensObserved counts tokens accepted from request headers, cookies
	// and the store.
	TokensObserved atomic.Int64
	// TokensRejected counts malformed or badly signed tokens, which were
	// ignored.
	TokensRejected atomic.Int64
	// TokensSent counts responses whose headers carried a new token.
	TokensSent atomic.Int64
	// LateTokens counts requests whose pgryw.Session advanced after the first
	// byte of the response: that token was not in the headers.
	LateTokens atomic.Int64
	// StoreErrors counts failed TokenStore calls.
	StoreErrors atomic.Int64
}

type middleware struct {
	next     http.Handler
	header   bool
	cookie   bool
	name     string
	path     string
	domain   string
	secure   bool
	httpOnly bool
	sameSite http.SameSite
	maxAge   time.Duration
	keys     [][]byte
	session  []pgryw.SessionOption // for each request's pgryw.Session: its keys
	store    TokenStore
	key      func(*http.Request) string
	stats    *Stats
}

func (m *middleware) observe(s *pgryw.Session, tok string) {
	if tok == "" {
		return
	}
	if err := s.Observe(tok); err != nil {
		m.stats.TokensRejected.Add(1)
		return
	}
	m.stats.TokensObserved.Add(1)
}

func (m *middleware) advance(ctx context.Context, key, tok string) {
	if err := m.store.Advance(ctx, key, tok, m.maxAge); err != nil {
		m.stats.StoreErrors.Add(1)
	}
}

// ServeHTTP implements http.Handler.
func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s := pgryw.NewSession(m.session...)
	if m.header {
		for _, v := range r.Header.Values(TokenHeader) {
			m.observe(s, v)
		}
	}
	if m.cookie {
		for _, c := range r.Cookies() {
			if c.Name == m.name {
				m.observe(s, c.Value)
			}
		}
	}
	var key string
	if m.store != nil && m.key != nil {
		key = m.key(r)
	}
	if key != "" {
		tok, err := m.store.Load(r.Context(), key)
		if err != nil {
			m.stats.StoreErrors.Add(1)
		} else {
			m.observe(s, tok)
		}
	}
	r = r.WithContext(pgryw.WithSession(r.Context(), s))
	rw := &responseWriter{ResponseWriter: w, m: m, r: r, s: s, key: key}
	rw.sent = s.Token()
	defer func() {
		// Also after a panic: the store learns of writes that committed.
		if !rw.committed {
			rw.commit()
			return
		}
		tok := s.Token()
		if tok == rw.sent {
			return
		}
		m.stats.LateTokens.Add(1)
		if m.header && !rw.hijacked {
			w.Header().Set(http.TrailerPrefix+TokenHeader, tok)
		}
		if key != "" {
			m.advance(context.WithoutCancel(r.Context()), key, tok)
		}
	}()
	m.next.ServeHTTP(rw, r)
}

// responseWriter sets the token headers when the response's headers are
// committed.
type responseWriter struct {
	http.ResponseWriter
	m         *middleware
	r         *http.Request
	s         *pgryw.Session
	key       string
	sent      string // the token the client has: observed, or sent in the headers
	committed bool
	hijacked  bool
}

// commit runs once, just before the headers go out.
func (w *responseWriter) commit() {
	if w.committed {
		return
	}
	w.committed = true
	tok := w.s.Token()
	if tok == w.sent {
		return
	}
	w.sent = tok
	m := w.m
	if m.header {
		w.Header().Set(TokenHeader, tok)
	}
	if m.cookie {
		http.SetCookie(w.ResponseWriter, &http.Cookie{
			Name:     m.name,
			Value:    tok,
			Path:     m.path,
			Domain:   m.domain,
			MaxAge:   int(m.maxAge / time.Second),
			Secure:   m.secure,
			HttpOnly: m.httpOnly,
			SameSite: m.sameSite,
		})
	}
	if m.header || m.cookie {
		m.stats.TokensSent.Add(1)
	}
	if w.key != "" {
		m.advance(w.r.Context(), w.key, tok)
	}
}

// WriteHeader implements http.ResponseWriter.
func (w *responseWriter) WriteHeader(code int) {
	if code >= 200 || code == http.StatusSwitchingProtocols {
		w.commit()
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (w *responseWriter) Write(p []byte) (int, error) {
	w.commit()
	return w.ResponseWriter.Write(p)
}

// Flush implements http.Flusher.
func (w *responseWriter) Flush() {
	_ = w.FlushError()
}

// FlushError is the Flush that http.ResponseController calls.
func (w *responseWriter) FlushError() error {
	w.commit()
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack implements http.Hijacker (when the underlying writer does).
func (w *responseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, b, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.committed, w.hijacked = true, true
	}
	return c, b, err
}

// Unwrap returns the underlying writer, for http.ResponseController.
func (w *responseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
