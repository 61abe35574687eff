// Package token encodes read-your-writes positions that travel between
// processes: in cookies, HTTP headers, query parameters and job payloads.
//
// A Token names a writer generation (the primary's system identifier and
// timeline) and a WAL position on it. Its text form is
//
//	1.<systemid>.<timeline>.<lsn>              unsigned
//	1.<systemid>.<timeline>.<lsn>.<signature>  signed
//
// where
//
//   - "1" is the format version;
//   - <systemid> (64 bits), <timeline> (32 bits) and <lsn> (64 bits) are
//     lower-case hexadecimal with no leading zeros, and a zero value is
//     written "0" (so at most 16, 8 and 16 digits);
//   - <signature> is HMAC-SHA256, keyed by the caller's key, over the bytes of
//     the unsigned form (version included), truncated to its first 16 bytes
//     and written in unpadded base64url (RFC 4648 §5): exactly 22 characters,
//     the last of which has its two unused low bits zero.
//
// For example, system 7345322371478397062, timeline 1, LSN 0/3016A40 is
// "1.65efd3c798b32086.1.3016a40". Every value has exactly one encoding, so a
// token that parses re-encodes byte for byte. The whole string uses only
// [0-9A-Za-z_.-], which needs no escaping in a cookie value, an HTTP header
// or a URL, and is at most 44 bytes unsigned and 67 bytes signed. The zero
// Token ("no position") encodes as "1.0.0.0".
//
// Parse is strict: it rejects anything that is not exactly a canonical
// encoding, so a token that parses carries no caller text along.
//
// Signatures stop clients from forging positions (for example, a position
// far in the future that would make every read wait for a timeout). Give
// Parse several keys to rotate: sign with the new key while old tokens,
// signed with the old one, still verify. Keys should be at least 32 random
// bytes and used for nothing else.
package token

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"

	"github.com/pgryw/pgryw/internal/lsn"
)

// Token is a read-your-writes position: WAL position LSN on the writer
// identified by SystemID (pg_control_system().system_identifier) and
// Timeline. The zero value means "no position".
type Token struct {
	SystemID uint64
	Timeline uint32
	LSN      lsn.LSN
}

// Errors returned (wrapped) by Parse; test for them with errors.Is.
var (
	// ErrMalformed means the text is not a canonical token encoding.
	ErrMalformed = errors.New("token: malformed")
	// ErrVersion means the text starts with a format version other than 1.
	ErrVersion = errors.New("token: unsupported version")
	// ErrSignature means keys were given and the token is unsigned or its
	// signature verifies under none of them.
	ErrSignature = errors.New("token: bad signature")
)

const (
	version = "1"
	// maxLen bounds the input before any other work; the longest canonical
	// token is 67 bytes.
	maxLen = 128
	// sigBytes is the truncated HMAC length; sigChars its base64url length.
	sigBytes = 16
	sigChars = 22
)

var sigEncoding = base64.RawURLEncoding.Strict()

// IsZero reports whether t is the zero Token ("no position").
func (t Token) IsZero() bool { return t == Token{} }

// String returns the unsigned encoding of t, such as "1.65efd3c798b32086.1.3016a40".
func (t Token) String() string {
	b := make([]byte, 0, 44)
	return string(t.appendUnsigned(b))
}

func (t Token) appendUnsigned(b []byte) []byte {
	b = append(b, version...)
	b = append(b, '.')
	b = strconv.AppendUint(b, t.SystemID, 16)
	b = append(b, '.')
	b = strconv.AppendUint(b, uint64(t.Timeline), 16)
	b = append(b, '.')
	return strconv.AppendUint(b, uint64(t.LSN), 16)
}

// Sign returns the signed encoding of t under key. It panics if key is
// empty: an empty key is a configuration error, and Parse never accepts a
// signature made with one.
func Sign(t Token, key []byte) string {
	if len(key) == 0 {
		panic("token: Sign with an empty key")
	}
	b := make([]byte, 0, 67)
	b = t.appendUnsigned(b)
	mac := sum(key, b)
	b = append(b, '.')
	b = sigEncoding.AppendEncode(b, mac[:sigBytes])
	return string(b)
}

func sum(key, msg []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write(msg)
	return h.Sum(nil)
}

// Parse decodes a token produced by Token.String or Sign.
//
// With keys non-empty, the token must be signed, and its signature must
// verify under at least one of the keys (compared in constant time); empty
// keys in the list never verify anything. Otherwise the error wraps
// ErrSignature.
//
// With no keys, both forms parse and a signature, which must still be
// well-formed, is not checked: without a key nothing can be verified, and
// anyone could strip the signature to get an unsigned token that parses
// anyway, so ignoring it accepts nothing that would otherwise be refused.
// Callers that need authentication must pass keys.
//
// Text that is not a canonical encoding gives an error wrapping ErrMalformed,
// or ErrVersion if its first field is a version other than "1". Error
// messages quote at most a short prefix of s.
func Parse(s string, keys [][]byte) (Token, error) {
	if len(s) > maxLen {
		return Token{}, fail(ErrMalformed, "too long", s)
	}
	for i := 0; i < len(s); i++ {
		if !inAlphabet(s[i]) {
			return Token{}, fail(ErrMalformed, "invalid character", s)
		}
	}
	var f [6]string
	n := split(s, &f)
	if f[0] != version {
		if f[0] == "" {
			return Token{}, fail(ErrMalformed, "empty version", s)
		}
		return Token{}, fail(ErrVersion, "", s)
	}
	if n != 4 && n != 5 {
		return Token{}, fail(ErrMalformed, "wrong number of fields", s)
	}
	sys, ok1 := parseHex(f[1], 16)
	tli, ok2 := parseHex(f[2], 8)
	pos, ok3 := parseHex(f[3], 16)
	if !ok1 || !ok2 || !ok3 {
		return Token{}, fail(ErrMalformed, "non-canonical number", s)
	}
	t := Token{SystemID: sys, Timeline: uint32(tli), LSN: lsn.LSN(pos)}
	if n == 4 {
		if len(keys) > 0 {
			return Token{}, fail(ErrSignature, "unsigned", s)
		}
		return t, nil
	}
	var sig [sigBytes]byte
	if len(f[4]) != sigChars {
		return Token{}, fail(ErrMalformed, "bad signature encoding", s)
	}
	if m, err := sigEncoding.Decode(sig[:], []byte(f[4])); err != nil || m != sigBytes {
		return Token{}, fail(ErrMalformed, "bad signature encoding", s)
	}
	if len(keys) == 0 {
		return t, nil
	}
	msg := []byte(s[:len(s)-sigChars-1])
	ok := false
	for _, k := range keys {
		if len(k) == 0 {
			continue
		}
		if hmac.Equal(sum(k, msg)[:sigBytes], sig[:]) {
			ok = true
		}
	}
	if !ok {
		return Token{}, fail(ErrSignature, "", s)
	}
	return t, nil
}

func inAlphabet(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' ||
		c == '-' || c == '_' || c == '.'
}

// split cuts s at '.' into f and returns the number of fields, stopping
// (and returning len(f)) once there are more fields than f holds.
func split(s string, f *[6]string) int {
	n, start := 0, 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == '.' {
			if n == len(f) {
				return n
			}
			f[n] = s[start:i]
			n++
			start = i + 1
		}
	}
	return n
}

// parseHex accepts only canonical lower-case hex: one to max digits, no
// leading zero unless the value is zero (then exactly "0").
func parseHex(s string, max int) (uint64, bool) {
	if len(s) == 0 || len(s) > max || len(s) > 1 && s[0] == '0' {
		return 0, false
	}
	var v uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		default:
			return 0, false
		}
		v = v<<4 | uint64(d)
	}
	return v, true
}

func fail(sentinel error, reason, s string) error {
	const clipLen = 24
	q := s
	if len(q) > clipLen {
		q = q[:clipLen] + "…"
	}
	if reason == "" {
		return fmt.Errorf("%w: %q", sentinel, q)
	}
	return fmt.Errorf("%w (%s): %q", sentinel, reason, q)
}

// Max returns the later of two positions.
//
// A zero Token is "no position", so Max returns the other argument. For the
// same generation (equal SystemID and Timeline) it returns the one with the
// larger LSN (a on a tie). For the same SystemID on different timelines it
// returns the one on the later timeline, whatever the LSNs: a promoted
// standby starts a higher timeline, and a position past the fork on the
// older one may never exist on the newer. For different SystemIDs (a
// different cluster, for example one restored or re-initialised) the
// positions are incomparable, and Max returns b, taken to be the newer
// observation; Max is then not commutative. In both cross-generation cases
// the caller must notice the generation change (compare SystemID and
// Timeline) and handle it, for example by resetting its watermark.
func Max(a, b Token) Token {
	switch {
	case a.IsZero():
		return b
	case b.IsZero():
		return a
	case a.SystemID != b.SystemID:
		return b
	case a.Timeline != b.Timeline:
		if a.Timeline > b.Timeline {
			return a
		}
		return b
	case b.LSN > a.LSN:
		return b
	default:
		return a
	}
}
