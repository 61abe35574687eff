package pgryw

import (
	"testing"

	"github.com/pgryw/pgryw/internal/lsn"
)

func TestSessionTokenRoundTrip(t *testing.T) {
	s := NewSession()
	if s.Token() != "" {
		t.Fatal("an empty session has a token")
	}
	g := generation{system: 7713981868250623273, timeline: 1}
	s.advanceAt(g, 0x3016A40)
	s.advanceAt(g, 0x3000000) // positions only move forward
	r := NewSession()
	if err := r.Observe(s.Token()); err != nil {
		t.Fatal(err)
	}
	if rg, rl := r.position(); rg != g || rl != 0x3016A40 {
		t.Fatalf("observed %v %v", rg, rl)
	}
	// Observing an older token moves nothing; a later timeline wins.
	older := NewSession()
	older.advanceAt(g, 0x100)
	if err := r.Observe(older.Token()); err != nil {
		t.Fatal(err)
	}
	if _, rl := r.position(); rl != 0x3016A40 {
		t.Fatalf("went back to %v", rl)
	}
	later := NewSession()
	later.advanceAt(generation{system: g.system, timeline: 2}, 0x10)
	if err := r.Observe(later.Token()); err != nil {
		t.Fatal(err)
	}
	if rg, rl := r.position(); rg.timeline != 2 || rl != 0x10 {
		t.Fatalf("later timeline not taken: %v %v", rg, rl)
	}
	if err := r.Observe(s.Token()); err != nil {
		t.Fatal(err)
	}
	if rg, _ := r.position(); rg.timeline != 2 {
		t.Fatal("an earlier timeline replaced a later one")
	}
	for _, bad := range []string{"x", "1.", "2.1.1.1", "1.1.1.1.1", "1.01.1.1", "1.1.1.1 "} {
		if err := NewSession().Observe(bad); err == nil {
			t.Errorf("Observe(%q) accepted", bad)
		}
	}
	if err := NewSession().Observe(""); err != nil {
		t.Fatalf("empty token: %v", err)
	}
}

func FuzzObserve(f *testing.F) {
	s := NewSession()
	s.advanceAt(generation{system: 1, timeline: 1}, lsn.LSN(0x3016A40))
	f.Add(s.Token())
	signed := NewSession(SessionKeys([]byte("k")))
	signed.advanceAt(generation{system: 1, timeline: 1}, 5)
	f.Add(signed.Token())
	f.Add("1.0.0.0")
	f.Add("")
	f.Fuzz(func(t *testing.T, tok string) {
		for _, s := range []*Session{NewSession(), NewSession(SessionKeys([]byte("k")))} {
			before := s.Token()
			if err := s.Observe(tok); err != nil {
				if s.Token() != before {
					t.Fatalf("a rejected token changed the session: %q", tok)
				}
				continue
			}
			// Whatever was taken in comes back out as a token that parses.
			if out := s.Token(); out != "" {
				if err := NewSession(SessionKeys(s.keys...)).Observe(out); err != nil {
					t.Fatalf("Token() %q of %q does not parse: %v", out, tok, err)
				}
			}
		}
	})
}
