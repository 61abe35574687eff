package sqlclass

import (
	"strings"
	"unicode/utf8"
)

// maxParenDepth bounds the parenthesis stack on hostile input; the server's
// own stack-depth limit rejects far less.
const maxParenDepth = 1000

// level is the state of one parenthesis depth while reading a query.
type level struct {
	start   int  // index of the level's first token
	opParen bool // opened by OPERATOR( or DISTINCT ON (: its ')' ends no operand
	cteList bool // inside "WITH a AS (...), b(x) AS (...)" before the main statement
	groupBy bool // inside a GROUP BY list, where CUBE( and ROLLUP( are syntax
}

// query reads a SELECT, VALUES, TABLE, WITH or parenthesised query: anything
// that writes or locks marks the part, and calls are collected.
func (c *classifier) query(ts []stok) part {
	p := part{reason: "SELECT"}
	switch ts[0].kw {
	case kwValues, kwTable:
		p.reason = ts[0].kw.upper()
	}
	var buf [16]level
	levels := append(buf[:0], level{})
	for i := 0; i < len(ts); i++ {
		t := &ts[i]
		cur := len(levels) - 1
		switch t.kind {
		case TokLParen:
			lv := level{start: i + 1}
			if i > 0 && isName(ts[i-1]) {
				if j, ok := c.isCall(ts, i, levels[cur]); ok {
					c.addCall(ts, j, i, &p)
				}
				switch k := ts[i-1].kw; {
				case k == kwOperator && kindAt(ts, i-2) != TokDot:
					lv.opParen = true
				case k == kwOn && keywordAt(ts, i-2) == kwDistinct:
					lv.opParen = true
				case k == kwSets && levels[cur].groupBy:
					lv.groupBy = true
				}
			} else if i > 0 && ts[i-1].kind == TokRParen && levels[cur].cteList {
				// "WITH a AS (...) (SELECT ...)": the main query has begun.
				levels[cur].cteList = false
			}
			if len(levels) > maxParenDepth {
				p.markWrite("nested too deeply")
				return p
			}
			levels = append(levels, lv)
		case TokRParen:
			if cur == 0 {
				p.markWrite("unbalanced parentheses")
				continue
			}
			if levels[cur].opParen {
				t.flags |= flagNonOperand
			}
			levels = levels[:cur]
		case TokIdent:
			if t.kw != noKeyword {
				c.queryKeyword(ts, i, &levels[cur], &p)
			}
			if p.node == "" && kindAt(ts, i+1) != TokLParen {
				if n := c.src[t.start:t.end]; isNodeRelation(n) {
					p.node = strings.ToLower(n)
				}
			}
		}
	}
	if len(levels) != 1 {
		p.markWrite("unbalanced parentheses")
	}
	return p
}

// queryKeyword handles the keywords that matter inside a query.
func (c *classifier) queryKeyword(ts []stok, i int, lv *level, p *part) {
	k := ts[i].kw
	switch k {
	case kwInsert, kwUpdate, kwDelete, kwMerge:
		// A data-modifying statement inside WITH (at any depth). Unreserved,
		// these words may also be column or table names: ones beside a '.'
		// or after AS are names for sure; other uses go to the writer.
		if kindAt(ts, i-1) == TokDot || kindAt(ts, i+1) == TokDot || keywordAt(ts, i-1) == kwAs {
			return
		}
		lv.cteList = false
		p.markWrite(k.upper())
	case kwFor:
		if r := lockingClause(ts, i+1); r != "" {
			p.markWrite(r)
		}
		lv.groupBy = false
	case kwInto:
		p.markWrite("SELECT INTO")
		j := i + 1
		if k := keywordAt(ts, j); k == kwLocal || k == kwGlobal {
			j++
		}
		if k := keywordAt(ts, j); k == kwTemp || k == kwTemporary ||
			j+1 < len(ts) && ts[j+1].kind == TokDot && c.isTempSchema(ts[j]) {
			p.markPin("SELECT INTO TEMP", StateTemp)
		}
	case kwWith:
		// Only a WITH that opens its query level starts a CTE list; the
		// word also appears in WITH ORDINALITY, WITH TIME ZONE, WITH TIES.
		if i == lv.start && i+1 < len(ts) && isName(ts[i+1]) {
			lv.cteList = true
		}
	case kwSelect, kwValues, kwTable:
		lv.cteList = false
	case kwGroup:
		if keywordAt(ts, i+1) == kwBy {
			lv.groupBy = true
		}
	case kwHaving, kwWindow, kwOrder, kwLimit, kwOffset, kwFetch, kwUnion, kwIntersect, kwExcept:
		lv.groupBy = false
	}
}

// lockingClause recognises the row-locking forms after FOR; FOR also appears
// in substring(x FOR n), overlay(... FOR n) and FOR ORDINALITY.
func lockingClause(ts []stok, j int) string {
	switch keywordAt(ts, j) {
	case kwUpdate:
		return "FOR UPDATE"
	case kwShare:
		return "FOR SHARE"
	case kwNo:
		if keywordAt(ts, j+1) == kwKey && keywordAt(ts, j+2) == kwUpdate {
			return "FOR NO KEY UPDATE"
		}
	case kwKey:
		if keywordAt(ts, j+1) == kwShare {
			return "FOR KEY SHARE"
		}
	}
	return ""
}

// isCall decides whether the '(' at ts[i], which follows a name, opens the
// argument list of a function call. It returns the index of the first token
// of the (possibly qualified) function name.
//
// The rule is "a call unless the grammar says otherwise": missing a call
// could send a writing function to a replica, while a false call only costs
// a catalog look-up or a replica read.
func (c *classifier) isCall(ts []stok, i int, lv level) (int, bool) {
	last := i - 1
	j := last
	for j >= 2 && ts[j-1].kind == TokDot && isName(ts[j-2]) {
		j -= 2
	}
	qualified := j < last
	prev := stok{kind: TokError}
	if j > 0 {
		prev = ts[j-1]
	}
	pk := prev.kw
	switch {
	case prev.kind == TokTypecast:
		return 0, false // x::numeric(10,2)
	case pk == kwAs:
		return 0, false // alias column list, CAST(x AS varchar(3))
	case pk == kwWith || pk == kwRecursive:
		return 0, false // WITH cte(a, b) AS
	case pk == kwTablesample:
		return 0, false // TABLESAMPLE bernoulli(10): a handler, not a call
	case prev.kind == TokComma && lv.cteList:
		return 0, false // WITH a AS (...), b(x) AS (...)
	case endsOperand(prev):
		// Two operands cannot be adjacent, so a name after one is an alias
		// with a column list (FROM t x(a, b)) or a type modifier
		// (interval '1' second(3)).
		return 0, false
	}
	if qualified || ts[last].kind != TokIdent || ts[last].kw == noKeyword {
		return j, true
	}
	k := ts[last].kw
	switch k.category() {
	case catReserved, catColName:
		// These cannot name a function unless quoted or qualified: IN (,
		// EXISTS (, ANY (, CAST(, ROW(, VALUES (, COALESCE(, varchar(10)...
		return 0, false
	}
	switch k {
	case kwOperator:
		return 0, false // OPERATOR(pg_catalog.+)
	case kwJoin:
		switch pk {
		case kwNatural, kwLeft, kwRight, kwFull, kwInner, kwOuter, kwCross:
			return 0, false // LEFT JOIN (a JOIN b ...)
		}
	case kwBy:
		switch pk {
		case kwGroup, kwOrder, kwPartition:
			return 0, false // ORDER BY (a)
		}
	case kwSets:
		if pk == kwGrouping {
			return 0, false
		}
	case kwCube, kwRollup:
		if lv.groupBy && (pk == kwBy || pk == kwDistinct || pk == kwAll ||
			prev.kind == TokComma || prev.kind == TokLParen) {
			return 0, false // GROUP BY ROLLUP(a, b)
		}
	case kwMaterialized:
		if pk == kwAs || pk == kwNot && keywordAt(ts, j-2) == kwAs {
			return 0, false // a AS NOT MATERIALIZED (...)
		}
	case kwVarying:
		switch pk {
		case kwCharacter, kwChar, kwNchar, kwBit:
			return 0, false // character varying(10)
		}
	case kwSecond, kwMinute, kwHour, kwDay, kwMonth, kwYear:
		if pk == kwInterval {
			return 0, false // interval second(3)
		}
		if pk == kwTo {
			switch keywordAt(ts, j-2) {
			case kwYear, kwDay, kwHour, kwMinute:
				return 0, false // interval '1' day to second(3)
			}
		}
	case kwZone:
		if pk == kwTime {
			return 0, false // AT TIME ZONE ('UTC')
		}
	case kwFirst, kwNext:
		if pk == kwFetch {
			return 0, false // FETCH FIRST (5) ROWS ONLY
		}
	}
	return j, true
}

// endsOperand reports a token after which an expression has just ended.
func endsOperand(t stok) bool {
	switch t.kind {
	case TokIdent:
		// Keywords are excluded: an unknown future keyword treated as a
		// plain name here could hide the call after it.
		return t.kw == noKeyword
	case TokQuotedIdent, TokString, TokDollarString, TokNumber, TokParam, TokRBracket:
		return true
	case TokRParen:
		return t.flags&flagNonOperand == 0
	}
	return false
}

// maxFuncs bounds the unknown functions kept per statement string; past it
// the string goes to the writer rather than cost quadratic bookkeeping.
const maxFuncs = 64

// addCall records a call to the function named by all[from:paren] (name
// tokens and dots; all[paren] is its '('). The name is assembled in a stack
// buffer so that calls to known functions cost no allocation.
func (c *classifier) addCall(all []stok, from, paren int, p *part) {
	ts := all[from:paren]
	var buf [256]byte
	name := buf[:0]
	var starts [3]int
	n := 0
	for i := 0; i < len(ts); i += 2 {
		if n == len(starts) {
			p.markWrite("function name with too many parts")
			return
		}
		if n > 0 {
			name = append(name, '.')
		}
		starts[n] = len(name)
		var ok bool
		name, ok = c.appendNamePart(name, ts[i])
		if !ok {
			p.markWrite("undecodable function name")
			return
		}
		part := name[starts[n]:]
		if len(part) == 0 || bytesIndexByte(part, '.') >= 0 {
			// A quoted name containing '.' could not be told from a
			// qualified one by whoever looks it up.
			p.markWrite("unusual function name")
			return
		}
		n++
	}
	last := name[starts[n-1]:]
	if p.node == "" && (n == 1 || n == 2 && string(name[:starts[1]-1]) == "pg_catalog") {
		if nodeFunc(string(last)) {
			p.node = string(last) + "()"
		} else if string(last) == "current_setting" && nodeSettings[c.literalName(all, paren)] {
			p.node = "current_setting('" + c.literalName(all, paren) + "')"
		}
	}
	if e := knownEffectBytes(last); e != 0 {
		r := string(last) + "()"
		if e == effPin {
			st := stateOf(string(last))
			if st == StateSettings {
				if name := c.literalArg(all, paren); name != "" {
					if !contains(p.names, name) {
						p.names = append(p.names, name)
					}
				} else {
					st = StateUntracked
				}
			}
			p.markPin(r, st)
		} else {
			p.markWrite(r)
		}
		return
	}
	if n == 1 || n == 2 && string(name[:starts[1]-1]) == "pg_catalog" {
		if _, ok := builtinReadFuncs[string(last)]; ok {
			return
		}
		if _, ok := volatileReads[string(last)]; ok {
			return
		}
	}
	for _, f := range c.funcs {
		if f == string(name) {
			return
		}
	}
	if len(c.funcs) >= maxFuncs {
		p.markWrite("too many functions")
		return
	}
	c.funcs = append(c.funcs, string(name))
}

func bytesIndexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

// knownEffectBytes is knownEffect without converting name to a string.
func knownEffectBytes(name []byte) funcEffect {
	if e, ok := knownFuncs[string(name)]; ok {
		return e
	}
	for _, p := range knownPrefixes {
		if len(name) >= len(p.prefix) && string(name[:len(p.prefix)]) == p.prefix {
			return p.eff
		}
	}
	return 0
}

// namedatalen is the server's NAMEDATALEN: longer identifiers are truncated
// to namedatalen-1 bytes.
const namedatalen = 64

// appendNamePart appends the identifier a name token denotes: unquoted names
// folded to lower case (ASCII only, as the server does for UTF-8), quoted
// names unescaped, both truncated as the server truncates them.
func (c *classifier) appendNamePart(dst []byte, t stok) ([]byte, bool) {
	s := c.src[t.start:t.end]
	start := len(dst)
	switch {
	case t.kind == TokIdent:
		for i := 0; i < len(s); i++ {
			b := s[i]
			if b >= 'A' && b <= 'Z' {
				b += 'a' - 'A'
			}
			dst = append(dst, b)
		}
	case t.flags&flagUnicode != 0:
		u, ok := decodeUnicodeIdent(s)
		if !ok {
			return dst, false
		}
		dst = append(dst, u...)
	default:
		body := s[1 : len(s)-1]
		for i := 0; i < len(body); i++ {
			dst = append(dst, body[i])
			if body[i] == '"' {
				i++ // "" stands for one quote
			}
		}
	}
	if len(dst)-start >= namedatalen {
		n := start + namedatalen - 1
		for n > start && !utf8.RuneStart(dst[n]) {
			n--
		}
		dst = dst[:n]
	}
	return dst, true
}

// decodeUnicodeIdent decodes a U&"..." identifier token, with its merged
// UESCAPE clause if any.
func decodeUnicodeIdent(s string) (string, bool) {
	// Re-lex the span: U&"..." first, then possibly UESCAPE and '<c>'.
	var toks [3]Token
	n := 0
	Lex(s, func(t Token) bool {
		if t.Kind == TokLineComment || t.Kind == TokBlockComment {
			return true
		}
		if n < len(toks) {
			toks[n] = t
		}
		n++
		return n <= len(toks)
	})
	if n == 0 || toks[0].Kind != TokQuotedIdent {
		return "", false
	}
	esc := byte('\\')
	if n > 1 {
		if n != 3 {
			return "", false
		}
		e := toks[2].Text(s)
		if len(e) != 3 || e[0] != '\'' || e[2] != '\'' {
			return "", false
		}
		esc = e[1]
		if isHexDigit(esc) || esc == '+' || esc == '\'' || esc == '"' || isSpace(esc) {
			return "", false
		}
	}
	id := toks[0].Text(s)
	body := strings.ReplaceAll(id[3:len(id)-1], `""`, `"`)
	var b strings.Builder
	for i := 0; i < len(body); {
		if body[i] != esc {
			b.WriteByte(body[i])
			i++
			continue
		}
		r, w, ok := unicodeEscape(body[i:], esc)
		if !ok {
			return "", false
		}
		i += w
		if r >= 0xD800 && r <= 0xDBFF {
			lo, w2, ok := unicodeEscape(body[i:], esc)
			if !ok || lo < 0xDC00 || lo > 0xDFFF {
				return "", false
			}
			r = 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00)
			i += w2
		} else if r >= 0xDC00 && r <= 0xDFFF {
			return "", false
		}
		if r == 0 || r > utf8.MaxRune {
			return "", false
		}
		b.WriteRune(r)
	}
	return b.String(), true
}

// unicodeEscape decodes one escape at the start of s: esc esc, esc+XXXXXX or
// escXXXX. An escaped escape character decodes to itself.
func unicodeEscape(s string, esc byte) (rune, int, bool) {
	if len(s) < 2 || s[0] != esc {
		return 0, 0, false
	}
	if s[1] == esc {
		return rune(esc), 2, true
	}
	digits, at := 4, 1
	if s[1] == '+' {
		digits, at = 6, 2
	}
	if len(s) < at+digits {
		return 0, 0, false
	}
	var r rune
	for i := at; i < at+digits; i++ {
		h := s[i]
		if !isHexDigit(h) {
			return 0, 0, false
		}
		r = r<<4 | rune(hexVal(h))
	}
	return r, at + digits, true
}

func isHexDigit(c byte) bool {
	return isDigit(c) || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func hexVal(c byte) byte {
	switch {
	case isDigit(c):
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

// stateOf is the kind of session state a known effPin function touches.
func stateOf(name string) State {
	switch name {
	case "set_config":
		return StateSettings
	case "currval", "lastval":
		return StateSequence
	case "setseed":
		return StatePermanent
	}
	return StateLock // pg_advisory_*, pg_try_advisory_*
}

// literalArg returns the first argument of the call whose '(' is
// all[paren] when it is a plain string literal followed by a comma (the
// parameter name of set_config('name', ...)), lower-cased as the server
// matches parameter names; "" otherwise.
// literalName is the first argument of the call whose '(' is all[paren]
// when it is a plain string literal, lower-cased ("" otherwise): the name
// current_setting(name) or current_setting(name, missing_ok) reads.
func (c *classifier) literalName(all []stok, paren int) string {
	if kindAt(all, paren+1) != TokString {
		return ""
	}
	switch kindAt(all, paren+2) {
	case TokComma, TokRParen:
	default:
		return ""
	}
	t := all[paren+1]
	s := c.src[t.start:t.end]
	if len(s) < 2 || s[0] != '\'' || strings.IndexByte(s, '\\') >= 0 {
		return ""
	}
	return strings.ToLower(strings.ReplaceAll(s[1:len(s)-1], "''", "'"))
}

func (c *classifier) literalArg(all []stok, paren int) string {
	if kindAt(all, paren+1) != TokString || kindAt(all, paren+2) != TokComma {
		return ""
	}
	t := all[paren+1]
	s := c.src[t.start:t.end]
	if len(s) < 2 || s[0] != '\'' || strings.IndexByte(s, '\\') >= 0 {
		return "" // E'', U&'', or a backslash read two ways: not worth it
	}
	return strings.ToLower(strings.ReplaceAll(s[1:len(s)-1], "''", "'"))
}
