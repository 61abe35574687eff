package pgryw_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/faultnet"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// A fault right after a write's ReadyForQuery: the write's answer came
// whole, the position pgryw reads behind it did not (the connection was cut
// there, or its bytes stalled). The write counts as done, as with pgx; the
// session's later reads, other connections' reads, a token taken then and
// the caller's deadlines are as if nothing had happened.

// primaryConnOf returns the faultnet connection under conn's primary.
func primaryConnOf(t *testing.T, nw *faultnet.Network, conn *sql.Conn) *faultnet.Conn {
	t.Helper()
	var fc *faultnet.Conn
	conn.Raw(func(dc any) error {
		if a := pgryw.PrimaryAddr(dc.(*pgryw.Conn)); a != nil {
			fc = nw.Lookup(a)
		}
		return nil
	})
	if fc == nil {
		t.Fatal("no primary connection under the sql.Conn")
	}
	return fc
}

// sqlConns takes n connections of db, closed with the test.
func sqlConns(t *testing.T, db *sql.DB, n int) []*sql.Conn {
	t.Helper()
	out := make([]*sql.Conn, n)
	for i := range out {
		c, err := db.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		out[i] = c
	}
	return out
}

func openFaultNet(t *testing.T, extra string) (*sql.DB, *pgryw.Connector, *faultnet.Network) {
	t.Helper()
	db, c := openDB(t, extra)
	nw := faultnet.New()
	pgryw.SetNetHook(c, nw.Wrap)
	return db, c, nw
}

func TestIntegrationFaultAfterWriteAnswer(t *testing.T) {
	pgtest.Require(t, cluster)
	setDelay(t, 300*time.Millisecond)
	table := newTable(t)
	for _, mode := range []string{"cache_statement", "simple_protocol"} {
		for _, kind := range []faultnet.Kind{faultnet.CutAfterReady, faultnet.StallAfterReady} {
			t.Run(mode+"/"+kind.String(), func(t *testing.T) {
				faultAfterWrite(t, table, mode, kind)
			})
		}
	}
}

var faultAfterWriteID int

func faultAfterWrite(t *testing.T, table, mode string, kind faultnet.Kind) {
	ctx := context.Background()
	db, c, nw := openFaultNet(t, "wait_timeout=2s&default_query_exec_mode="+mode)
	cs := sqlConns(t, db, 2)
	a, b := cs[0], cs[1]
	// Both connections have read once, and know their replicas.
	countRows(t, ctx, a, table)
	countRows(t, ctx, b, table)
	sess := pgryw.NewSession()
	sctx := pgryw.WithSession(ctx, sess)
	faultAfterWriteID++
	id := faultAfterWriteID
	primaryConnOf(t, nw, a).Arm(faultnet.Fault{Kind: kind, Delay: 3 * time.Second})
	start := time.Now()
	res, err := a.ExecContext(sctx, fmt.Sprintf("INSERT INTO %s VALUES (%d, 1)", table, id))
	if err != nil {
		t.Fatalf("the write, whose answer came whole: %v", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("rows affected %d", n)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("the write returned after %v", took)
	}
	if nw.Fired(kind) != 1 {
		t.Fatalf("the fault fired %d times", nw.Fired(kind))
	}
	seen := func(who string, q interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
	}, ctx context.Context, limit time.Duration) {
		t.Helper()
		dctx, cancel := context.WithTimeout(ctx, limit)
		defer cancel()
		start := time.Now()
		var n int
		err := q.QueryRowContext(dctx, fmt.Sprintf("SELECT count(*) FROM %s WHERE id = %d", table, id)).Scan(&n)
		took := time.Since(start)
		switch {
		case q == any(a) && kind == faultnet.CutAfterReady && errors.Is(err, driver.ErrBadConn):
			// Its connection is gone, as pgx's would be: database/sql
			// cannot give a sql.Conn another.
		case q == any(a) && kind == faultnet.StallAfterReady && errors.Is(err, context.DeadlineExceeded):
			// Everything after the stalled bytes on its connection comes
			// late, pgx's answers too.
		case err != nil || n != 1:
			t.Errorf("%s: %d rows, %v (after %v)", who, n, err, took)
		}
		if took > limit+100*time.Millisecond {
			t.Errorf("%s: returned after %v, deadline %v", who, took, limit)
		}
	}
	// A token taken now carries the write: another process (here a pool
	// that shares nothing with this one) reads it after observing it.
	tokStart := time.Now()
	tok := sess.Token()
	t.Logf("Token() took %v: %q; stats %+v", time.Since(tokStart), tok, c.Stats())
	other, _ := openDB(t, "session_scope=conn&wait_timeout=2s")
	s2 := pgryw.NewSession()
	if err := s2.Observe(tok); err != nil {
		t.Fatal(err)
	}
	seen("another process, with the token", other, pgryw.WithSession(ctx, s2), 2500*time.Millisecond)
	// Another connection of the pool (session_scope=db), at once.
	seen("another connection", b, ctx, 500*time.Millisecond)
	// The late position was covered by the position read for that read:
	// the next reads do not wait for it, or read one again.
	captures := c.Stats().Captures
	for i := 0; i < 3; i++ {
		seen("another connection, again", b, ctx, 500*time.Millisecond)
	}
	if n := c.Stats().Captures - captures; n != 0 {
		t.Errorf("%d more positions read for the same late write", n)
	}
	// The writing connection itself, within a deadline shorter than the stall.
	seen("the writing connection", a, ctx, 500*time.Millisecond)
	// The pool.
	seen("the pool", db, ctx, 500*time.Millisecond)
}

// TestIntegrationLateCaptureThenWriteAgain: a write's capture whose answer
// is stalled past othersWait is covered, for a read on another connection
// of the pool, by a fresh position; the answer is still due on the
// writer's connection. The writer's next write captures again, and its
// position, not the late answer of the first, moves the pool's watermark:
// a read on the other connection right after it sees the second row.
// pgryw counted the late capture settled when its wait's read deadline
// passed a moment before its context said so (wire.Await), armed the
// same slot for the next write's capture, and took the late answer for
// that capture's: the pool's watermark stayed before the second write
// (TestTransparencyPgx seed 3776731453152642 found it, about one run in
// two).
func TestIntegrationLateCaptureThenWriteAgain(t *testing.T) {
	pgtest.Require(t, cluster)
	setDelay(t, 300*time.Millisecond)
	table := newTable(t)
	ctx := context.Background()
	const stall = 250 * time.Millisecond
	for round := range 6 {
		db, _, nw := openFaultNet(t, "session_scope=db&wait_timeout=2s&capture=always")
		cs := sqlConns(t, db, 2)
		a, b := cs[0], cs[1]
		countRows(t, ctx, a, table)
		countRows(t, ctx, b, table)
		first, second := 2*round+1, 2*round+2
		primaryConnOf(t, nw, a).Arm(faultnet.Fault{Kind: faultnet.StallAfterReady, Delay: stall})
		start := time.Now()
		if _, err := a.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s VALUES (%d, 1)", table, first)); err != nil {
			t.Fatal(err)
		}
		count := func(id int) int {
			t.Helper()
			var n int
			if err := b.QueryRowContext(ctx, fmt.Sprintf("SELECT count(*) FROM %s WHERE id = %d", table, id)).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		if n := count(first); n != 1 {
			t.Fatalf("round %d: the read after the first write saw %d rows", round, n)
		}
		// The second write goes out as the stall ends: its answers
		// come after the late one.
		time.Sleep(time.Until(start.Add(stall - 20*time.Millisecond)))
		if _, err := a.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s VALUES (%d, 1)", table, second)); err != nil {
			t.Fatal(err)
		}
		if n := count(second); n != 1 {
			t.Fatalf("round %d: the read after the second write saw %d rows: the pool's watermark missed it", round, n)
		}
		db.Close()
	}
}
