package pgryw_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// The server that ran is the one CI asked for: PGRYW_EXPECT_MAJOR (set by
// make test for each server version) must match the cluster's major
// version, so a missing build can never pass as another version's run.
// With PGRYW_EMULATE_PG19=1 the replicas must sit behind the WAIT FOR
// emulation and report PostgreSQL 19.
func TestIntegrationExpectedServer(t *testing.T) {
	pgtest.Require(t, cluster)
	want := os.Getenv("PGRYW_EXPECT_MAJOR")
	got := cluster.ServerVersionNum / 10000
	t.Logf("PostgreSQL server_version_num %d", cluster.ServerVersionNum)
	if want != "" && want != strconv.Itoa(got) {
		t.Fatalf("PGRYW_EXPECT_MAJOR=%s but the cluster runs PostgreSQL %d", want, got)
	}
	if os.Getenv(pgtest.EmulateEnv) != "1" {
		return
	}
	if len(cluster.WaitForFronts()) != len(cluster.Replicas) {
		t.Fatalf("%s=1 but the replicas are not behind the WAIT FOR emulation", pgtest.EmulateEnv)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, "postgres://postgres@"+cluster.ReplicaAddrs()[0]+"/postgres?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if v := conn.PgConn().ParameterStatus("server_version"); !strings.HasPrefix(v, "19.") {
		t.Fatalf("the emulation reports server_version %q", v)
	}
}

// emulatesOr19 reports whether the replicas take WAIT FOR: PostgreSQL 19,
// or the emulation.
func emulatesOr19() bool {
	return cluster.ServerVersionNum >= 190000 || cluster.WaitForFronts() != nil
}

// With wait_method=auto, a PostgreSQL 19 replica is made to wait with WAIT
// FOR LSN and older ones are polled; either way reads after writes are fresh
// while the replicas lag.
func TestIntegrationWaitMethodAuto(t *testing.T) {
	table := newTable(t)
	setDelay(t, 50*time.Millisecond)
	db, c := openDB(t, "session_scope=conn&wait_timeout=2s")
	insertThenCount(t, db, table, 10)
	s, waitFors := c.Stats(), pgryw.WaitForChecks(c)
	t.Logf("stats %+v, WAIT FOR checks %d", s, waitFors)
	if s.ReplicaReads == 0 {
		t.Fatal("no read was served by a replica")
	}
	if emulatesOr19() && waitFors == 0 {
		t.Fatal("PostgreSQL 19 replicas, wait_method=auto, and no WAIT FOR LSN was sent")
	}
	if !emulatesOr19() && waitFors != 0 {
		t.Fatalf("PostgreSQL %d replicas were sent %d WAIT FOR LSN", cluster.ServerVersionNum/10000, waitFors)
	}
}

// insertThenCount inserts n rows one at a time on one connection of db,
// counting the table after each: every count must see every insert.
func insertThenCount(t *testing.T, db *sql.DB, table string, n int) {
	t.Helper()
	ctx := context.Background()
	conn := oneConn(t, db)
	for i := 1; i <= n; i++ {
		if _, err := conn.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s VALUES (%d, 1)", table, i)); err != nil {
			t.Fatal(err)
		}
		if got := countRows(t, ctx, conn, table); got != i {
			t.Fatalf("read %d rows after %d inserts", got, i)
		}
	}
}

// oneConn takes one connection of db for the test, returned when it ends.
func oneConn(t *testing.T, db *sql.DB) *sql.Conn {
	t.Helper()
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
