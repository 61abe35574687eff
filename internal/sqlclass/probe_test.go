package sqlclass

import "testing"

func TestNodeProbe(t *testing.T) {
	cases := []struct {
		sql   string
		probe bool
	}{
		{"SELECT pg_is_in_recovery()", true},
		{"select PG_IS_IN_RECOVERY();", true},
		{"SELECT pg_catalog.pg_is_in_recovery() AS standby, inet_server_port() port", true},
		{"SELECT inet_server_addr(), inet_server_port(), pg_backend_pid()", true},
		{"SELECT pg_current_wal_lsn()::text", true},
		{"SELECT /* where am I */ pg_is_in_recovery() \"in recovery\"", true},
		{"SELECT current_setting('port')", true},
		{"SELECT current_setting('port')::int AS p", true},
		{"SHOW in_hot_standby", true},
		{"SHOW port;", true},

		// Rows under the snapshot, or anything that could read them.
		{"SELECT count(*) FROM pg_stat_replication", false},
		{"SELECT pg_is_in_recovery() FROM t", false},
		{"SELECT pg_is_in_recovery(), (TABLE t)", false},
		{"SELECT pg_is_in_recovery(), (SELECT count(*) FROM t)", false},
		{"SELECT pg_is_in_recovery() UNION ALL TABLE t", false},
		{"SELECT pg_is_in_recovery() WHERE EXISTS (TABLE t)", false},
		{"SELECT stable_sum(), pg_is_in_recovery()", false},
		{"SELECT s1.pg_is_in_recovery()", false},
		{"SELECT \"pg_is_in_recovery\"()", false},
		{"SELECT inet_server_port() + 1", false},
		{"SELECT inet_server_port() / 0", false},
		{"SELECT pg_is_in_recovery(1)", false},
		{"SELECT 1", false},
		{"SELECT", false},
		{"SELECT pg_is_in_recovery(),", false},
		{"SELECT pg_is_in_recovery() AS", false},
		{"SELECT pg_is_in_recovery(); SELECT count(*) FROM t", false},
		{"WITH a AS (SELECT 1) SELECT pg_is_in_recovery()", false},
		{"EXPLAIN SELECT pg_is_in_recovery()", false},

		// What belongs to the transaction.
		{"SELECT now(), pg_is_in_recovery()", false},
		{"SELECT current_timestamp, pg_is_in_recovery()", false},
		{"SELECT pg_current_snapshot()", false},
		{"SELECT count(*) FROM pg_locks", false},
		{"SELECT count(*) FROM pg_stat_activity WHERE pid = pg_backend_pid()", false},
		{"SHOW transaction_read_only", false},
		{"SHOW transaction_isolation", false},
		{"SHOW ALL", false},
		{"SHOW search_path", false},
		{"SELECT current_setting('transaction_read_only')", false},
		{"SELECT current_setting('search_path')", false},
		{"SELECT current_setting($1)", false},
		{"SELECT current_setting('port', true)", false},
		{"SELECT pg_backend_pid()::mydomain", false},
		{"SELECT pg_current_wal_lsn()::leaky AS x", false},
		{"SELECT pg_backend_pid()::int[]", false},
		{"SELECT pg_bac\u212Aend_pid()", false},
		{"SELECT PG_BACKEND_PID()::INT8", true},
	}
	for _, c := range cases {
		if got := NodeProbe(c.sql); got != c.probe {
			t.Errorf("NodeProbe(%q) = %v, want %v", c.sql, got, c.probe)
		}
	}
}

func FuzzNodeProbe(f *testing.F) {
	f.Add("SELECT pg_is_in_recovery() AS r, current_setting('port')::int")
	f.Add("SHOW port")
	f.Fuzz(func(t *testing.T, sql string) {
		if NodeProbe(sql) && !Classify(sql).ReadOnly() {
			t.Fatalf("NodeProbe(%q) but Classify says it is no read", sql)
		}
	})
}
