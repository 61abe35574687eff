package pgryw

import "strings"

func parseFuncList(key, v string) ([]string, error) {
	bad := badValue(key, v, "a comma-separated list of function names, optionally schema-qualified, double-quoted where their case or characters need it")
	v = strings.TrimSpace(v)
	var l funcListLexer
	for i := 0; i < len(v); i++ {
		var ok bool
		if i, ok = l.step(v, i); !ok {
			return nil, bad
		}
	}
	if l.inQuote || v == "" || !l.endName() {
		return nil, bad
	}
	return l.out, nil
}

// funcListLexer is parseFuncList's state: the names so far, the parts of
// the one being read, and the part being read.
type funcListLexer struct {
	out, parts      []string
	cur             strings.Builder
	quoted, inQuote bool // the part is double-quoted; inside its quotes
}

// step takes v[i] (and, for a doubled quote, v[i+1]), returning where it
// stopped, or false when v is not a function list.
func (l *funcListLexer) step(v string, i int) (int, bool) {
	c := v[i]
	switch {
	case l.inQuote:
		if c != '"' {
			l.cur.WriteByte(c)
		} else if i+1 < len(v) && v[i+1] == '"' {
			l.cur.WriteByte('"')
			i++
		} else {
			l.inQuote = false
		}
	case c == '"' && l.cur.Len() == 0 && !l.quoted:
		l.inQuote, l.quoted = true, true
	case c == '.':
		return i, l.flushPart()
	case c == ',':
		return i, l.endName()
	case c == ' ' || c == '\t':
		// around a name: skip; inside one, refused by flushPart
		return i, l.cur.Len() == 0 || l.quoted || onlyBlanksToComma(v[i:])
	case l.quoted:
		return i, false // text after a closing quote
	default:
		l.cur.WriteByte(c)
	}
	return i, true
}

// onlyBlanksToComma reports that s holds blanks up to its end or a comma.
func onlyBlanksToComma(s string) bool {
	j := 0
	for j < len(s) && (s[j] == ' ' || s[j] == '\t') {
		j++
	}
	return j == len(s) || s[j] == ','
}

// flushPart ends a part of a name (a schema or the name itself).
func (l *funcListLexer) flushPart() bool {
	p := l.cur.String()
	l.cur.Reset()
	switch {
	case p == "" || !l.quoted && strings.TrimSpace(p) != p:
		return false
	case !l.quoted && !unquotedName(p):
		return false
	case !l.quoted:
		p = asciiLower(p)
	case strings.IndexByte(p, '.') >= 0:
		return false // the classifier cannot tell it from a qualified name
	}
	l.parts = append(l.parts, p)
	l.quoted = false
	return true
}

// endName ends a function's name: one part, or a schema and a name.
func (l *funcListLexer) endName() bool {
	if !l.flushPart() || len(l.parts) > 2 {
		return false
	}
	l.out = append(l.out, strings.Join(l.parts, "."))
	l.parts = l.parts[:0]
	return true
}

// unquotedName reports that p is made of the characters an unquoted name
// may hold.
func unquotedName(p string) bool {
	for _, r := range p {
		if !(r == '_' || r == '$' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r > 127) {
			return false
		}
	}
	return true
}

// asciiLower folds ASCII letters only, as the server folds unquoted names.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// formatFuncName writes a name of parseFuncList's back, quoting each part
// that unquoted would read otherwise.
func formatFuncName(f string) string {
	parts := strings.Split(f, ".")
	for i, p := range parts {
		plain := p != ""
		for j := 0; j < len(p); j++ {
			c := p[j]
			if !(c == '_' || c == '$' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c > 127) {
				plain = false
			}
		}
		if !plain {
			parts[i] = `"` + strings.ReplaceAll(p, `"`, `""`) + `"`
		}
	}
	return strings.Join(parts, ".")
}
