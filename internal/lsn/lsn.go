// Package lsn holds pgryw's WAL position type.
//
// A PostgreSQL LSN is a 64-bit byte offset into the WAL. Its text form is
// "X/Y", the high and low 32 bits in hex; PostgreSQL 19 zero-pads the low
// half to eight digits and older servers do not, so Parse accepts both and
// String always pads. Positions are compared as integers: string order is
// wrong across digit-count boundaries (unpadded "0/FFFFFFF" sorts after
// "0/10000000").
package lsn

import (
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
)

// LSN is a WAL position. The zero value means "no position".
type LSN uint64

// ErrSyntax is returned (wrapped) by Parse for text that is not an LSN.
var ErrSyntax = errors.New("invalid LSN syntax")

// Parse reads the "X/Y" text form: one to eight hex digits on each side of
// the slash, nothing else (no spaces, signs or prefixes), so the result can be
// formatted back into SQL without carrying any caller text along.
func Parse(s string) (LSN, error) {
	slash := -1
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			slash = i
			break
		}
	}
	if slash < 1 || slash > 8 || len(s)-slash-1 < 1 || len(s)-slash-1 > 8 {
		return 0, fmt.Errorf("%w: %q", ErrSyntax, clip(s))
	}
	hi, ok1 := parseHex(s[:slash])
	lo, ok2 := parseHex(s[slash+1:])
	if !ok1 || !ok2 {
		return 0, fmt.Errorf("%w: %q", ErrSyntax, clip(s))
	}
	return LSN(hi<<32 | lo), nil
}

// parseHex accepts only [0-9A-Fa-f]; strconv.ParseUint would also take
// underscores and a "0x" prefix with base 0, and we want neither.
func parseHex(s string) (uint64, bool) {
	var v uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		v = v<<4 | uint64(d)
	}
	return v, true
}

// clip keeps error messages short when the input is long garbage.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// String formats l as PostgreSQL 19 does ("0/03016A40"); every server
// version parses this form.
func (l LSN) String() string {
	return fmt.Sprintf("%X/%08X", uint64(l)>>32, uint32(l))
}

// Decimal is the unsigned decimal form PolarDB's polar_xact_split_wait_lsn takes.
func (l LSN) Decimal() string { return strconv.FormatUint(uint64(l), 10) }

// ReplayTarget turns a pg_current_wal_insert_lsn() reading into the position
// a standby's replay position reaches once it has replayed everything
// before it. When the last record ends exactly at a WAL page boundary, the
// insert position points past the next page's header (24 bytes, or 40 at a
// segment start), where nothing has been written yet; replay stops at the
// boundary and would pass the raw value only once more WAL arrives (seen:
// 14 s on an idle server). The boundary is an equivalent target: replay
// positions are ends of records, and none lies strictly inside a page
// header, because a record that continues onto a page has at least one
// byte after the header and a record that starts after it is at least 24
// bytes long, so no record can end at 24 or 40 bytes into a page unless it
// spans the boundary, in which case no replay position equals the boundary
// before it.
func ReplayTarget(insert LSN, blockSize uint64) LSN {
	const shortHeader, longHeader = 24, 40
	if blockSize == 0 {
		return insert
	}
	if off := uint64(insert) % blockSize; off == shortHeader || off == longHeader {
		return insert - LSN(off)
	}
	return insert
}

// Watermark is a position that only moves forward; it is safe for concurrent use.
type Watermark struct{ v atomic.Uint64 }

// Load returns the current position.
func (w *Watermark) Load() LSN { return LSN(w.v.Load()) }

// Advance raises the watermark to l if l is higher, and reports whether it moved.
func (w *Watermark) Advance(l LSN) bool {
	for {
		cur := w.v.Load()
		if uint64(l) <= cur {
			return false
		}
		if w.v.CompareAndSwap(cur, uint64(l)) {
			return true
		}
	}
}

// Reset sets the watermark to zero. Only for a new writer history: within one
// history a watermark must never move back.
func (w *Watermark) Reset() { w.v.Store(0) }

// Set moves the watermark to l, even back, in one step: a reader sees the
// old position or l, never zero in between. Only for moving onto a new writer
// history.
func (w *Watermark) Set(l LSN) { w.v.Store(uint64(l)) }
