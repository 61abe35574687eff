// Package pgquerycheck is a test-only module that checks pgryw's statement
// classifier (internal/sqlclass) against PostgreSQL's own parser, through
// pg_query_go (cgo, libpg_query). It is a separate module so that users of
// pgryw never link cgo. Run it with:
//
//	cd internal/pgquerycheck && go test ./...
package pgquerycheck

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	pg_query "github.com/pganalyze/pg_query_go/v6"

	"github.com/pgryw/pgryw/internal/sqlclass"
)

// tableSQL reads the sql column of internal/sqlclass/testdata/cases.tsv
// (format documented at the top of that file).
func tableSQL(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("../sqlclass/testdata/cases.tsv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		col := strings.Split(line, "\t")
		if len(col) != 6 {
			t.Fatalf("cases.tsv: %d columns in %q", len(col), line)
		}
		sql := col[4]
		if strings.HasPrefix(sql, `"`) {
			if err := json.Unmarshal([]byte(sql), &sql); err != nil {
				t.Fatal(err)
			}
		}
		out = append(out, sql)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Fragments for the generated corpus. Each is combined with the others; many
// combinations are not valid SQL and are skipped after the parser rejects
// them, since the server would reject them too.
var (
	prefixes = []string{"", "/* c */ ", "-- c\n", "/*pgryw:replica*/ ", "/* nested /* */ */"}
	ctes     = []string{
		"",
		"WITH x AS (SELECT 1 AS a) ",
		"WITH x AS (DELETE FROM t RETURNING *) ",
		"WITH x(a) AS (INSERT INTO t VALUES (1) RETURNING a) ",
		"WITH x AS MATERIALIZED (UPDATE t SET a = 1 RETURNING a) ",
		"WITH x AS NOT MATERIALIZED (SELECT f(1) AS a) ",
		"WITH RECURSIVE x(a) AS (SELECT 1 UNION ALL SELECT a + 1 FROM x WHERE a < 3) ",
		"WITH x AS (SELECT * FROM t FOR UPDATE) ",
		"WITH x AS (WITH y AS (DELETE FROM t RETURNING 1 AS a) SELECT * FROM y) ",
		"WITH x AS (MERGE INTO t USING u ON true WHEN MATCHED THEN DELETE RETURNING t.a) ",
		"WITH x AS (SELECT 1 AS a), y(b) AS (SELECT nextval('s')) ",
		"WITH x AS (SELECT 1 AS a), \"update\" AS (SELECT 2) ",
	}
	mains = []string{
		"SELECT * FROM x",
		"SELECT %s",
		"SELECT %s FROM t",
		"SELECT a, %s FROM t WHERE b = $1 ORDER BY 1",
		"SELECT * FROM t WHERE a = %s",
		"SELECT * FROM t x(a, b) JOIN u y(c) ON %s",
		"SELECT DISTINCT ON (a) %s FROM t",
		"SELECT a FROM t GROUP BY ROLLUP(a), %s",
		"SELECT count(*) FILTER (WHERE %s) OVER (PARTITION BY a) FROM t",
		"VALUES (%s)",
		"TABLE t",
		"(SELECT %s) UNION (SELECT 2)",
		"SELECT %s INTO tmp FROM t",
		"SELECT * FROM %s",
		"SELECT * FROM t, LATERAL (SELECT %s) l",
		"SELECT (SELECT %s FROM t LIMIT 1)",
		"SELECT * FROM t WHERE EXISTS (SELECT %s)",
		"INSERT INTO t VALUES (%s)",
		"UPDATE t SET a = %s",
		"DELETE FROM t WHERE a = %s",
	}
	exprs = []string{
		"1", "f(1)", "nextval('s')", "now()", "pg_catalog.lower('A')", `"nextval"('s')`,
		`U&"\006Eextval"('s')`, `U&"nextv!0061l" UESCAPE '!' ('s')`, "'nextval(1)'",
		"$$DELETE FROM t$$", "$q$ FOR UPDATE $q$", "substring(a for 2)", "coalesce(a, f(b))",
		"CAST(f(1) AS int)", "x::varchar(10)", "1 OPERATOR(pg_catalog.+) f(2)", "(SELECT f(1))",
		"ARRAY(SELECT g(2))", "EXISTS(SELECT 1 FROM t FOR SHARE)", "myschema.f(1)", "left(a, 1)",
		"random()", "txid_current()", "currval('s')", "set_config('a', 'b', false)",
		"pg_advisory_lock(1)", "lo_create(0)", "EXTRACT(year FROM now())", "a IS DISTINCT FROM f(1)",
		"generate_series(1, 3)", "interval '1' day to second(3)", "now() AT TIME ZONE ('UTC')",
		"overlay(a PLACING 'x' FROM 1 FOR 2)", `"MyFunc"(1)`, "pg_sleep(0)", "cube(1, 2)",
		"E'\\'' || f(2)", "'a' /* c */ || g(1)", "$1", "\"for\"", "t.update",
	}
	suffixes = []string{
		"", " FOR UPDATE", " FOR NO KEY UPDATE SKIP LOCKED", " FOR SHARE OF t NOWAIT",
		" FOR KEY SHARE", " LIMIT 1", " /*controller='x',route='y'*/", " -- for update",
		"; SELECT 1", "; DELETE FROM t", "; SELECT f(2)",
	}
	wrappers = []string{
		"%s", "%s", "%s", "EXPLAIN %s", "EXPLAIN ANALYZE %s", "EXPLAIN (ANALYZE) %s",
		"EXPLAIN (ANALYZE false, COSTS off) %s", "EXPLAIN (FORMAT JSON, ANALYZE 1) %s",
		"COPY (%s) TO STDOUT", "DECLARE c CURSOR FOR %s", "PREPARE p AS %s",
	}
)

// corpus returns n generated statements, the same on every run.
func corpus(n int) []string {
	r := rand.New(rand.NewPCG(1, 2))
	pick := func(s []string) string { return s[r.IntN(len(s))] }
	out := make([]string, 0, n)
	for len(out) < n {
		main := pick(mains)
		//lint:ignore S1017 pick draws from the generator only when used, which keeps the corpus stable
		if strings.Contains(main, "%s") {
			main = strings.Replace(main, "%s", pick(exprs), 1)
		}
		stmt := pick(ctes) + main + pick(suffixes)
		w := pick(wrappers)
		if strings.Contains(stmt, ";") && w != "%s" {
			continue // a wrapper around two statements only wraps the first
		}
		out = append(out, pick(prefixes)+strings.Replace(w, "%s", stmt, 1))
	}
	return out
}

// commented puts a block comment between every two tokens of sql, which
// must change nothing.
func commented(sql string) string {
	var b strings.Builder
	last := 0
	sqlclass.Lex(sql, func(tk sqlclass.Token) bool {
		b.WriteString(sql[last:tk.Start])
		if last > 0 {
			b.WriteString("/**/")
		}
		b.WriteString(tk.Text(sql))
		last = tk.End
		return true
	})
	b.WriteString(sql[last:])
	return b.String()
}

// verdict is what the parse tree says about a statement string.
type verdict struct {
	write  bool
	reason string
}

func (v *verdict) mark(format string, args ...any) {
	if !v.write {
		v.write = true
		v.reason = fmt.Sprintf(format, args...)
	}
}

// treeVerdict parses sql with the PostgreSQL parser and reports whether it
// could write: any InsertStmt/UpdateStmt/DeleteStmt/MergeStmt anywhere, a
// locking clause, an INTO clause, a top-level statement other than SELECT,
// EXPLAIN without ANALYZE, SHOW or COPY TO STDOUT, or a call to a function
// that is not a built-in read. ok is false when the parser rejects sql.
func treeVerdict(sql string) (v verdict, ok bool) {
	js, err := pg_query.ParseToJSON(sql)
	if err != nil {
		return v, false
	}
	var tree struct {
		Stmts []struct {
			Stmt map[string]any `json:"stmt"`
		} `json:"stmts"`
	}
	if err := json.Unmarshal([]byte(js), &tree); err != nil {
		panic(err)
	}
	for _, s := range tree.Stmts {
		topLevel(s.Stmt, &v)
	}
	return v, true
}

func topLevel(stmt map[string]any, v *verdict) {
	for kind, body := range stmt {
		b, _ := body.(map[string]any)
		switch kind {
		case "SelectStmt":
			walk(stmt, v) // from the top, so its own locking and INTO clauses count
		case "VariableShowStmt":
		case "ExplainStmt":
			if explainAnalyze(b) {
				q, _ := b["query"].(map[string]any)
				topLevel(q, v)
			}
		case "CopyStmt":
			switch {
			case b["is_from"] == true:
				v.mark("COPY FROM")
			case b["filename"] != nil || b["is_program"] == true:
				v.mark("COPY TO file")
			default:
				if q, ok := b["query"].(map[string]any); ok {
					topLevel(q, v)
				}
			}
		default:
			v.mark("%s", kind)
		}
	}
}

func explainAnalyze(b map[string]any) bool {
	opts, _ := b["options"].([]any)
	on := false
	for _, o := range opts {
		d, _ := o.(map[string]any)["DefElem"].(map[string]any)
		if d["defname"] != "analyze" {
			continue
		}
		arg, _ := d["arg"].(map[string]any)
		switch {
		case arg == nil:
			on = true
		case arg["Boolean"] != nil:
			on = arg["Boolean"].(map[string]any)["boolval"] == true
		case arg["Integer"] != nil:
			on = arg["Integer"].(map[string]any)["ival"] != nil
		case arg["String"] != nil:
			s, _ := arg["String"].(map[string]any)["sval"].(string)
			s = strings.ToLower(s)
			on = s == "true" || s == "on"
		default:
			on = true
		}
	}
	return on
}

// walk looks for writes anywhere below a node.
func walk(n any, v *verdict) {
	switch n := n.(type) {
	case []any:
		for _, x := range n {
			walk(x, v)
		}
	case map[string]any:
		for k, x := range n {
			switch k {
			case "InsertStmt", "UpdateStmt", "DeleteStmt", "MergeStmt":
				v.mark("%s", k)
			case "lockingClause":
				// Checked by key rather than under a "SelectStmt" wrapper:
				// the larg/rarg branches of a set operation are bare bodies.
				if l, _ := x.([]any); len(l) > 0 {
					v.mark("lockingClause")
				}
			case "intoClause":
				v.mark("intoClause")
			case "FuncCall":
				f, _ := x.(map[string]any)
				var parts []string
				for _, p := range f["funcname"].([]any) {
					parts = append(parts, p.(map[string]any)["String"].(map[string]any)["sval"].(string))
				}
				if name := strings.Join(parts, "."); !sqlclass.IsBuiltinRead(name) {
					v.mark("FuncCall %s", name)
				}
			}
			walk(x, v)
		}
	}
}

// pgrywRead reports whether pgryw would send sql to a replica when it
// resolves Funcs with only the built-in read list, i.e. without a catalog.
// Transaction control is routed by the transaction, never as a read.
func pgrywRead(r sqlclass.Result) bool {
	if !r.ReadOnly() || r.Tx != sqlclass.TxNone {
		return false
	}
	for _, f := range r.Funcs {
		if !sqlclass.IsBuiltinRead(f) {
			return false
		}
	}
	return true
}

func TestNeverReadWhereParserSeesWrite(t *testing.T) {
	table := tableSQL(t)
	inputs := append(table, corpus(30000)...)
	for _, sql := range table {
		inputs = append(inputs, commented(sql))
	}
	var parsed, rejected, agreeRead, agreeWrite, conservative int
	falseWrites := map[string]int{}
	for _, sql := range inputs {
		r := sqlclass.Classify(sql)
		v, ok := treeVerdict(sql)
		if !ok {
			rejected++
			continue
		}
		parsed++
		read := pgrywRead(r)
		switch {
		case read && v.write:
			t.Errorf("pgryw says read, parser sees a write (%s):\n%s\nresult: %+v", v.reason, sql, r)
		case read:
			agreeRead++
		case v.write:
			agreeWrite++
		default:
			conservative++
			if falseWrites[r.Reason] == 0 {
				t.Logf("writer-bound, no write in the tree: %q (%s)", sql, r.Reason)
			}
			falseWrites[r.Reason]++
		}
	}
	t.Logf("%d inputs: %d rejected by the parser; of %d parsed: %d reads and %d writes agreed, %d sent to the writer though the tree shows no write",
		len(inputs), rejected, parsed, agreeRead, agreeWrite, conservative)
	var reasons []string
	for k, n := range falseWrites {
		reasons = append(reasons, fmt.Sprintf("%d× %s", n, k))
	}
	sort.Strings(reasons)
	t.Logf("writer-bound without a write in the tree, by reason (session state, transaction control, utility statements...): %s", strings.Join(reasons, "; "))
	if agreeRead == 0 || agreeWrite == 0 {
		t.Error("corpus exercises only one side")
	}
}

// treeState reads, from the parse tree of a one-statement string, the
// session state the statement touches as pgryw's router needs it: the kind
// (spelled as sqlclass's State constants) and, for SET and RESET, the
// parameter the parser resolved (SET TIME ZONE is timezone, SET NAMES
// client_encoding...). ok is false for statements this check does not
// cover.
func treeState(sql string) (kind sqlclass.State, names []string, ok bool) {
	js, err := pg_query.ParseToJSON(sql)
	if err != nil {
		return 0, nil, false
	}
	var tree struct {
		Stmts []struct {
			Stmt map[string]map[string]any `json:"stmt"`
		} `json:"stmts"`
	}
	if err := json.Unmarshal([]byte(js), &tree); err != nil || len(tree.Stmts) != 1 {
		return 0, nil, false
	}
	for k, b := range tree.Stmts[0].Stmt {
		switch k {
		case "VariableSetStmt":
			if b["is_local"] == true {
				return 0, nil, false
			}
			name, _ := b["name"].(string)
			switch b["kind"] {
			case "VAR_RESET_ALL":
				return sqlclass.StateSettings, nil, true
			case "VAR_SET_MULTI":
				if name == "TRANSACTION" || name == "TRANSACTION SNAPSHOT" {
					return 0, nil, false // lives and dies with the transaction
				}
				return sqlclass.StateSettings, nil, true
			}
			return sqlclass.StateSettings, []string{strings.ToLower(name)}, true
		case "ListenStmt", "UnlistenStmt":
			return sqlclass.StateListen, nil, true
		case "PrepareStmt", "ExecuteStmt", "DeallocateStmt":
			return sqlclass.StatePrepared, nil, true
		case "DeclareCursorStmt", "FetchStmt", "ClosePortalStmt":
			return sqlclass.StateCursor, nil, true
		case "LoadStmt":
			return sqlclass.StatePermanent, nil, true
		case "DiscardStmt":
			switch b["target"] {
			case "DISCARD_ALL":
				return sqlclass.StateDiscardAll, nil, true
			case "DISCARD_TEMP":
				return sqlclass.StateTemp, nil, true
			}
			return 0, nil, true
		case "CreateStmt", "CreateTableAsStmt", "ViewStmt", "CreateSeqStmt":
			if strings.Contains(js, `"relpersistence":"t"`) {
				return sqlclass.StateTemp, nil, true
			}
		}
	}
	return 0, nil, false
}

// TestSessionStateAgreesWithParser checks the kind of session state
// sqlclass reports, and the parameter names of SET and RESET, against the
// parse tree, for every statement in the table and the SET/RESET forms
// below: the router pins, reads back and carries state to replicas by
// these.
func TestSessionStateAgreesWithParser(t *testing.T) {
	inputs := tableSQL(t)
	for _, name := range []string{"search_path", "app.tenant", `"App"."Tenant"`, "statement_timeout", "DateStyle", "work_mem", "TimeZone"} {
		inputs = append(inputs,
			"SET "+name+" = DEFAULT", "SET SESSION "+name+" TO 'x'", "RESET "+name, "set "+name+" to 1")
	}
	inputs = append(inputs, "SET TIME ZONE LOCAL", "SET ROLE NONE", "SET SESSION AUTHORIZATION DEFAULT",
		"SET SCHEMA 'a'", "SET NAMES 'UTF8'", "SET XML OPTION CONTENT", "RESET TIME ZONE", "RESET ROLE",
		"RESET SESSION AUTHORIZATION", "RESET ALL", "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
		"DISCARD ALL", "DISCARD TEMP", "DISCARD PLANS", "DISCARD SEQUENCES", "LISTEN a", "UNLISTEN *",
		"PREPARE p AS SELECT 1", "DEALLOCATE p", "DECLARE c CURSOR WITH HOLD FOR SELECT 1", "CLOSE c", "LOAD 'x'")
	checked := 0
	for _, sql := range inputs {
		want, names, ok := treeState(sql)
		if !ok {
			continue
		}
		checked++
		r := sqlclass.Classify(sql)
		if !r.Pin {
			t.Errorf("%q: the parser sees session state (%v), sqlclass does not pin: %+v", sql, want, r)
			continue
		}
		if r.State&want != want {
			t.Errorf("%q: parser's kind %b not in sqlclass's State %b", sql, want, r.State)
		}
		for _, n := range names {
			if !slices.Contains(r.Settings, n) {
				t.Errorf("%q: the parser sets %q, sqlclass's Settings are %q", sql, n, r.Settings)
			}
		}
	}
	t.Logf("%d statements checked against the parse tree", checked)
	if checked < 50 {
		t.Errorf("only %d statements checked", checked)
	}
}
