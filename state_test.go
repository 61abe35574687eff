package pgryw

import (
	"testing"

	"github.com/pgryw/pgryw/internal/sqlclass"
)

func TestTextArray(t *testing.T) {
	for _, c := range []struct {
		vals []string
		null []bool
		want string
	}{
		{nil, nil, "{}"},
		{[]string{"search_path"}, nil, `{"search_path"}`},
		{[]string{`"$user", public`, `a\b`, "", "NULL"}, nil, `{"\"$user\", public","a\\b","","NULL"}`},
		{[]string{"x", ""}, []bool{false, true}, `{"x",NULL}`},
	} {
		if got := string(textArray(c.vals, c.null)); got != c.want {
			t.Errorf("textArray(%q, %v) = %s, want %s", c.vals, c.null, got, c.want)
		}
	}
}

// TestTouchesState: which statements make the router read the session's
// state back.
func TestTouchesState(t *testing.T) {
	for sql, want := range map[string]bool{
		"SET search_path = a":                     true,
		"SELECT set_config($1, $2, false)":        true,
		"SELECT pg_advisory_lock(1)":              true,
		"LISTEN c":                                true,
		"CREATE TEMP TABLE t (i int)":             true,
		"DISCARD ALL":                             true,
		"SELECT currval('s')":                     false,
		"DISCARD PLANS":                           false,
		"LOAD 'auto_explain'":                     false,
		"SELECT 1":                                false,
		"INSERT INTO t VALUES (1)":                false,
		"SELECT setseed(0.5)":                     false,
		"BEGIN; SET search_path = a; COMMIT":      true,
		"DECLARE c CURSOR WITH HOLD FOR SELECT 1": true,
	} {
		cls := sqlclass.Classify(sql)
		if got := touchesState(&cls); got != want {
			t.Errorf("touchesState(%q) = %v, want %v (%+v)", sql, got, want, cls)
		}
	}
}
