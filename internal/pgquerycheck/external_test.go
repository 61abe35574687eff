package pgquerycheck

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/pgryw/pgryw/internal/sqlclass"
)

// externalCorpus collects the string literals of the test files of
// pg_query_go and pgx (both already in the module graph): statements written
// by other people, for other purposes. The parser later drops the literals
// that are not SQL.
func externalCorpus(t *testing.T) []string {
	t.Helper()
	var files []string
	for _, mod := range []string{"github.com/pganalyze/pg_query_go/v6", "github.com/jackc/pgx/v5"} {
		// "go mod download -json" reports the source directory, fetching
		// the module first if the cache only has its go.mod.
		out, err := exec.Command("go", "mod", "download", "-json", mod).Output()
		var info struct{ Dir string }
		if err != nil || json.Unmarshal(out, &info) != nil || info.Dir == "" {
			t.Logf("cannot locate %s sources (%v): skipping it", mod, err)
			continue
		}
		filepath.WalkDir(info.Dir, func(path string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(path, "_test.go") {
				files = append(files, path)
			}
			return nil
		})
	}
	seen := map[string]bool{}
	var sqls []string
	fset := token.NewFileSet()
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil || len(s) < 4 || seen[s] || strings.HasPrefix(s, "{") {
				return true
			}
			seen[s] = true
			sqls = append(sqls, s)
			return true
		})
	}
	return sqls
}

func TestExternalCorpus(t *testing.T) {
	var parsed, reads int
	for _, sql := range externalCorpus(t) {
		v, ok := treeVerdict(sql)
		if !ok {
			continue
		}
		parsed++
		r := sqlclass.Classify(sql)
		read := pgrywRead(r)
		if read {
			reads++
		}
		if read && v.write {
			t.Errorf("pgryw says read, parser sees a write (%s):\n%s\nresult: %+v", v.reason, sql, r)
		}
		if !read && !v.write {
			t.Logf("writer-bound, no write in the tree: %q (%s)", sql, r.Reason)
		}
	}
	t.Logf("%d statements from pg_query_go's and pgx's tests parsed, %d classified as reads", parsed, reads)
}
