package token

import (
	"errors"
	"strings"
	"testing"

	"github.com/pgryw/pgryw/internal/lsn"
)

var (
	key1 = []byte("0123456789abcdef0123456789abcdef")
	key2 = []byte("fedcba9876543210fedcba9876543210")
)

var maxToken = Token{SystemID: ^uint64(0), Timeline: ^uint32(0), LSN: ^lsn.LSN(0)}

func TestRoundTrip(t *testing.T) {
	cases := []struct {
		tok  Token
		want string
	}{
		{Token{}, "1.0.0.0"},
		{Token{SystemID: 7345322371478397062, Timeline: 1, LSN: 0x3016A40}, "1.65efd3c798b32086.1.3016a40"},
		{Token{SystemID: 1, Timeline: 0x10, LSN: 0x16_B374D848}, "1.1.10.16b374d848"},
		{Token{SystemID: 0x10, Timeline: 0xabcdef, LSN: 0x100000000}, "1.10.abcdef.100000000"},
		{maxToken, "1.ffffffffffffffff.ffffffff.ffffffffffffffff"},
	}
	for _, c := range cases {
		if got := c.tok.String(); got != c.want {
			t.Errorf("%+v.String() = %q, want %q", c.tok, got, c.want)
		}
		for _, keys := range [][][]byte{nil, {}} {
			got, err := Parse(c.want, keys)
			if err != nil || got != c.tok {
				t.Errorf("Parse(%q, %v) = %+v, %v; want %+v", c.want, keys, got, err, c.tok)
			}
		}
		signed := Sign(c.tok, key1)
		if !strings.HasPrefix(signed, c.want+".") || len(signed) != len(c.want)+1+sigChars {
			t.Errorf("Sign(%+v) = %q, want %q plus a %d-character signature", c.tok, signed, c.want, sigChars)
		}
		for _, keys := range [][][]byte{nil, {key1}, {key2, key1}} {
			got, err := Parse(signed, keys)
			if err != nil || got != c.tok {
				t.Errorf("Parse(%q, %d keys) = %+v, %v; want %+v", signed, len(keys), got, err, c.tok)
			}
		}
	}
	if n := len(maxToken.String()); n != 44 {
		t.Errorf("longest unsigned token is %d bytes, doc says 44", n)
	}
	if n := len(Sign(maxToken, key1)); n != 67 {
		t.Errorf("longest signed token is %d bytes, doc says 67", n)
	}
}

func TestAlphabet(t *testing.T) {
	for _, tok := range []Token{{}, maxToken, {SystemID: 0xabc, Timeline: 3, LSN: 0x1234}} {
		for _, s := range []string{tok.String(), Sign(tok, key1), Sign(tok, key2), Sign(tok, []byte{0})} {
			for i := 0; i < len(s); i++ {
				if !inAlphabet(s[i]) {
					t.Errorf("%q has byte %q outside [0-9A-Za-z_.-]", s, s[i])
				}
			}
		}
	}
}

func TestParseRejects(t *testing.T) {
	good := Sign(Token{SystemID: 0xabc, Timeline: 2, LSN: 0x1234}, key1) // 1.abc.2.1234.<sig>
	sig := sigOf(good)
	cases := []struct {
		name string
		in   string
		want error
	}{
		{"empty", "", ErrMalformed},
		{"dot", ".", ErrMalformed},
		{"empty version", ".1.1.1", ErrMalformed},
		{"version only", "1", ErrMalformed},
		{"version 2", "2.1.1.1", ErrVersion},
		{"version 0", "0.1.1.1", ErrVersion},
		{"version 01", "01.1.1.1", ErrVersion},
		{"version 10", "10.1.1.1", ErrVersion},
		{"version v1", "v1.1.1.1", ErrVersion},
		{"future layout", "2.anything-goes_here", ErrVersion},
		{"too few fields", "1.1.1", ErrMalformed},
		{"too many fields", "1.1.1.1." + sig + ".x", ErrMalformed},
		{"many dots", "1.1.1.1.......", ErrMalformed},
		{"empty systemid", "1..1.1", ErrMalformed},
		{"empty timeline", "1.1..1", ErrMalformed},
		{"empty lsn", "1.1.1.", ErrMalformed},
		{"empty signature", "1.1.1.1.", ErrMalformed},
		{"leading dot", ".1.1.1.1", ErrMalformed},
		{"trailing dot after sig", good + ".", ErrMalformed},
		{"leading zero systemid", "1.01.1.1", ErrMalformed},
		{"leading zero timeline", "1.1.01.1", ErrMalformed},
		{"leading zero lsn", "1.1.1.01", ErrMalformed},
		{"double zero", "1.00.0.0", ErrMalformed},
		{"upper-case hex", "1.ABC.1.1", ErrMalformed},
		{"upper-case lsn", "1.1.1.3016A40", ErrMalformed},
		{"non-hex letter", "1.g.1.1", ErrMalformed},
		{"0x prefix", "1.0x1.1.1", ErrMalformed},
		{"underscore in hex", "1.1_0.1.1", ErrMalformed},
		{"minus in hex", "1.-1.1.1", ErrMalformed},
		{"systemid 65 bits", "1.10000000000000000.1.1", ErrMalformed},
		{"timeline 33 bits", "1.1.100000000.1", ErrMalformed},
		{"lsn 65 bits", "1.1.1.10000000000000000", ErrMalformed},
		{"lsn text form", "1.1.1.0/3016A40", ErrMalformed},
		{"space", "1.1.1.1 ", ErrMalformed},
		{"leading space", " 1.1.1.1", ErrMalformed},
		{"newline", "1.1.1.1\n", ErrMalformed},
		{"nul", "1.1.1.1\x00", ErrMalformed},
		{"plus", "1.+1.1.1", ErrMalformed},
		{"percent", "1.1.1.1%2E", ErrMalformed},
		{"semicolon", "1.1.1.1;x", ErrMalformed},
		{"equals padding", "1.1.1.1." + sig + "==", ErrMalformed},
		{"high byte", "1.1.1.\xff", ErrMalformed},
		{"utf8", "1.1.1.é", ErrMalformed},
		{"too long", "1.1.1.1." + strings.Repeat("A", 200), ErrMalformed},
		{"too long garbage", strings.Repeat("\xff", 1000), ErrMalformed},
		{"short signature", good[:len(good)-1], ErrMalformed},
		{"long signature", good + "A", ErrMalformed},
		{"std base64 signature", "1.1.1.1.+/" + sig[2:], ErrMalformed},
		{"nonzero trailing bits", "1.abc.2.1234." + sig[:sigChars-1] + flipLowBits(sig[sigChars-1]), ErrMalformed},
	}
	for _, c := range cases {
		for _, keys := range [][][]byte{nil, {key1}} {
			got, err := Parse(c.in, keys)
			if !errors.Is(err, c.want) {
				t.Errorf("%s: Parse(%q, %d keys) = %+v, %v; want %v", c.name, c.in, len(keys), got, err, c.want)
			}
			if err != nil && got != (Token{}) {
				t.Errorf("%s: Parse returned %+v with error", c.name, got)
			}
		}
	}
}

// flipLowBits returns the base64url character whose value differs from c's
// in the two low bits, which the last character of a 16-byte encoding
// does not use.
func flipLowBits(c byte) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, c)
	return string(alphabet[i^1])
}

func TestSignatureKeys(t *testing.T) {
	tok := Token{SystemID: 42, Timeline: 3, LSN: 0x5000028}
	s1, s2 := Sign(tok, key1), Sign(tok, key2)
	if s1 == s2 {
		t.Fatalf("different keys gave the same token %q", s1)
	}
	cases := []struct {
		name string
		in   string
		keys [][]byte
		want error
	}{
		{"key1", s1, [][]byte{key1}, nil},
		{"rotation: new key second", s2, [][]byte{key1, key2}, nil},
		{"rotation: new key first", s1, [][]byte{key2, key1}, nil},
		{"old key retired", s1, [][]byte{key2}, ErrSignature},
		{"wrong key", s2, [][]byte{key1}, ErrSignature},
		{"unsigned with keys", tok.String(), [][]byte{key1}, ErrSignature},
		{"unsigned with rotation keys", tok.String(), [][]byte{key1, key2}, ErrSignature},
		{"empty key in list skipped", s1, [][]byte{{}, key1}, nil},
		{"only empty keys", s1, [][]byte{{}}, ErrSignature},
		{"only empty keys, unsigned", tok.String(), [][]byte{nil}, ErrSignature},
		{"key prefix", s1, [][]byte{key1[:31]}, ErrSignature},
		{"no keys, signed", s1, nil, nil},
		{"no keys, unsigned", tok.String(), nil, nil},
		{"signature from other token", tok.String() + "." + sigOf(Sign(Token{SystemID: 42, Timeline: 3, LSN: 0x5000029}, key1)), [][]byte{key1}, ErrSignature},
	}
	for _, c := range cases {
		got, err := Parse(c.in, c.keys)
		if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%s: Parse(%q) error %v, want %v", c.name, c.in, err, c.want)
			continue
		}
		if err == nil && got != tok {
			t.Errorf("%s: Parse(%q) = %+v, want %+v", c.name, c.in, got, tok)
		}
	}
}

func sigOf(s string) string { return s[strings.LastIndexByte(s, '.')+1:] }

func TestSignEmptyKeyPanics(t *testing.T) {
	for _, k := range [][]byte{nil, {}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Sign with key %v did not panic", k)
				}
			}()
			Sign(Token{}, k)
		}()
	}
}

// TestTamper replaces each byte of a signed token with every other byte
// value; no result may parse under the signing key.
func TestTamper(t *testing.T) {
	for _, tok := range []Token{{}, {SystemID: 0x65efd3c798b32086, Timeline: 1, LSN: 0x3016A40}, maxToken} {
		s := Sign(tok, key1)
		b := []byte(s)
		for i := range b {
			orig := b[i]
			for v := 0; v < 256; v++ {
				if byte(v) == orig {
					continue
				}
				b[i] = byte(v)
				if got, err := Parse(string(b), [][]byte{key1, key2}); err == nil {
					t.Errorf("tampered %q (byte %d of %q) parsed as %+v", b, i, s, got)
				}
			}
			b[i] = orig
		}
		// Truncations and extensions.
		for i := 0; i < len(s); i++ {
			if _, err := Parse(s[:i], [][]byte{key1}); err == nil {
				t.Errorf("truncated %q parsed", s[:i])
			}
		}
	}
}

func TestErrorClipsInput(t *testing.T) {
	secret := strings.Repeat("x", 30) + "SECRET-TAIL"
	for _, in := range []string{
		"1." + secret, "9." + secret, "1.1.1.1.AAAAAAAAAAAAAAAAAAAAAA" + secret,
		Sign(Token{SystemID: 1}, key2), "1.1.1.1" + secret + strings.Repeat("\xff", 500),
	} {
		_, err := Parse(in, [][]byte{key1})
		if err == nil {
			t.Fatalf("Parse(%q) succeeded", in)
		}
		msg := err.Error()
		if strings.Contains(msg, "SECRET") || len(msg) > 120 {
			t.Errorf("error for %d-byte input echoes too much: %q", len(in), msg)
		}
	}
}

func TestMax(t *testing.T) {
	a := Token{SystemID: 7, Timeline: 1, LSN: 100}
	a2 := Token{SystemID: 7, Timeline: 1, LSN: 200}
	b := Token{SystemID: 7, Timeline: 2, LSN: 50}
	c := Token{SystemID: 8, Timeline: 1, LSN: 10}
	cases := []struct {
		name       string
		x, y, want Token
	}{
		{"zero zero", Token{}, Token{}, Token{}},
		{"zero left", Token{}, a, a},
		{"zero right", a, Token{}, a},
		{"same gen, larger right", a, a2, a2},
		{"same gen, larger left", a2, a, a2},
		{"equal", a, a, a},
		{"later timeline right, smaller lsn", a2, b, b},
		{"later timeline left, smaller lsn", b, a2, b},
		{"other system: b wins", a2, c, c},
		{"other system: b wins (swapped)", c, a2, a2},
		{"other system with later timeline", b, c, c},
	}
	for _, cs := range cases {
		if got := Max(cs.x, cs.y); got != cs.want {
			t.Errorf("%s: Max(%+v, %+v) = %+v, want %+v", cs.name, cs.x, cs.y, got, cs.want)
		}
	}
}

var fuzzKey = []byte("fuzz-key-fuzz-key-fuzz-key-fuzz!")

func FuzzParse(f *testing.F) {
	for _, tok := range []Token{{}, {SystemID: 0x65efd3c798b32086, Timeline: 1, LSN: 0x3016A40}, maxToken, {SystemID: 1, Timeline: 2, LSN: 3}} {
		f.Add(tok.String())
		f.Add(Sign(tok, fuzzKey))
		f.Add(Sign(tok, key1))
	}
	for _, s := range []string{"", ".", "1", "1.", "1...", "2.1.1.1", "1.01.1.1", "1.A.1.1", "1.1.1.1.", "1.1.1.1.AAAAAAAAAAAAAAAAAAAAAA", "1.1.1.1.AAAAAAAAAAAAAAAAAAAAAB", "1.10000000000000000.1.1", "1.1.100000000.1", "1.1.1.1\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := Parse(s, nil)
		if err != nil {
			if tok != (Token{}) {
				t.Fatalf("Parse(%q) returned %+v with error %v", s, tok, err)
			}
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) {
				t.Fatalf("Parse(%q) without keys: unexpected error %v", s, err)
			}
		} else {
			u := tok.String()
			if s != u && !(len(s) == len(u)+1+sigChars && strings.HasPrefix(s, u+".")) {
				t.Fatalf("Parse(%q) = %+v, which encodes as %q", s, tok, u)
			}
		}
		ktok, kerr := Parse(s, [][]byte{fuzzKey})
		if kerr == nil {
			if err != nil || ktok != tok {
				t.Fatalf("Parse(%q) with key = %+v, without = %+v, %v", s, ktok, tok, err)
			}
			if re := Sign(ktok, fuzzKey); re != s {
				t.Fatalf("Parse(%q) with key = %+v, which signs as %q", s, ktok, re)
			}
		} else if ktok != (Token{}) {
			t.Fatalf("Parse(%q) with key returned %+v with error %v", s, ktok, kerr)
		}
	})
}
