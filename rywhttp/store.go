package rywhttp

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/pgryw/pgryw/internal/token"
)

// TokenStore keeps the latest token of each key (a user, a tenant: whatever
// principal's writes must be visible to all its clients), shared by every
// server of an application. Middleware uses it through Store. An
// implementation must be safe for concurrent use, by the goroutines of one
// process and by every process sharing the store.
type TokenStore interface {
	// Load returns the token stored under key, or "" (and a nil error)
	// when there is none or it has expired. It returns the stored text
	// unchanged; the caller verifies it (pgryw.Session.Observe).
	Load(ctx context.Context, key string) (string, error)

	// Advance merges token into key's entry, atomically with respect to
	// every other Advance of the key (from any process): the entry becomes
	// the later of the stored token and token, as decided by comparing
	// positions, never text (a token is "1.<systemid>.<timeline>.<lsn>",
	// optionally followed by ".<signature>", fields in hexadecimal):
	//
	//   - same system id and timeline: the larger lsn (the stored one on a
	//     tie);
	//   - same system id, different timelines: the later timeline, whatever
	//     the lsns (a promoted standby starts a new timeline);
	//   - a different system id (a rebuilt cluster): token, the newer
	//     observation.
	//
	// The entry keeps the winner's text exactly (with its signature, which
	// the store does not check). A token that does not parse is never
	// stored (Advance returns an error or ignores it). Two concurrent
	// Advances must never leave the lower of their tokens, and an Advance
	// must never lower the entry: in Redis terms, a compare-and-set script
	// (or WATCH/MULTI), not a GET followed by a SET.
	//
	// ttl is positive. After Advance returns, Load returns a token at
	// least as late as token for at least ttl, unless a token of another
	// generation replaced it; the entry expires when ttl has passed since
	// the last Advance that raised it or refreshed it (every Advance
	// refreshes the expiry to at least now+ttl, including one that leaves
	// the stored token in place).
	Advance(ctx context.Context, key, token string, ttl time.Duration) error
}

// MemoryTokenStore is a TokenStore in this process's memory: for one server,
// or for tests. Safe for concurrent use. Expired entries are removed as
// Advance goes (amortized constant time).
type MemoryTokenStore struct {
	mu      sync.Mutex
	entries map[string]memoryEntry
	ops     int // Advances since the last sweep
	now     func() time.Time
}

type memoryEntry struct {
	tok     token.Token
	text    string
	expires time.Time
}

// NewMemoryTokenStore returns an empty MemoryTokenStore.
func NewMemoryTokenStore() *MemoryTokenStore {
	return &MemoryTokenStore{entries: map[string]memoryEntry{}, now: time.Now}
}

// Load implements TokenStore.
func (m *MemoryTokenStore) Load(_ context.Context, key string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[key]
	if !ok {
		return "", nil
	}
	if !m.now().Before(e.expires) {
		delete(m.entries, key)
		return "", nil
	}
	return e.text, nil
}

// Advance implements TokenStore. A token that does not parse is an error and
// changes nothing; so does a ttl that is not positive.
func (m *MemoryTokenStore) Advance(_ context.Context, key, tok string, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("pgryw: token store: ttl %v is not positive", ttl)
	}
	t, err := token.Parse(tok, nil)
	if err != nil {
		return fmt.Errorf("pgryw: token store: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	m.sweep(now)
	exp := now.Add(ttl)
	e, ok := m.entries[key]
	if !ok || !now.Before(e.expires) {
		if t.IsZero() {
			return nil
		}
		m.entries[key] = memoryEntry{tok: t, text: tok, expires: exp}
		return nil
	}
	if w := token.Max(e.tok, t); w != e.tok {
		e.tok, e.text = w, tok
	}
	if exp.After(e.expires) {
		e.expires = exp
	}
	m.entries[key] = e
	return nil
}

// sweep removes expired entries once as many Advances as there are entries
// have run since the last sweep.
func (m *MemoryTokenStore) sweep(now time.Time) {
	m.ops++
	if m.ops < len(m.entries) {
		return
	}
	m.ops = 0
	for k, e := range m.entries {
		if !now.Before(e.expires) {
			delete(m.entries, k)
		}
	}
}
