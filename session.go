package pgryw

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgryw/pgryw/internal/lsn"
	"github.com/pgryw/pgryw/internal/token"
)

// A Session is whatever owns a read-your-writes watermark: each connection
// has one, with session_scope=db the connector has one more shared by the
// whole pool, and an application can make its own (NewSession) to carry
// across requests, processes and devices as a token. A committed write
// advances every watermark its connection answers to, and the Session of
// its context; a replica read waits for the highest of them. A read raises
// only its connection's watermark, to a position at or past everything it
// saw (monotonic reads): the pool's watermark and an application's Session
// move with writes alone, so one session's reads never make another wait.

// Session is a read-your-writes position that outlives connections: what a
// session knows of its writes (the primary's position after its latest
// commit, and the primary's generation that position belongs to). Attach it
// to a context with WithSession: statements run with that context advance
// it and replica reads wait for it. Carry it between requests, processes or
// devices as a string with Token and Observe. A Session is safe for
// concurrent use; the zero value is not ready (use NewSession).
type Session struct {
	wm lsn.Watermark
	// lost counts commits (or, for a connection, reads) whose position is
	// not known: the capture failed, the connection broke, or the caller's
	// context ended while the answer was on its way. covered is the highest
	// lost count that a later capture is known to cover. While lost exceeds
	// covered, the next replica read captures a position first: a capture
	// sent after the lost event covers it. Counting, rather than a flag,
	// lets a capture that was already on its way when another connection
	// lost a position leave that loss pending.
	lost    atomic.Uint64
	covered atomic.Uint64

	mu   sync.Mutex
	gen  generation // the primary generation of wm's position; zero: none yet
	keys [][]byte   // token keys: the first signs, all verify

	// set: a connection's own Session records its primary session's
	// settings here, which its replica connections are given (state.go).
	// Only that connection touches them, one statement at a time.
	set settings

	// inflight: captures of this Session's possible commits whose answers
	// were still on their way when the statements returned (deferred.go).
	inflight pendingSet
	// by: the connector of the Session's last possible commit, which a
	// token asks for a fresh position when that commit's was lost.
	by atomic.Pointer[Connector]
}

// generation names one history of the primary: its system identifier and
// timeline. Positions of different generations are not comparable.
type generation struct {
	system   uint64
	timeline uint32
}

// SessionOption configures NewSession.
type SessionOption func(*Session)

// SessionKeys makes the Session's tokens signed (HMAC-SHA256 with the first
// key) and makes Observe accept only tokens signed with one of the keys, so
// that a client cannot forge a far-future position. List a new key first
// and keep the old ones while tokens signed with them may still arrive.
func SessionKeys(keys ...[]byte) SessionOption {
	cp := make([][]byte, len(keys))
	for i, k := range keys {
		cp[i] = append([]byte(nil), k...)
	}
	return func(s *Session) { s.keys = append(s.keys, cp...) }
}

// NewSession returns an empty Session: no position until a write commits
// with it or a token is observed.
func NewSession(opts ...SessionOption) *Session {
	s := &Session{}
	for _, o := range opts {
		o(s)
	}
	return s
}

// signed reports whether the session's tokens are signed (it has keys).
func (s *Session) signed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys) > 0
}

// Token returns the session's position as a compact string, safe in a
// URL, an HTTP header, a cookie or a job payload (signed when the Session
// has keys), or "" before the session has a position. Another Session, in
// this process or another, takes it in with Observe.
//
// A commit of the Session's whose position did not arrive (its capture's
// answer is late, or its connection broke right after the commit's answer)
// is covered with a position read afresh on a new connection to the
// primary; when that fails too, the token is the last position known,
// which may not cover that commit. TokenContext bounds the wait and says
// so.
func (s *Session) Token() string {
	ctx, cancel := context.WithTimeout(context.Background(), tokenTimeout)
	defer cancel()
	t, _ := s.TokenContext(ctx)
	return t
}

// tokenTimeout bounds Token's wait for a position it must read afresh.
const tokenTimeout = 5 * time.Second

// TokenContext is Token within ctx. Its error says that a commit's
// position could not be read (ctx ended, or the primary could not be
// reached) and the token returned, the last position known, may not cover
// it.
func (s *Session) TokenContext(ctx context.Context) (string, error) {
	if c := s.by.Load(); c != nil {
		c.uses.Add(1) // the Session's next write keeps its capture (captureLater)
	}
	// Writes that returned before their positions arrived (deferred.go).
	late, err := s.inflight.settleOthers(ctx, nil)
	if seen, lost := s.pending(); err == nil && (len(late) > 0 || lost) {
		if c := s.by.Load(); c != nil {
			var gen generation
			var l lsn.LSN
			if gen, l, err = c.freshPosition(ctx); err == nil {
				s.advanceAt(gen, l)
				s.cover(seen)
				for _, p := range late {
					p.retire(false, s)
				}
			}
		}
	}
	s.mu.Lock()
	t, keys := s.token(), s.keys
	s.mu.Unlock()
	switch {
	case t.LSN == 0:
		return "", err
	case len(keys) > 0:
		return token.Sign(t, keys[0]), err
	}
	return t.String(), err
}

// token returns the position as a token.Token. Call it with s.mu held.
func (s *Session) token() token.Token {
	return token.Token{SystemID: s.gen.system, Timeline: s.gen.timeline, LSN: s.wm.Load()}
}

// Observe merges a token from Token into the session: its position only
// moves forward (a token of another primary generation replaces it; the
// next replica read rebases it onto the current primary). A malformed
// token, or with keys one not signed with any of them, is an error and
// changes nothing. An empty token is no position and no error. A position
// beyond anything the primary has written is clamped to the primary's
// position when the session is next used (Stats.TokensClamped), so a forged
// unsigned token cannot make reads wait.
func (s *Session) Observe(tok string) error {
	if tok == "" {
		return nil
	}
	s.mu.Lock()
	keys := s.keys
	s.mu.Unlock()
	t, err := token.Parse(tok, keys)
	if err != nil {
		return fmt.Errorf("pgryw: token: %w", err)
	}
	if t.LSN == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Within a generation the larger position; across generations the later
	// timeline of one system, or from another system the token observed
	// last (token.Max).
	cur := s.token()
	m := token.Max(cur, t)
	if m == cur {
		return nil
	}
	if m.SystemID != cur.SystemID || m.Timeline != cur.Timeline {
		s.wm.Set(m.LSN)
	}
	s.gen = generation{system: m.SystemID, timeline: m.Timeline}
	s.wm.Advance(m.LSN)
	return nil
}
