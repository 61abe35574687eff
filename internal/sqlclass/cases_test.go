package sqlclass

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// tcase is one line of testdata/cases.tsv; the file's header documents the
// format, which other modules parse too.
type tcase struct {
	line  int
	route string // read, write, pin, write+pin, none; pins with ":" and their state
	tx    TxOp
	hint  Hint
	funcs []string
	sql   string
	why   string
}

func loadCases(tb testing.TB) []tcase {
	tb.Helper()
	f, err := os.Open("testdata/cases.tsv")
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	txs := map[string]TxOp{"none": TxNone, "begin": TxBegin, "commit": TxCommit, "rollback": TxRollback, "savepoint": TxSavepoint}
	hints := map[string]Hint{"none": HintNone, "primary": HintPrimary, "replica": HintReplica}
	routes := map[string]bool{"read": true, "write": true, "pin": true, "write+pin": true, "none": true}
	var cases []tcase
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		col := strings.Split(line, "\t")
		if len(col) != 6 {
			tb.Fatalf("cases.tsv:%d: %d columns, want 6", n, len(col))
		}
		c := tcase{line: n, route: col[0], sql: col[4], why: col[5]}
		var ok1, ok2 bool
		c.tx, ok1 = txs[col[1]]
		c.hint, ok2 = hints[col[2]]
		base, state, pinned := strings.Cut(c.route, ":")
		if pinned != strings.HasSuffix(base, "pin") || pinned && state == "" {
			tb.Fatalf("cases.tsv:%d: a pin route names its state (pin:kinds), and only a pin route does", n)
		}
		if !routes[base] || !ok1 || !ok2 || c.why == "" {
			tb.Fatalf("cases.tsv:%d: bad route, tx, hint or why", n)
		}
		if (c.route == "none") != (c.tx != TxNone && c.route != "write" && !strings.Contains(c.route, "pin")) {
			tb.Fatalf("cases.tsv:%d: route none is for transaction control only", n)
		}
		if col[3] != "-" {
			c.funcs = strings.Split(col[3], ",")
		}
		if strings.HasPrefix(c.sql, `"`) {
			if err := json.Unmarshal([]byte(c.sql), &c.sql); err != nil {
				tb.Fatalf("cases.tsv:%d: %v", n, err)
			}
		}
		cases = append(cases, c)
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return cases
}

func routeOf(r Result) string {
	switch {
	case r.Write && r.Pin:
		return "write+pin:" + stateString(r)
	case r.Write:
		return "write"
	case r.Pin:
		return "pin:" + stateString(r)
	case r.Tx != TxNone:
		return "none"
	}
	return "read"
}

// stateString spells r.State and r.Settings as cases.tsv does: the kinds
// in declaration order joined by "|", settings as settings=name/name.
func stateString(r Result) string {
	names := []string{"settings", "untracked", "prepared", "cursor", "listen", "temp", "lock", "sequence", "permanent", "discardall", "deallocate"}
	var parts []string
	for i, n := range names {
		if r.State&(1<<i) == 0 {
			continue
		}
		if i == 0 && len(r.Settings) > 0 {
			n += "=" + strings.Join(r.Settings, "/")
		}
		parts = append(parts, n)
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "|")
}

func TestCases(t *testing.T) {
	cases := loadCases(t)
	if len(cases) < 300 {
		t.Errorf("only %d cases, want at least 300", len(cases))
	}
	seen := map[string]int{}
	for _, c := range cases {
		if prev, dup := seen[c.sql]; dup {
			t.Errorf("cases.tsv:%d duplicates line %d", c.line, prev)
		}
		seen[c.sql] = c.line
		r := Classify(c.sql)
		if got := routeOf(r); got != c.route || r.Tx != c.tx || r.Hint != c.hint || !slices.Equal(r.Funcs, c.funcs) {
			t.Errorf("cases.tsv:%d %q (%s):\n got  %s %v %v funcs=%v (reason %q)\n want %s %v %v funcs=%v",
				c.line, c.sql, c.why, got, r.Tx, r.Hint, r.Funcs, r.Reason, c.route, c.tx, c.hint, c.funcs)
		}
		if r.Reason == "" {
			t.Errorf("cases.tsv:%d %q: empty Reason", c.line, c.sql)
		}
		if (r.Write || r.Pin) && r.Funcs != nil {
			t.Errorf("cases.tsv:%d %q: Funcs %v on a writer-bound result", c.line, c.sql, r.Funcs)
		}
	}
}

// TestReasons pins down a few Reason strings that errors and logs rely on.
func TestReasons(t *testing.T) {
	for sql, want := range map[string]string{
		"INSERT INTO t VALUES (1)":          "INSERT",
		"SELECT * FROM t FOR UPDATE":        "FOR UPDATE",
		"SELECT nextval('s')":               "nextval()",
		"SET x = 1":                         "SET",
		"SELECT 1":                          "SELECT",
		"WITH x AS (DELETE FROM t) TABLE x": "DELETE",
		"SELECT 'x":                         "unterminated string",
		"FOO":                               "unknown statement",
		"EXPLAIN ANALYZE DELETE FROM t":     "EXPLAIN ANALYZE DELETE",
	} {
		if got := Classify(sql).Reason; got != want {
			t.Errorf("Classify(%q).Reason = %q, want %q", sql, got, want)
		}
	}
}

// TestUnterminatedIsWrite cuts every case at every byte: whatever the cut
// leaves unterminated must be a write.
func TestPrefixesNeverPanic(t *testing.T) {
	for _, c := range loadCases(t) {
		for i := 0; i <= len(c.sql); i++ {
			checkInvariants(t, c.sql[:i])
		}
	}
}

func TestLexTokens(t *testing.T) {
	sql := `SELECT E'a\'b', U&"x" , $1::int, $q$ ; $q$ /* /* */ */ -- c` + "\n" + `x.y(3.5e2) <= 'it''s' ;`
	var got []string
	Lex(sql, func(tk Token) bool {
		got = append(got, fmt.Sprintf("%v:%s", tk.Kind, tk.Text(sql)))
		return true
	})
	want := []string{
		"Ident:SELECT", `String:E'a\'b'`, "Comma:,", `QuotedIdent:U&"x"`, "Comma:,",
		"Param:$1", "Typecast:::", "Ident:int", "Comma:,", "DollarString:$q$ ; $q$",
		"BlockComment:/* /* */ */", "LineComment:-- c", "Ident:x", "Dot:.", "Ident:y",
		"LParen:(", "Number:3.5e2", "RParen:)", "Operator:<=", "String:'it''s'", "Semicolon:;",
	}
	if !slices.Equal(got, want) {
		t.Errorf("Lex:\n got  %q\n want %q", got, want)
	}
	n := 0
	Lex(sql, func(Token) bool { n++; return n < 3 })
	if n != 3 {
		t.Errorf("Lex did not stop when fn returned false: %d calls", n)
	}
}

// checkInvariants is what the fuzz targets assert on any input.
func checkInvariants(t *testing.T, sql string) {
	t.Helper()
	prevEnd := 0
	unterminated := false
	first := ""
	Lex(sql, func(tk Token) bool {
		if tk.Start < prevEnd || tk.End <= tk.Start || tk.End > len(sql) {
			t.Fatalf("Lex(%q): bad span %d..%d after %d", sql, tk.Start, tk.End, prevEnd)
		}
		for _, b := range []byte(sql[prevEnd:tk.Start]) {
			if !isSpace(b) {
				t.Fatalf("Lex(%q): skipped non-space byte %q before %d", sql, b, tk.Start)
			}
		}
		prevEnd = tk.End
		if tk.Kind == TokError {
			unterminated = true
		}
		if first == "" && tk.Kind != TokLineComment && tk.Kind != TokBlockComment {
			first = tk.Text(sql)
			if tk.Kind != TokIdent && tk.Kind != TokLParen && tk.Kind != TokSemicolon {
				first = "?"
			}
		}
		return true
	})
	r := Classify(sql)
	if unterminated && !r.Write {
		t.Fatalf("Classify(%q) = %+v: input that does not lex must be Write", sql, r)
	}
	if first != "" && first != "(" && first != ";" && !knownLeader(first) && !r.Write {
		t.Fatalf("Classify(%q) = %+v: unknown leading word %q must be Write", sql, r, first)
	}
	if (r.Write || r.Pin) && r.Funcs != nil {
		t.Fatalf("Classify(%q): Funcs on a writer-bound result", sql)
	}
	if r.Reason == "" {
		t.Fatalf("Classify(%q): empty Reason", sql)
	}
}

// knownLeader lists the leading words that may classify as other than Write.
func knownLeader(w string) bool {
	switch k := lookupKeyword(w); k {
	case kwSelect, kwValues, kwTable, kwWith, kwShow, kwExplain, kwCopy, kwBegin, kwStart,
		kwCommit, kwEnd, kwRollback, kwAbort, kwSavepoint, kwRelease, kwPrepare, kwDeclare,
		kwFetch, kwMove, kwClose, kwListen, kwUnlisten, kwReset, kwDiscard, kwLoad, kwDeallocate, kwSet:
		return true
	}
	return false
}

func FuzzLex(f *testing.F) {
	for _, c := range loadCases(f) {
		f.Add(c.sql)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		prevEnd := 0
		Lex(sql, func(tk Token) bool {
			if tk.Start < prevEnd || tk.End <= tk.Start || tk.End > len(sql) {
				t.Fatalf("bad span %d..%d after %d", tk.Start, tk.End, prevEnd)
			}
			if tk.Kind > TokBlockComment {
				t.Fatalf("bad kind %d", tk.Kind)
			}
			prevEnd = tk.End
			return true
		})
	})
}

func FuzzClassify(f *testing.F) {
	for _, c := range loadCases(f) {
		f.Add(c.sql)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		checkInvariants(t, sql)
		// A read must stay a read, and a write a write, whatever comment is
		// appended: SQL commenter libraries do exactly that.
		r := Classify(sql)
		if r2 := Classify(sql + " /*controller='x'*/"); r.Write != r2.Write && !strings.Contains(sql, "--") {
			t.Fatalf("appending a comment changed Write: %q", sql)
		}
	})
}

func BenchmarkClassify(b *testing.B) {
	cases := loadCases(b)
	var bytes int64
	for _, c := range cases {
		bytes += int64(len(c.sql))
	}
	b.SetBytes(bytes / int64(len(cases)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		Classify(cases[i%len(cases)].sql)
	}
}

// BenchmarkClassifyORM measures the statements a typical ORM sends.
func BenchmarkClassifyORM(b *testing.B) {
	sqls := []string{
		`SELECT * FROM "users" WHERE "users"."id" = $1 ORDER BY "users"."id" LIMIT $2`,
		`INSERT INTO "users" ("created_at","updated_at","name") VALUES ($1,$2,$3) RETURNING "id"`,
		`SELECT count(*) FROM "users" WHERE name = $1 AND "users"."deleted_at" IS NULL /*controller='users'*/`,
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		Classify(sqls[i%len(sqls)])
	}
}

// variants rewrites sql without changing its meaning: a comment between
// every two tokens, and every unquoted word in swapped case.
func variants(sql string) []string {
	var commented, swapped strings.Builder
	last := 0
	Lex(sql, func(tk Token) bool {
		gap := sql[last:tk.Start]
		commented.WriteString(gap)
		swapped.WriteString(gap)
		if last > 0 {
			commented.WriteString("/*x*/")
		}
		text := tk.Text(sql)
		commented.WriteString(text)
		if tk.Kind == TokIdent {
			b := []byte(text)
			for i, c := range b {
				if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' {
					b[i] = c ^ 0x20
				}
			}
			text = string(b)
		}
		swapped.WriteString(text)
		last = tk.End
		return true
	})
	commented.WriteString(sql[last:])
	swapped.WriteString(sql[last:])
	return []string{commented.String(), swapped.String()}
}

func TestVariantsClassifyAlike(t *testing.T) {
	for _, c := range loadCases(t) {
		want := Classify(c.sql)
		for _, v := range variants(c.sql) {
			got := Classify(v)
			if got.Write != want.Write || got.Pin != want.Pin || got.Tx != want.Tx || got.State != want.State || !slices.Equal(got.Settings, want.Settings) || !slices.Equal(got.Funcs, want.Funcs) {
				t.Errorf("cases.tsv:%d: %q classifies as %+v, but its variant %q as %+v", c.line, c.sql, want, v, got)
			}
		}
	}
}
