package pgryw

import (
	"testing"

	"github.com/pgryw/pgryw/internal/sqlclass"
)

// TestSnapshotStmt pins which statements count as taking a read-only
// transaction's snapshot (tx.snapped): when the watermark rises before
// one did, the transaction moves to the primary instead of taking its
// snapshot on a replica that may not have the write.
func TestSnapshotStmt(t *testing.T) {
	for q, want := range map[string]bool{
		"SELECT 1":                                     true,
		"SELECT count(*) FROM t":                       true,
		"SELECT set_config('a.b', 'c', true)":          true,
		"DECLARE c CURSOR FOR SELECT 1":                true,
		"SHOW search_path":                             false,
		"SET LOCAL search_path = s1":                   false,
		"SET TRANSACTION ISOLATION LEVEL SERIALIZABLE": false,
		"SET CONSTRAINTS ALL DEFERRED":                 false,
		"SAVEPOINT sp":                                 false,
		"RELEASE SAVEPOINT sp":                         false,
		"ROLLBACK TO SAVEPOINT sp":                     false,
		"SHOW search_path; SELECT 1":                   false, // errs towards no: see takesSnapshot
		"":                                             false,
		";":                                            false,
		"FETCH 2 FROM c1":                              false,
		"MOVE NEXT IN c1":                              false,
		"CLOSE c1":                                     false,
	} {
		cls := sqlclass.Classify(q)
		if got := snapshotStmt(&cls); got != want {
			t.Errorf("snapshotStmt(%q) = %v, want %v", q, got, want)
		}
	}
}
