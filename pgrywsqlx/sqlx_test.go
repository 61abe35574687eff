package pgrywsqlx_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"

	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
	_ "github.com/pgryw/pgryw/pgrywsqlx"
)

var cluster *pgtest.Cluster

func TestMain(m *testing.M) {
	os.Exit(pgtest.Main(m, pgtest.Options{Replicas: 2}, func(c *pgtest.Cluster) { cluster = c }))
}

type item struct {
	ID   int64  `db:"id"`
	Name string `db:"name"`
}

// The way a sqlx user writes code: sqlx.Open with the driver's name, named
// statements, In with Rebind, Get and Select, each write read back at once
// while the replicas are 100 ms behind. The same program on pgx's driver
// against the primary is the reference; every answer must be the same, and
// pgryw's reads must have run on replicas.
func TestSqlxAsUsersWriteIt(t *testing.T) {
	pgtest.Require(t, cluster)
	ctx := context.Background()
	if err := cluster.SetApplyDelay(ctx, -1, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cluster.SetApplyDelay(context.Background(), -1, 0) })
	ref, err := sqlx.Open("pgx", cluster.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	dsn := cluster.WriterDSN() + "&wait_timeout=2s&replicas=" + strings.Join(cluster.ReplicaAddrs(), ",")
	db, err := sqlx.Open("pgryw", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if db.DriverName() != "pgryw" || db.Rebind("?") != "$1" {
		t.Fatalf("sqlx binds %q for driver %q", db.Rebind("?"), db.DriverName())
	}
	for _, tbl := range []string{"sqlx_ref", "sqlx_ryw"} {
		if _, err := ref.Exec("DROP TABLE IF EXISTS " + tbl + "; CREATE TABLE " + tbl + " (id bigint PRIMARY KEY, name text NOT NULL)"); err != nil {
			t.Fatal(err)
		}
	}
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	run := func(db *sqlx.DB, tbl string) []string {
		var out []string
		note := func(what string, err error, v any) {
			if err != nil {
				out = append(out, what+": "+err.Error())
				return
			}
			out = append(out, what+": "+fmt.Sprint(v))
		}
		for i := int64(1); i <= 5; i++ {
			_, err := db.NamedExecContext(ctx, "INSERT INTO "+tbl+" (id, name) VALUES (:id, :name)", item{ID: i, Name: "n" + string(rune('a'+i))})
			note("named insert", err, i)
			var got item
			err = db.GetContext(ctx, &got, db.Rebind("SELECT id, name FROM "+tbl+" WHERE id = ?"), i)
			note("get", err, got)
		}
		q, args, err := sqlx.In("SELECT id, name FROM "+tbl+" WHERE id IN (?) ORDER BY id", []int64{1, 3, 5})
		note("in", err, q)
		var some []item
		err = db.SelectContext(ctx, &some, db.Rebind(q), args...)
		note("select in", err, some)
		rows, err := db.NamedQueryContext(ctx, "SELECT count(*) AS n FROM "+tbl+" WHERE id > :min", map[string]any{"min": 2})
		if err == nil {
			var n int
			for rows.Next() {
				err = rows.Scan(&n)
			}
			rows.Close()
			note("named query", err, n)
		} else {
			note("named query", err, nil)
		}
		stmt, err := db.PrepareNamedContext(ctx, "SELECT name FROM "+tbl+" WHERE id = :id")
		if err == nil {
			var name string
			err = stmt.GetContext(ctx, &name, map[string]any{"id": 4})
			stmt.Close()
			note("prepared named", err, name)
		}
		_, err = db.PrepareNamedContext(ctx, "SELECT name FROM no_such_table WHERE id = :id")
		note("prepared named, broken", err, nil)
		return out
	}
	want := run(ref, "sqlx_ref")
	got := run(db, "sqlx_ryw")
	for i := range want {
		w := strings.ReplaceAll(want[i], "sqlx_ref", "T")
		if i >= len(got) || strings.ReplaceAll(got[i], "sqlx_ryw", "T") != w {
			t.Fatalf("step %d: pgx %q, pgryw %q", i, want[i], got[min(i, len(got)-1)])
		}
	}
	c, err := pgryw.ConnectorOf(db.DB)
	if err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.ReplicaReads == 0 {
		t.Fatalf("no read served by a replica: %+v", st)
	}
}
