// Package sqlclass decides, from the text of a SQL statement alone, whether
// PostgreSQL can run it on a hot-standby replica.
//
// # Approach
//
// A lexer that follows the server's own scanner finds every string, comment,
// quoted identifier and dollar quote, so that keywords inside them never
// count and no crafted quoting can hide a statement. A classifier then reads
// the tokens of each ';'-separated statement. It says "read" only for the
// statement forms that are reads by construction (SELECT, VALUES, TABLE,
// WITH, SHOW, EXPLAIN without ANALYZE, COPY ... TO STDOUT) and only when
// nothing in them writes: no INSERT/UPDATE/DELETE/MERGE at any depth, no
// locking clause, no SELECT INTO, and no call to a function that is not
// known to be read-only. Function names it cannot vouch for are returned in
// Result.Funcs for the caller to look up in pg_proc. Anything it does not
// recognise is a write.
//
// # What text cannot show
//
// Operators, casts, type input functions, attribute-notation calls
// (t.f meaning f(t)), views and row-level-security policies can all run
// user functions without a call appearing in the statement. Like pgpool-II,
// the classifier trusts that such functions are declared with the right
// volatility. Unqualified built-in names are assumed to resolve to
// pg_catalog, as they do unless search_path puts pg_catalog after a schema
// defining a same-named function.
package sqlclass

//go:generate go run gen.go

import (
	"strings"
)

// Result is what a statement needs from the router.
type Result struct {
	// Write: the statement modifies data, or is not provably read-only. It
	// must run on the writer, and once committed it moves the
	// read-your-writes watermark.
	Write bool
	// Pin: the statement changes or reads session state that later
	// statements depend on (SET, PREPARE, LISTEN, cursors, temporary
	// tables, advisory locks, currval...), so it runs on the writer. State
	// says which kinds; how long the connection then stays on the writer is
	// the router's decision (it asks the server what state lives).
	Pin bool
	// State is the kinds of session state a Pin statement touches.
	State State
	// Settings lists the run-time parameters that SET, RESET and
	// set_config with a literal name change, lower-cased as the server
	// matches them (SET ROLE is "role", SET TIME ZONE "timezone"), in
	// order of first appearance. RESET ALL and set_config with a computed
	// name add none (the latter sets StateUntracked).
	Settings []string
	// Tx is the transaction-control effect of the first statement.
	Tx TxOp
	// Hint is a routing hint found in a comment.
	Hint Hint
	// Funcs lists the functions the statement calls that are neither known
	// read-only built-ins nor known writers: lower-cased unless quoted,
	// schema-qualified as written ("myschema.f", "f"), in order of first
	// appearance. The statement is a read only if every one of them is
	// read-only in pg_proc. Funcs is nil when there are none, and also when
	// Write or Pin is set, because the statement then goes to the writer
	// whatever they do.
	Funcs []string
	// Reason is a short human reason for the decision, such as "INSERT",
	// "FOR UPDATE", "nextval()" or "SET".
	Reason string
	// Mixed: the string holds transaction control among other statements,
	// so it may commit, open or abort blocks part-way (INSERT …; COMMIT;
	// SELECT 1/0 commits the insert and then fails). What it left behind is
	// read from the server, not from the text. Mixed implies Write.
	Mixed bool
	// Chain: the first statement is COMMIT AND CHAIN or ROLLBACK AND CHAIN,
	// which leaves a new transaction block open.
	Chain bool
	// Node: the statement reads something whose answer depends on the
	// node that gives it (node identity and node-local state: see
	// nodeFuncs, nodeRelations, nodeSettings), so the writer must answer
	// it as a connection to the writer alone would. It changes nothing:
	// it is not Write, and ReadOnly still says whether a standby could
	// run it.
	Node bool
	// NodeReason names what made Node, e.g. "pg_is_in_recovery()".
	NodeReason string
	// TxLocal: inside a transaction block, the statement's effects end
	// with the transaction (SET LOCAL, SET TRANSACTION, SET CONSTRAINTS,
	// savepoints, a cursor without HOLD and FETCH, MOVE, CLOSE): it
	// touches no state that outlives the block.
	TxLocal bool
}

// State is a set of kinds of session state.
type State uint16

// Kinds of session state.
const (
	// StateSettings: run-time parameters (SET, RESET, set_config, SET
	// ROLE, SET SESSION AUTHORIZATION, SET SESSION CHARACTERISTICS).
	StateSettings State = 1 << iota
	// StateUntracked: set_config with a name that is not a literal, so
	// which parameter it sets cannot be known from the text.
	StateUntracked
	// StatePrepared: SQL-level prepared statements (PREPARE, EXECUTE,
	// DEALLOCATE).
	StatePrepared
	// StateCursor: cursors (DECLARE, FETCH, MOVE, CLOSE).
	StateCursor
	// StateListen: LISTEN, UNLISTEN.
	StateListen
	// StateTemp: temporary tables and other temporary objects.
	StateTemp
	// StateLock: advisory locks (pg_advisory_*, pg_try_advisory_*).
	StateLock
	// StateSequence: currval and lastval read the session's sequence
	// state; they change nothing.
	StateSequence
	// StatePermanent: state that cannot be observed or undone (LOAD,
	// setseed).
	StatePermanent
	// StateDiscardAll: DISCARD ALL, which clears every kind but
	// StatePermanent.
	StateDiscardAll
	// StateDeallocate: DEALLOCATE or DISCARD ALL, after which prepared
	// statements may be gone, the router's own included.
	StateDeallocate
)

// ReadOnly reports whether r may run on a replica, assuming every name in
// r.Funcs is read-only. Transaction control (Tx != TxNone) is ReadOnly too
// unless it sets Write or Pin: BEGIN, COMMIT and the like go wherever their
// transaction is, so check Tx first.
func (r Result) ReadOnly() bool { return !r.Write && !r.Pin }

// TxOp is the transaction-control effect of a statement.
type TxOp uint8

// Transaction-control effects.
const (
	// TxNone: not a transaction-control statement.
	TxNone TxOp = iota
	// TxBegin: BEGIN, START TRANSACTION.
	TxBegin
	// TxCommit: COMMIT, END, and PREPARE TRANSACTION (which ends the
	// transaction block on the writer and is also reported as Write). With
	// AND CHAIN a new transaction starts at once on the same connection; the
	// router sees that from the server's transaction status, so it is not Pin.
	TxCommit
	// TxRollback: ROLLBACK, ABORT, with or without AND CHAIN.
	TxRollback
	// TxSavepoint: SAVEPOINT, RELEASE [SAVEPOINT], ROLLBACK TO [SAVEPOINT].
	TxSavepoint
)

// String returns the name of the operation, e.g. "TxBegin".
func (t TxOp) String() string {
	switch t {
	case TxNone:
		return "TxNone"
	case TxBegin:
		return "TxBegin"
	case TxCommit:
		return "TxCommit"
	case TxRollback:
		return "TxRollback"
	case TxSavepoint:
		return "TxSavepoint"
	}
	return "TxOp(?)"
}

// Hint is a routing hint written in a comment.
type Hint uint8

// Hints. A comment containing "pgryw:primary" or "pgryw:replica" (any case;
// also the sqlcommenter spelling pgryw='primary') sets the hint; when both
// appear, HintPrimary wins.
const (
	// HintNone: no hint comment.
	HintNone Hint = iota
	// HintPrimary: the caller asks for the writer.
	HintPrimary
	// HintReplica: the caller accepts a replica (what to do when the
	// statement is not read-only is the router's decision).
	HintReplica
)

// String returns the name of the hint, e.g. "HintPrimary".
func (h Hint) String() string {
	switch h {
	case HintNone:
		return "HintNone"
	case HintPrimary:
		return "HintPrimary"
	case HintReplica:
		return "HintReplica"
	}
	return "Hint(?)"
}

// Classify classifies a SQL string, which may hold several statements
// separated by semicolons; the result is the strictest of theirs. It never
// panics, never reads past the input, and returns Write for anything it does
// not understand.
func Classify(sql string) Result {
	var buf [128]stok
	c := classifier{src: sql}
	ts := c.lex(buf[:0], false)
	res := c.run(ts)
	if c.plainBackslash && c.bad == "" {
		// With standard_conforming_strings off (a server, role or database
		// setting the connection may inherit) a backslash escapes a quote in
		// a plain string, which moves token boundaries. Classify both ways
		// and keep the stricter answer. A text that does not even lex that
		// way is rejected whole by such a server, so it cannot do harm
		// there and that reading is dropped.
		c2 := classifier{src: sql}
		ts = c2.lex(buf[:0], true)
		if c2.bad == "" {
			res = stricter(res, c2.run(ts))
		}
	}
	return res
}

// stricter combines two readings of the same text.
func stricter(a, b Result) Result {
	a.State |= b.State
	for _, n := range b.Settings {
		if !contains(a.Settings, n) {
			a.Settings = append(a.Settings, n)
		}
	}
	if b.Write && !a.Write || b.Pin && !a.Pin || b.Tx != a.Tx {
		a.Reason = b.Reason
	}
	if b.Tx != a.Tx {
		// The readings disagree about transaction control: keep the writer
		// connection whatever happens.
		a.Write, a.Pin = true, true
		a.Reason = "ambiguous backslash in string"
	}
	a.Write = a.Write || b.Write
	a.Pin = a.Pin || b.Pin
	if b.Node && !a.Node {
		a.Node, a.NodeReason = true, b.NodeReason
	}
	a.TxLocal = a.TxLocal && b.TxLocal
	a.Mixed = a.Mixed || b.Mixed
	a.Chain = a.Chain || b.Chain
	if a.Hint != HintPrimary && b.Hint != HintNone {
		a.Hint = b.Hint
	}
	if a.Write || a.Pin {
		a.Funcs = nil
		return a
	}
	for _, f := range b.Funcs {
		if !contains(a.Funcs, f) {
			a.Funcs = append(a.Funcs, f)
		}
	}
	return a
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Token flags.
const (
	flagUnicode    = 1 << iota // U&'...' or U&"..."
	flagUescape                // a UESCAPE clause was merged into the token
	flagNonOperand             // a ')' that closes OPERATOR(...) or DISTINCT ON (...)
)

// stok is a significant token (comments dropped) with its keyword resolved.
type stok struct {
	start, end int
	kind       TokKind
	flags      uint8
	kw         keyword
}

type keyword uint16

type kwCategory uint8

const (
	catNone kwCategory = iota
	catUnreserved
	catColName
	catTypeFunc
	catReserved
)

func (k keyword) category() kwCategory {
	if int(k) < len(keywordCat) {
		return keywordCat[k]
	}
	return catNone
}

// upper returns the keyword in upper case, for reasons.
func (k keyword) upper() string {
	if int(k) < len(keywordUpper) {
		return keywordUpper[k]
	}
	return ""
}

var keywordUpper = func() []string {
	u := make([]string, len(keywordText))
	for i, w := range keywordText {
		u[i] = strings.ToUpper(w)
	}
	return u
}()

// lookupKeyword returns the keyword an unquoted identifier spells, folding
// ASCII letters only, as the server's keyword lookup does.
func lookupKeyword(s string) keyword {
	if len(s) > maxKeywordLen {
		return noKeyword
	}
	var b [maxKeywordLen]byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x80 {
			return noKeyword
		}
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		b[i] = c
	}
	return keywordByName[string(b[:len(s)])]
}

// part is the classification of one statement.
type part struct {
	write, pin bool
	txLocal    bool   // its effects end with the transaction block (Result.TxLocal)
	node       string // what makes the answer depend on the node ("": nothing)
	tx         TxOp
	reason     string
	state      State
	names      []string // settings changed, for Result.Settings
}

// pinPart is a statement that touches session state of kinds st.
func pinPart(r string, st State) part { return part{pin: true, state: st, reason: r} }

func (p *part) markWrite(r string) {
	if !p.write {
		p.write = true
		p.reason = r
	}
}

func (p *part) markPin(r string, st State) {
	p.state |= st
	if !p.pin {
		p.pin = true
		if !p.write {
			p.reason = r
		}
	}
}

func writePart(r string) part { return part{write: true, reason: r} }

// classifier holds what one reading of a text has found so far. Token and
// parenthesis buffers are passed around as parameters rather than kept here,
// so that they can live on the caller's stack.
type classifier struct {
	src            string
	hint           Hint
	bad            string // set when the text cannot be trusted at all
	funcs          []string
	plainBackslash bool
}

// lex appends the significant tokens of the whole input to toks, noting
// hints and errors.
func (c *classifier) lex(toks []stok, scsOff bool) []stok {
	l := lexer{src: c.src, scsOff: scsOff}
	for {
		t, ok := l.next()
		if !ok {
			break
		}
		st := stok{start: t.Start, end: t.End, kind: t.Kind}
		switch t.Kind {
		case TokLineComment, TokBlockComment:
			c.noteHint(c.src[t.Start:t.End])
			continue
		case TokError:
			if c.bad == "" {
				c.bad = errorReason(c.src, t)
			}
		case TokIdent:
			st.kw = lookupKeyword(c.src[t.Start:t.End])
		case TokString, TokQuotedIdent:
			if c.src[t.Start] == 'u' || c.src[t.Start] == 'U' {
				st.flags = flagUnicode
			}
		}
		toks = append(toks, st)
	}
	c.plainBackslash = l.plainBackslash
	if l.unicode {
		toks = mergeUescape(toks)
	}
	return toks
}

func errorReason(src string, t Token) string {
	switch src[t.Start] {
	case '\'':
		return "unterminated string"
	case '"':
		return "unterminated quoted identifier"
	case '/':
		return "unterminated comment"
	case '$':
		if t.End-t.Start > 1 {
			return "unterminated dollar quote"
		}
	}
	if t.End-t.Start > 1 {
		return "unterminated string"
	}
	return "invalid character"
}

// mergeUescape folds "UESCAPE 'c'" into the preceding U& token, as the
// server's parser does; otherwise the string after UESCAPE would sit between
// a function name and its '(' and hide the call.
func mergeUescape(ts []stok) []stok {
	w := 0
	for r := 0; r < len(ts); r++ {
		t := ts[r]
		if t.flags&flagUnicode != 0 && r+2 < len(ts) && ts[r+1].kw == kwUescape && ts[r+2].kind == TokString {
			t.end = ts[r+2].end
			t.flags |= flagUescape
			r += 2
		}
		ts[w] = t
		w++
	}
	return ts[:w]
}

// noteHint records a pgryw routing hint found in a comment.
func (c *classifier) noteHint(s string) {
	for i := 0; i+5 <= len(s); i++ {
		if s[i]|0x20 != 'p' || !asciiEqualFold(s[i:i+5], "pgryw") {
			continue
		}
		j := i + 5
		if j >= len(s) || s[j] != ':' && s[j] != '=' {
			continue
		}
		j++
		if j < len(s) && s[j] == '\'' {
			j++
		}
		switch {
		case j+7 <= len(s) && asciiEqualFold(s[j:j+7], "primary"):
			c.hint = HintPrimary
		case j+7 <= len(s) && asciiEqualFold(s[j:j+7], "replica"):
			if c.hint == HintNone {
				c.hint = HintReplica
			}
		}
	}
}

// asciiEqualFold compares ignoring ASCII case only: the server folds only
// ASCII letters, and Unicode folding would equate e.g. 'ſ' with 's'.
func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if x >= 'A' && x <= 'Z' {
			x += 'a' - 'A'
		}
		if y >= 'A' && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// run classifies every statement and combines the results.
func (c *classifier) run(ts []stok) Result {
	res := Result{Hint: c.hint}
	if c.bad != "" {
		res.Write = true
		res.Reason = c.bad
		return res
	}
	n, anyTx := 0, false
	res.TxLocal = true
	for start := 0; start < len(ts); {
		end := stmtEnd(ts, start)
		if end > start {
			p := c.stmt(ts[start:end], 0)
			n++
			res.TxLocal = res.TxLocal && (p.txLocal || p.tx == TxSavepoint)
			if n == 1 {
				res.Tx = p.tx
				res.Reason = p.reason
			}
			if p.tx != TxNone {
				anyTx = true
			}
			if p.write && !res.Write || p.pin && !res.Write && !res.Pin {
				res.Reason = p.reason
			}
			res.Write = res.Write || p.write
			res.Pin = res.Pin || p.pin
			if p.node != "" && !res.Node {
				res.Node, res.NodeReason = true, p.node
			}
			res.State |= p.state
			for _, n := range p.names {
				if !contains(res.Settings, n) {
					res.Settings = append(res.Settings, n)
				}
			}
		}
		start = end + 1
	}
	if n == 0 {
		res.Reason = "empty"
		res.TxLocal = false
		return res
	}
	if n > 1 && anyTx {
		// A string that opens or closes a transaction among other statements
		// runs on the writer, and whether it may have committed a write
		// cannot be told from its first statement: report it as a write. The
		// router learns whether it left a block open from the server's
		// transaction status, so it need not pin the connection.
		res.Write = true
		res.Mixed = true
		res.Reason = "transaction control in a multi-statement string"
	}
	if n == 1 && (res.Reason == "COMMIT AND CHAIN" || res.Reason == "ROLLBACK AND CHAIN") {
		res.Chain = true
	}
	if len(c.funcs) > 0 {
		if res.Pin && !res.Write {
			// The caller never looks at Funcs of a pinned statement, so an
			// unknown function must count as a write here for the watermark.
			res.Write = true
		}
		if !res.Write && !res.Pin {
			res.Funcs = c.funcs
		}
	}
	return res
}

// stmtEnd returns the index of the ';' that ends the statement starting at
// start, or len(ts). Like psql, it does not split inside parentheses (CREATE
// RULE ... DO (a; b)) or inside a BEGIN ATOMIC ... END function body.
func stmtEnd(ts []stok, start int) int {
	atomic := ts[start].kw == kwCreate
	depth, parens := 0, 0
	for i := start; i < len(ts); i++ {
		t := ts[i]
		switch {
		case t.kind == TokLParen:
			parens++
		case t.kind == TokRParen:
			parens--
		case t.kind == TokSemicolon:
			if depth <= 0 && parens <= 0 {
				return i
			}
		case !atomic || t.kind != TokIdent:
		case t.kw == kwBegin && i+1 < len(ts) && ts[i+1].kw == kwAtomic:
			depth++
		case t.kw == kwCase && depth > 0:
			depth++
		case t.kw == kwEnd && depth > 0:
			depth--
		}
	}
	return len(ts)
}

// keywordAt returns the keyword of ts[i], or noKeyword when ts[i] is out of range or
// not an unquoted word.
func keywordAt(ts []stok, i int) keyword {
	if i < 0 || i >= len(ts) {
		return noKeyword
	}
	return ts[i].kw
}

func kindAt(ts []stok, i int) TokKind {
	if i < 0 || i >= len(ts) {
		return TokError
	}
	return ts[i].kind
}

func isName(t stok) bool { return t.kind == TokIdent || t.kind == TokQuotedIdent }

// maxNesting bounds EXPLAIN/DECLARE/COPY recursion on hostile input.
const maxNesting = 8

// stmt classifies one statement (no ';' inside).
func (c *classifier) stmt(ts []stok, depth int) part {
	if depth > maxNesting {
		return writePart("nested too deeply")
	}
	t0 := ts[0]
	if t0.kind == TokLParen {
		return c.query(ts)
	}
	if t0.kind != TokIdent || t0.kw == noKeyword {
		return writePart("unknown statement")
	}
	k1 := keywordAt(ts, 1)
	switch t0.kw {
	case kwSelect, kwValues, kwTable, kwWith:
		return c.query(ts)
	case kwShow:
		p := part{reason: "SHOW"}
		if len(ts) >= 2 && isName(ts[1]) {
			if name := strings.ToLower(c.src[ts[1].start:ts[1].end]); name == "all" || nodeSettings[name] {
				p.node = "SHOW " + name
			}
		}
		return p
	case kwExplain:
		return c.explain(ts, depth)
	case kwCopy:
		return c.copyStmt(ts, depth)
	case kwBegin:
		return part{tx: TxBegin, reason: "BEGIN"}
	case kwStart:
		if k1 == kwTransaction {
			return part{tx: TxBegin, reason: "START TRANSACTION"}
		}
	case kwCommit, kwEnd:
		if k1 == kwPrepared {
			return writePart("COMMIT PREPARED")
		}
		if chained(ts) {
			return part{tx: TxCommit, reason: "COMMIT AND CHAIN"}
		}
		return part{tx: TxCommit, reason: "COMMIT"}
	case kwRollback, kwAbort:
		if t0.kw == kwRollback {
			if k1 == kwPrepared {
				return writePart("ROLLBACK PREPARED")
			}
			j := 1
			if k1 == kwWork || k1 == kwTransaction {
				j = 2
			}
			if keywordAt(ts, j) == kwTo {
				return part{tx: TxSavepoint, reason: "ROLLBACK TO SAVEPOINT"}
			}
		}
		if chained(ts) {
			return part{tx: TxRollback, reason: "ROLLBACK AND CHAIN"}
		}
		return part{tx: TxRollback, reason: "ROLLBACK"}
	case kwSavepoint:
		return part{tx: TxSavepoint, reason: "SAVEPOINT"}
	case kwRelease:
		return part{tx: TxSavepoint, reason: "RELEASE SAVEPOINT"}
	case kwPrepare:
		if k1 == kwTransaction && kindAt(ts, 2) == TokString {
			// Two-phase commit: the transaction block ends here; its data
			// becomes visible at COMMIT PREPARED, itself a Write.
			return part{tx: TxCommit, write: true, reason: "PREPARE TRANSACTION"}
		}
		return pinPart("PREPARE", StatePrepared)
	case kwExecute:
		// Runs a statement prepared earlier on this session: we cannot see
		// what it does, and it only exists on the writer.
		return part{write: true, pin: true, state: StatePrepared, reason: "EXECUTE"}
	case kwDeclare:
		return c.declare(ts, depth)
	case kwFetch, kwMove, kwClose:
		p := pinPart(t0.kw.upper(), StateCursor)
		p.txLocal = true // inside a block, on a cursor of its own or one that pins
		return p
	case kwListen, kwUnlisten:
		return pinPart(t0.kw.upper(), StateListen)
	case kwDeallocate:
		return pinPart("DEALLOCATE", StatePrepared|StateDeallocate)
	case kwLoad:
		return pinPart("LOAD", StatePermanent)
	case kwReset:
		return c.resetStmt(ts)
	case kwDiscard:
		return discardStmt(ts)
	case kwSet:
		return c.setStmt(ts)
	case kwCreate:
		p := writePart("CREATE")
		if c.createsTemp(ts) {
			p.pin = true
			p.state = StateTemp
			p.reason = "CREATE TEMP"
		}
		return p
	case kwDo:
		// A DO block's code may change the session (set_config, an
		// advisory lock, a temporary table): what its text shows is
		// read back behind it.
		p := writePart("DO")
		for i := 1; i < len(ts); i++ {
			if k := ts[i].kind; k == TokString || k == TokDollarString {
				if st, names := BodyEffects(c.src[ts[i].start:ts[i].end]); st != 0 {
					p.pin, p.state, p.names = true, st, names
				}
			}
		}
		return p
	case kwWait:
		// WAIT FOR LSN (PostgreSQL 19) must run where the caller sent it;
		// never reroute it.
		return writePart("WAIT FOR")
	case kwInsert, kwUpdate, kwDelete, kwMerge, kwAlter, kwDrop, kwTruncate, kwComment,
		kwGrant, kwRevoke, kwSecurity, kwReassign, kwImport, kwCall, kwLock,
		kwVacuum, kwAnalyze, kwAnalyse, kwCluster, kwReindex, kwRefresh, kwCheckpoint,
		kwNotify:
		return writePart(t0.kw.upper())
	}
	return writePart("unknown statement")
}

// chained reports AND CHAIN (not AND NO CHAIN) in COMMIT/ROLLBACK.
func chained(ts []stok) bool {
	for i := 1; i+1 < len(ts); i++ {
		if ts[i].kw == kwAnd && ts[i+1].kw == kwChain {
			return true
		}
	}
	return false
}

// setStmt classifies SET. Transaction-scoped forms are Write (they must run
// inside the writer's transaction) but touch no session state.
func (c *classifier) setStmt(ts []stok) part {
	j := 1
	switch keywordAt(ts, 1) {
	case kwLocal:
		return part{write: true, txLocal: true, reason: "SET LOCAL"}
	case kwTransaction:
		return part{write: true, txLocal: true, reason: "SET TRANSACTION"}
	case kwConstraints:
		return part{write: true, txLocal: true, reason: "SET CONSTRAINTS"}
	case kwSession:
		if keywordAt(ts, 2) == kwCharacteristics {
			// default_transaction_isolation and friends: ordinary
			// parameters, seen by the router's read-back.
			return pinPart("SET SESSION CHARACTERISTICS", StateSettings)
		}
		if keywordAt(ts, 2) != kwAuthorization {
			j = 2
		}
	}
	p := pinPart("SET", StateSettings)
	if name := c.settingName(ts, j); name != "" {
		p.names = []string{name}
	}
	return p
}

// resetStmt classifies RESET name and RESET ALL.
func (c *classifier) resetStmt(ts []stok) part {
	p := pinPart("RESET", StateSettings)
	if keywordAt(ts, 1) == kwAll && len(ts) == 2 {
		return p
	}
	if name := c.settingName(ts, 1); name != "" {
		p.names = []string{name}
	}
	return p
}

// discardStmt classifies DISCARD ALL, TEMP, PLANS and SEQUENCES.
func discardStmt(ts []stok) part {
	switch keywordAt(ts, 1) {
	case kwAll:
		return pinPart("DISCARD ALL", StateDiscardAll|StateDeallocate|StateSettings|StatePrepared|StateCursor|StateListen|StateTemp|StateLock)
	case kwTemp, kwTemporary:
		return pinPart("DISCARD TEMP", StateTemp)
	}
	// PLANS and SEQUENCES leave nothing a later statement could miss on
	// another node; they still belong to the writer's session.
	return pinPart("DISCARD", 0)
}

// settingName returns the run-time parameter that SET or RESET names at
// ts[j], as the server looks it up (lower-cased; the special forms mapped
// to their parameter), or "" when it cannot tell.
func (c *classifier) settingName(ts []stok, j int) string {
	switch keywordAt(ts, j) {
	case kwTime:
		if keywordAt(ts, j+1) == kwZone {
			return "timezone"
		}
	case kwRole:
		return "role"
	case kwSession:
		if keywordAt(ts, j+1) == kwAuthorization {
			return "session_authorization"
		}
	case kwSchema:
		return "search_path"
	case kwNames:
		return "client_encoding"
	case kwXml:
		if keywordAt(ts, j+1) == kwOption {
			return "xmloption"
		}
	}
	var b strings.Builder
	for ; j < len(ts); j += 2 {
		t := ts[j]
		switch t.kind {
		case TokIdent:
			b.WriteString(strings.ToLower(c.src[t.start:t.end]))
		case TokQuotedIdent:
			if t.flags&flagUnicode != 0 {
				return ""
			}
			b.WriteString(strings.ToLower(strings.ReplaceAll(c.src[t.start+1:t.end-1], `""`, `"`)))
		default:
			return ""
		}
		if kindAt(ts, j+1) != TokDot {
			break
		}
		b.WriteByte('.')
	}
	return b.String()
}

// createsTemp reports a CREATE of a session-local object: TEMP/TEMPORARY
// after CREATE [OR REPLACE] [LOCAL|GLOBAL], or any name qualified with the
// pg_temp schema.
func (c *classifier) createsTemp(ts []stok) bool {
	j := 1
	if keywordAt(ts, j) == kwOr && keywordAt(ts, j+1) == kwReplace {
		j += 2
	}
	if k := keywordAt(ts, j); k == kwLocal || k == kwGlobal {
		j++
	}
	if k := keywordAt(ts, j); k == kwTemp || k == kwTemporary {
		return true
	}
	for i := 1; i+1 < len(ts); i++ {
		if ts[i+1].kind == TokDot && c.isTempSchema(ts[i]) {
			return true
		}
	}
	return false
}

// isTempSchema reports a name token spelling pg_temp or pg_temp_N.
func (c *classifier) isTempSchema(t stok) bool {
	var s string
	switch t.kind {
	case TokIdent:
		s = c.src[t.start:t.end]
		if len(s) < 7 || !asciiEqualFold(s[:7], "pg_temp") {
			return false
		}
	case TokQuotedIdent:
		if t.flags&flagUnicode != 0 {
			// Decoding is not worth it here: assume the worst.
			return true
		}
		s = c.src[t.start+1 : t.end-1]
		if !strings.HasPrefix(s, "pg_temp") {
			return false
		}
	default:
		return false
	}
	rest := s[7:]
	if rest == "" {
		return true
	}
	if rest[0] != '_' || len(rest) == 1 {
		return false
	}
	for i := 1; i < len(rest); i++ {
		if !isDigit(rest[i]) {
			return false
		}
	}
	return true
}

// explain classifies EXPLAIN. Without ANALYZE nothing is executed — the
// executor skips its read-only checks for EXPLAIN-only runs, so even
// EXPLAIN INSERT works on a standby — and only the plan is read.
func (c *classifier) explain(ts []stok, depth int) part {
	i := 1
	analyze := false
	switch keywordAt(ts, 1) {
	case kwAnalyze, kwAnalyse:
		analyze = true
		i = 2
		if keywordAt(ts, 2) == kwVerbose {
			i = 3
		}
	case kwVerbose:
		i = 2
	}
	if i == 1 && kindAt(ts, 1) == TokLParen && !startsQuery(ts, 2) {
		close := matchParen(ts, 1)
		if close < 0 {
			return writePart("EXPLAIN")
		}
		analyze = c.explainAnalyzeOption(ts[2:close])
		i = close + 1
	}
	if i >= len(ts) {
		return writePart("EXPLAIN")
	}
	inner := ts[i:]
	if analyze {
		p := c.stmt(inner, depth+1)
		if p.tx != TxNone {
			return writePart("EXPLAIN ANALYZE")
		}
		if p.write || p.pin {
			p.reason = "EXPLAIN ANALYZE " + p.reason
		} else {
			p.reason = "EXPLAIN ANALYZE"
		}
		return p
	}
	switch {
	case keywordAt(inner, 0) == kwExecute:
		// The prepared statement only exists on the session that made it.
		return pinPart("EXPLAIN EXECUTE", StatePrepared)
	case inner[0].kind == TokLParen:
	default:
		switch inner[0].kw {
		case kwSelect, kwWith, kwValues, kwTable, kwInsert, kwUpdate, kwDelete, kwMerge,
			kwDeclare, kwCreate:
		default:
			return writePart("EXPLAIN")
		}
	}
	return part{reason: "EXPLAIN"}
}

// startsQuery reports whether ts[i] can begin a query, which tells
// "EXPLAIN (SELECT ...)" from an option list: none of these words can name
// an EXPLAIN option followed by what a query has next.
func startsQuery(ts []stok, i int) bool {
	switch {
	case kindAt(ts, i) == TokLParen:
		return true
	case kindAt(ts, i) != TokIdent:
		return false
	}
	switch ts[i].kw {
	case kwSelect, kwWith, kwTable:
		return true
	case kwValues:
		return kindAt(ts, i+1) == TokLParen
	}
	return false
}

// explainAnalyzeOption reports whether an EXPLAIN option list turns ANALYZE
// on. Any ANALYZE whose value is not literally false/off/0 counts, which is
// stricter than the server (it would reject a bad value, or let a later
// ANALYZE false win).
func (c *classifier) explainAnalyzeOption(opts []stok) bool {
	on := false
	for i := 0; i < len(opts); {
		// One option: name [value] up to the next top-level comma.
		end := i
		depth := 0
		for end < len(opts) && !(depth == 0 && opts[end].kind == TokComma) {
			switch opts[end].kind {
			case TokLParen:
				depth++
			case TokRParen:
				depth--
			}
			end++
		}
		if end > i && c.isOptionAnalyze(opts[i]) {
			if end-i == 1 || !c.isFalseValue(opts[i+1:end]) {
				on = true
			}
		}
		i = end + 1
	}
	return on
}

func (c *classifier) isOptionAnalyze(t stok) bool {
	switch t.kind {
	case TokIdent:
		return t.kw == kwAnalyze || t.kw == kwAnalyse
	case TokQuotedIdent:
		s := c.src[t.start:t.end]
		return s == `"analyze"` || s == `"analyse"`
	}
	return false
}

func (c *classifier) isFalseValue(v []stok) bool {
	if len(v) != 1 {
		return false
	}
	t := v[0]
	s := c.src[t.start:t.end]
	switch t.kind {
	case TokNumber:
		return s == "0"
	case TokIdent:
		return asciiEqualFold(s, "false") || asciiEqualFold(s, "off")
	case TokString, TokQuotedIdent:
		if t.flags&flagUnicode != 0 || s[0] != '\'' && s[0] != '"' {
			return false
		}
		body := s[1 : len(s)-1]
		return asciiEqualFold(body, "false") || asciiEqualFold(body, "off")
	}
	return false
}

// declare classifies DECLARE ... CURSOR ... FOR query: it pins (the cursor
// lives in the session) and also writes if its query does.
func (c *classifier) declare(ts []stok, depth int) part {
	cursor := -1
	for i := 1; i < len(ts); i++ {
		if cursor < 0 && ts[i].kw == kwCursor {
			cursor = i
		} else if cursor >= 0 && ts[i].kw == kwFor {
			if i+1 >= len(ts) {
				break
			}
			p := c.stmt(ts[i+1:], depth+1)
			if p.tx != TxNone {
				return part{write: true, pin: true, state: StateCursor, reason: "DECLARE"}
			}
			if p.write {
				p.reason = "DECLARE " + p.reason
			} else {
				p.reason = "DECLARE"
			}
			p.pin = true
			p.state |= StateCursor
			p.txLocal = !withHold(ts[:i])
			return p
		}
	}
	return part{write: true, pin: true, state: StateCursor, reason: "DECLARE"}
}

// withHold reports WITH HOLD among a DECLARE's options (before its FOR).
func withHold(ts []stok) bool {
	for i := 1; i < len(ts); i++ {
		if ts[i].kw == kwHold && ts[i-1].kw == kwWith {
			return true
		}
	}
	return false
}

// copyStmt classifies COPY. Only COPY ... TO STDOUT is a read; TO a file or
// PROGRAM writes on the server it runs on.
func (c *classifier) copyStmt(ts []stok, depth int) part {
	j := 1
	if keywordAt(ts, j) == kwBinary {
		j++
	}
	var inner []stok
	switch {
	case kindAt(ts, j) == TokLParen:
		close := matchParen(ts, j)
		if close < 0 {
			return writePart("COPY")
		}
		inner = ts[j+1 : close]
		j = close + 1
	case j < len(ts) && isName(ts[j]):
		j++
		for kindAt(ts, j) == TokDot && j+1 < len(ts) && isName(ts[j+1]) {
			j += 2
		}
		if kindAt(ts, j) == TokLParen {
			close := matchParen(ts, j)
			if close < 0 {
				return writePart("COPY")
			}
			j = close + 1
		}
	default:
		return writePart("COPY")
	}
	switch keywordAt(ts, j) {
	case kwFrom:
		return writePart("COPY FROM")
	case kwTo:
		if keywordAt(ts, j+1) != kwStdout {
			return writePart("COPY TO file")
		}
	default:
		return writePart("COPY")
	}
	if inner != nil {
		if len(inner) == 0 {
			return writePart("COPY")
		}
		p := c.stmt(inner, depth+1)
		if p.tx != TxNone {
			return writePart("COPY")
		}
		if p.write || p.pin {
			return p
		}
	}
	return part{reason: "COPY TO STDOUT"}
}

// matchParen returns the index of the ')' matching the '(' at ts[open], or -1.
func matchParen(ts []stok, open int) int {
	depth := 0
	for i := open; i < len(ts); i++ {
		switch ts[i].kind {
		case TokLParen:
			depth++
		case TokRParen:
			depth--
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}
