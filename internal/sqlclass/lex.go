package sqlclass

import "strings"

// TokKind is the lexical class of a Token.
type TokKind uint8

// Token kinds. The lexer follows PostgreSQL's scan.l (version 15, with the
// whitespace of 16+) closely enough that every token boundary that can change
// the meaning of a statement — where a string, comment, quoted identifier or
// dollar quote starts and ends — is the server's.
const (
	// TokError is an unterminated string, quoted identifier, dollar quote or
	// block comment (it then runs to the end of the input), or a byte that
	// PostgreSQL rejects outside quotes (a lone '$', '\\', '{', NUL ...).
	TokError TokKind = iota
	// TokIdent is an unquoted identifier or keyword.
	TokIdent
	// TokQuotedIdent is a "quoted identifier" or U&"unicode identifier".
	TokQuotedIdent
	// TokString is a string constant: '...', E'...', N'...', U&'...', B'...'
	// or X'...', including any continuation segments.
	TokString
	// TokDollarString is a $tag$...$tag$ constant.
	TokDollarString
	// TokNumber is a numeric constant.
	TokNumber
	// TokParam is a positional parameter such as $1.
	TokParam
	// TokOperator is an operator such as +, <=, @>, ||, := or =>.
	TokOperator
	// TokLParen is "(".
	TokLParen
	// TokRParen is ")".
	TokRParen
	// TokLBracket is "[".
	TokLBracket
	// TokRBracket is "]".
	TokRBracket
	// TokComma is ",".
	TokComma
	// TokSemicolon is ";", the statement separator.
	TokSemicolon
	// TokDot is ".".
	TokDot
	// TokColon is ":" (array slices; also :name placeholders before rebinding).
	TokColon
	// TokTypecast is "::".
	TokTypecast
	// TokLineComment is a -- comment up to (not including) the line break.
	TokLineComment
	// TokBlockComment is a /* ... */ comment, nested ones included.
	TokBlockComment
)

var tokKindNames = [...]string{
	TokError: "Error", TokIdent: "Ident", TokQuotedIdent: "QuotedIdent",
	TokString: "String", TokDollarString: "DollarString", TokNumber: "Number",
	TokParam: "Param", TokOperator: "Operator", TokLParen: "LParen",
	TokRParen: "RParen", TokLBracket: "LBracket", TokRBracket: "RBracket",
	TokComma: "Comma", TokSemicolon: "Semicolon", TokDot: "Dot", TokColon: "Colon",
	TokTypecast: "Typecast", TokLineComment: "LineComment", TokBlockComment: "BlockComment",
}

// String returns the kind's name, e.g. "Ident".
func (k TokKind) String() string {
	if int(k) < len(tokKindNames) {
		return tokKindNames[k]
	}
	return "TokKind(?)"
}

// Token is one lexical token: its kind and its byte span sql[Start:End].
type Token struct {
	Kind       TokKind
	Start, End int
}

// Text returns the token's source text.
func (t Token) Text(sql string) string { return sql[t.Start:t.End] }

// Lex calls fn for every token of sql, comments included and whitespace
// excluded, in order, until fn returns false or the input ends. Spans are
// non-empty, increasing and within sql. Strings are lexed as with
// standard_conforming_strings on, the server default and what pgx requires.
func Lex(sql string, fn func(Token) bool) {
	l := lexer{src: sql}
	for {
		t, ok := l.next()
		if !ok || !fn(t) {
			return
		}
	}
}

// lexer is a PostgreSQL tokenizer over a string. The zero value plus src is
// ready to use.
type lexer struct {
	src string
	pos int
	// scsOff lexes plain '...' strings with backslash escapes, as the server
	// does when standard_conforming_strings is off.
	scsOff bool
	// plainBackslash records that a plain '...' string contained a
	// backslash: only then can the setting of standard_conforming_strings
	// move a token boundary, so only then is a second pass worth doing.
	plainBackslash bool
	// unicode records that a U&'...' or U&"..." token was seen, which may be
	// followed by a UESCAPE clause that belongs to it.
	unicode bool
}

// String quoting modes, after scan.l's start conditions xq, xe, xus and xb/xh.
const (
	quoteStd     = iota // '' doubles a quote, backslash is ordinary
	quoteEscape         // also \x escapes any byte
	quoteBitOnly        // B'' and X'': the first quote ends the segment
)

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

func isIdentStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c >= 0x80
}

func isIdentCont(c byte) bool {
	return isIdentStart(c) || c >= '0' && c <= '9' || c == '$'
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// isOpChar reports the bytes scan.l's op_chars accepts in multi-byte operators.
func isOpChar(c byte) bool {
	switch c {
	case '~', '!', '@', '#', '^', '&', '|', '`', '?', '+', '-', '*', '/', '%', '<', '>', '=':
		return true
	}
	return false
}

func (l *lexer) next() (Token, bool) {
	s := l.src
	i := l.pos
	for i < len(s) && isSpace(s[i]) {
		i++
	}
	if i >= len(s) {
		l.pos = i
		return Token{}, false
	}
	start := i
	c := s[i]
	var kind TokKind
	switch {
	case c == '-' && i+1 < len(s) && s[i+1] == '-':
		kind, i = TokLineComment, lineEnd(s, i)
	case c == '/' && i+1 < len(s) && s[i+1] == '*':
		kind, i = l.blockComment(i)
	case c == '\'':
		mode := quoteStd
		if l.scsOff {
			mode = quoteEscape
		}
		kind, i = l.quoted(i, mode, true)
	case c == '"':
		kind, i = quotedIdent(s, i)
	case c == '$':
		kind, i = dollar(s, i)
	case isDigit(c) || c == '.' && i+1 < len(s) && isDigit(s[i+1]):
		kind, i = TokNumber, number(s, i)
	case isIdentStart(c):
		kind, i = l.word(i)
	default:
		kind, i = punct(s, i)
	}
	l.pos = i
	return Token{Kind: kind, Start: start, End: i}, true
}

func lineEnd(s string, i int) int {
	for i < len(s) && s[i] != '\n' && s[i] != '\r' {
		i++
	}
	return i
}

// blockComment scans a comment starting at s[i:i+2] == "/*". Comments nest,
// as in the server (and unlike the SQL standard's other dialects).
func (l *lexer) blockComment(i int) (TokKind, int) {
	s := l.src
	depth := 0
	for i < len(s) {
		switch {
		case s[i] == '/' && i+1 < len(s) && s[i+1] == '*':
			depth++
			i += 2
		case s[i] == '*' && i+1 < len(s) && s[i+1] == '/':
			depth--
			i += 2
			if depth == 0 {
				return TokBlockComment, i
			}
		default:
			i++
		}
	}
	return TokError, len(s)
}

// quoted scans a string constant whose opening quote is at s[q]. After a
// closing quote the server looks for a continuation — whitespace holding a
// newline (and possibly -- comments) followed by another quote — and lexes
// that next segment in the SAME mode: E'a'<newline>'\” is one escape string.
// Getting this wrong would let a crafted query hide a statement inside what
// looks like a string.
func (l *lexer) quoted(q int, mode int, plain bool) (TokKind, int) {
	s := l.src
	i := q + 1
	for i < len(s) {
		switch c := s[i]; {
		case c == '\\':
			if plain {
				l.plainBackslash = true
			}
			if mode == quoteEscape {
				i += 2
				continue
			}
			i++
		case c == '\'':
			if mode != quoteBitOnly && i+1 < len(s) && s[i+1] == '\'' {
				i += 2
				continue
			}
			i++
			if j, ok := continuation(s, i); ok {
				i = j + 1
				continue
			}
			return TokString, i
		default:
			i++
		}
	}
	return TokError, len(s)
}

// continuation reports whether s[i:] is whitespace containing a newline
// (comments allowed) followed by a quote, and where that quote is.
func continuation(s string, i int) (int, bool) {
	newline := false
	for i < len(s) {
		switch c := s[i]; {
		case c == '\n' || c == '\r':
			newline = true
			i++
		case isSpace(c):
			i++
		case c == '-' && i+1 < len(s) && s[i+1] == '-':
			i = lineEnd(s, i)
		case c == '\'' && newline:
			return i, true
		default:
			return 0, false
		}
	}
	return 0, false
}

// quotedIdent scans "..." starting at s[q] (the opening double quote).
func quotedIdent(s string, q int) (TokKind, int) {
	i := q + 1
	for i < len(s) {
		if s[i] == '"' {
			if i+1 < len(s) && s[i+1] == '"' {
				i += 2
				continue
			}
			return TokQuotedIdent, i + 1
		}
		i++
	}
	return TokError, len(s)
}

// dollar scans what starts with '$': a parameter ($1), a dollar-quoted
// string ($$...$$, $tag$...$tag$), or a lone '$' that the server rejects.
// The closing delimiter is the first later occurrence of the opening one,
// which is exactly what scan.l's xdolq rules amount to.
func dollar(s string, i int) (TokKind, int) {
	j := i + 1
	if j < len(s) && isDigit(s[j]) {
		for j < len(s) && isDigit(s[j]) {
			j++
		}
		return TokParam, j
	}
	if j < len(s) && isIdentStart(s[j]) {
		for j < len(s) && isIdentCont(s[j]) && s[j] != '$' {
			j++
		}
	}
	if j >= len(s) || s[j] != '$' {
		return TokError, i + 1
	}
	delim := s[i : j+1]
	body := j + 1
	k := strings.Index(s[body:], delim)
	if k < 0 {
		return TokError, len(s)
	}
	return TokDollarString, body + k + len(delim)
}

// number scans a numeric constant. Trailing letters are left for the next
// token, as PostgreSQL 14 and earlier did (15+ reject them): "1for update"
// then still shows the words that matter.
func number(s string, i int) int {
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	if i < len(s) && s[i] == '.' && !(i+1 < len(s) && s[i+1] == '.') {
		i++
		for i < len(s) && isDigit(s[i]) {
			i++
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		j := i + 1
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		if j < len(s) && isDigit(s[j]) {
			for j < len(s) && isDigit(s[j]) {
				j++
			}
			i = j
		}
	}
	return i
}

// word scans an identifier or one of the prefixed constants E”, N”, B”,
// X”, U&” and U&"".
func (l *lexer) word(i int) (TokKind, int) {
	s := l.src
	c := s[i] | 0x20
	if i+1 < len(s) && s[i+1] == '\'' {
		switch c {
		case 'e':
			return l.quoted(i+1, quoteEscape, false)
		case 'b', 'x':
			return l.quoted(i+1, quoteBitOnly, false)
		case 'n':
			mode := quoteStd
			if l.scsOff {
				mode = quoteEscape
			}
			return l.quoted(i+1, mode, true)
		}
	}
	if c == 'u' && i+2 < len(s) && s[i+1] == '&' {
		switch s[i+2] {
		case '\'':
			l.unicode = true
			return l.quoted(i+2, quoteStd, false)
		case '"':
			l.unicode = true
			return quotedIdent(s, i+2)
		}
	}
	i++
	for i < len(s) && isIdentCont(s[i]) {
		i++
	}
	return TokIdent, i
}

// punct scans punctuation and operators.
func punct(s string, i int) (TokKind, int) {
	switch s[i] {
	case '(':
		return TokLParen, i + 1
	case ')':
		return TokRParen, i + 1
	case '[':
		return TokLBracket, i + 1
	case ']':
		return TokRBracket, i + 1
	case ',':
		return TokComma, i + 1
	case ';':
		return TokSemicolon, i + 1
	case '.':
		return TokDot, i + 1
	case ':':
		if i+1 < len(s) {
			switch s[i+1] {
			case ':':
				return TokTypecast, i + 2
			case '=':
				return TokOperator, i + 2
			}
		}
		return TokColon, i + 1
	}
	if !isOpChar(s[i]) {
		return TokError, i + 1
	}
	j := i
	for j < len(s) && isOpChar(s[j]) {
		// A comment start ends the operator, as in scan.l.
		if j > i && (s[j] == '-' && j+1 < len(s) && s[j+1] == '-' || s[j] == '/' && j+1 < len(s) && s[j+1] == '*') {
			break
		}
		j++
	}
	// scan.l drops trailing + and - from operators made only of the SQL
	// standard's characters, so that "a=-1" is "=" then "-".
	if n := j - i; n > 1 && (s[j-1] == '+' || s[j-1] == '-') && !strings.ContainsAny(s[i:j-1], "~!@#^&|`?%") {
		for j-i > 1 && (s[j-1] == '+' || s[j-1] == '-') {
			j--
		}
	}
	return TokOperator, j
}
