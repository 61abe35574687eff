package sqlclass

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestReadsRunOnStandby sends every case the table calls an unconditional
// read to a real hot standby through psql (one simple-protocol query, as a
// driver sends it) and fails if the server refuses it as a write. Set
// SQLCLASS_STANDBY to a libpq connection string of a PostgreSQL standby to
// run it, and SQLCLASS_PSQL to the psql binary if it is not on PATH.
// Statements may fail for other reasons (missing tables); the test reports
// how many ran cleanly.
func TestReadsRunOnStandby(t *testing.T) {
	dsn := os.Getenv("SQLCLASS_STANDBY")
	if dsn == "" {
		t.Skip("SQLCLASS_STANDBY not set")
	}
	psql := os.Getenv("SQLCLASS_PSQL")
	if psql == "" {
		psql = "psql"
	}
	refused := regexp.MustCompile(`ERROR:  (25006|55000|XX000|0A000|25P01): .*(read-only|recovery|cannot assign|cannot execute|standby)`)
	ok, failed := 0, 0
	for _, c := range loadCases(t) {
		if c.route != "read" || c.funcs != nil || strings.TrimSpace(c.sql) == "" {
			continue
		}
		// psql cannot bind parameters: stand NULL in for them.
		var b strings.Builder
		last := 0
		Lex(c.sql, func(tk Token) bool {
			if tk.Kind == TokParam {
				b.WriteString(c.sql[last:tk.Start])
				b.WriteString("NULL")
				last = tk.End
			}
			return true
		})
		b.WriteString(c.sql[last:])
		out, err := exec.Command(psql, "-X", "-v", "VERBOSITY=verbose", "-d", dsn, "-c", b.String()).CombinedOutput()
		switch {
		case refused.Match(out):
			t.Errorf("cases.tsv:%d %q: refused on a standby:\n%s", c.line, c.sql, out)
		case err != nil:
			failed++
			t.Logf("cases.tsv:%d %q: %s", c.line, c.sql, strings.TrimSpace(string(out)))
		default:
			ok++
		}
	}
	t.Logf("%d reads ran on the standby, %d failed for other reasons", ok, failed)
}
