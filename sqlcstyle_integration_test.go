package pgryw_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
	"github.com/pgryw/pgryw/internal/sqlcstyle"
)

// sqlc's pgx/v5 output (internal/sqlcstyle, written in its shape) on
// pgryw's Pool, unchanged: each write of the application's, then its reads
// at once, under lag.

var (
	_ sqlcstyle.DBTX = (*pgryw.Pool)(nil)
	_ sqlcstyle.DBTX = (*pgryw.PoolConn)(nil)
	_ sqlcstyle.DBTX = (*pgryw.Tx)(nil)
)

// sqlcSetup makes sqlc_authors, empty, and waits for the replicas.
func sqlcSetup(t *testing.T) {
	t.Helper()
	pgtest.Require(t, cluster)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, cluster.WriterDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP TABLE IF EXISTS sqlc_authors; CREATE TABLE sqlc_authors (id bigint PRIMARY KEY, name text NOT NULL, bio text)"); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
}

// sqlcRun is the application: workers, each writing through the Pool, an
// acquired PoolConn or a transaction, and reading back at once.
type sqlcRun struct {
	reads, stale, replica atomic.Int64
	errs                  atomic.Int64
	firstErr              atomic.Value
}

func (r *sqlcRun) fail(what string, err error) {
	r.errs.Add(1)
	r.firstErr.CompareAndSwap(nil, fmt.Errorf("%s: %w", what, err))
}

func (r *sqlcRun) saw(ok bool) {
	r.reads.Add(1)
	if !ok {
		r.stale.Add(1)
	}
}

func runSqlcApp(t *testing.T, p *pgryw.Pool, workers, rounds int) *sqlcRun {
	t.Helper()
	r := &sqlcRun{}
	p.Connector().SetServedBy(func(_ context.Context, s pgryw.ServedBy) {
		if s.Role == pgryw.RoleReplica && !s.Begin {
			r.replica.Add(1)
		}
	})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			c, err := p.Acquire(ctx)
			if err != nil {
				r.fail("Acquire", err)
				return
			}
			defer c.Release()
			for i := range rounds {
				base := int64(w*1_000_000 + i*10)
				r.round(ctx, p, c, base)
			}
		}()
	}
	wg.Wait()
	p.Connector().SetServedBy(nil)
	return r
}

// round is one round of the application's: every shape of write sqlc has,
// each followed at once by a read that must see it.
func (r *sqlcRun) round(ctx context.Context, p *pgryw.Pool, c *pgryw.PoolConn, base int64) {
	q := sqlcstyle.New(p)
	qc := sqlcstyle.New(c)
	bio := pgtype.Text{String: "first", Valid: true}
	// :one INSERT … RETURNING on the pool, then :one on the pool.
	if _, err := q.CreateAuthor(ctx, sqlcstyle.CreateAuthorParams{ID: base, Name: "a", Bio: bio}); err != nil {
		r.fail("CreateAuthor", err)
		return
	}
	a, err := q.GetAuthor(ctx, base)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		r.saw(false)
	case err != nil:
		r.fail("GetAuthor", err)
	default:
		r.saw(a.Bio.String == "first")
	}
	// :exec on the connection, then :many on it.
	if err := qc.UpdateAuthorBio(ctx, sqlcstyle.UpdateAuthorBioParams{ID: base, Bio: pgtype.Text{String: "second", Valid: true}}); err != nil {
		r.fail("UpdateAuthorBio", err)
		return
	}
	list, err := qc.ListAuthors(ctx, base)
	if err != nil {
		r.fail("ListAuthors", err)
	} else {
		r.saw(len(list) > 0 && list[0].ID == base && list[0].Bio.String == "second")
	}
	// A transaction through WithTx, then a :batchone.
	tx, err := p.Begin(ctx)
	if err != nil {
		r.fail("Begin", err)
		return
	}
	qtx := q.WithTx(tx)
	if _, err := qtx.CreateAuthor(ctx, sqlcstyle.CreateAuthorParams{ID: base + 1, Name: "b"}); err != nil {
		tx.Rollback(ctx)
		r.fail("CreateAuthor in a transaction", err)
		return
	}
	if err := tx.Commit(ctx); err != nil {
		r.fail("Commit", err)
		return
	}
	found := 0
	q.GetAuthorsBatch(ctx, []int64{base, base + 1}).QueryRow(func(_ int, a sqlcstyle.Author, err error) {
		if err == nil {
			found++
		} else if !errors.Is(err, pgx.ErrNoRows) {
			r.fail("GetAuthorsBatch", err)
		}
	})
	r.saw(found == 2)
	// :copyfrom, then :one count on the connection (its own rows only).
	if _, err := qc.CreateAuthors(ctx, []sqlcstyle.CreateAuthorsParams{{ID: base + 2, Name: "c"}, {ID: base + 3, Name: "d"}}); err != nil {
		r.fail("CreateAuthors", err)
		return
	}
	list, err = qc.ListAuthors(ctx, base+2)
	if err != nil {
		r.fail("ListAuthors after CopyFrom", err)
	} else {
		r.saw(len(list) >= 2 && list[0].ID == base+2 && list[1].ID == base+3)
	}
	// :batchexec, then :one; :execrows, then :one.
	var berr error
	q.SetAuthorsBioBatch(ctx, []sqlcstyle.SetAuthorsBioBatchParams{{ID: base + 2, Bio: "batched"}}).Exec(func(_ int, err error) { berr = err })
	if berr != nil {
		r.fail("SetAuthorsBioBatch", berr)
		return
	}
	a, err = q.GetAuthor(ctx, base+2)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		r.fail("GetAuthor after a batch", err)
	} else {
		r.saw(err == nil && a.Bio.String == "batched")
	}
	if n, err := qc.DeleteAuthor(ctx, base+3); err != nil || n != 1 {
		r.fail("DeleteAuthor", fmt.Errorf("%d rows, %v", n, err))
		return
	}
	_, err = qc.GetAuthor(ctx, base+3)
	r.saw(errors.Is(err, pgx.ErrNoRows))
}

// TestIntegrationSqlcStyle: sqlc-style code on the Pool sees every write
// of its own at once, with its reads on replicas 100 ms behind.
func TestIntegrationSqlcStyle(t *testing.T) {
	sqlcSetup(t)
	setDelay(t, 100*time.Millisecond)
	p := openPool(t, "wait_timeout=1s&pool_max_conns=8")
	r := runSqlcApp(t, p, 2, 6)
	t.Logf("reads=%d stale=%d on replicas=%d errors=%d stats=%+v", r.reads.Load(), r.stale.Load(), r.replica.Load(), r.errs.Load(), p.Stats())
	if r.errs.Load() != 0 {
		t.Fatal(r.firstErr.Load())
	}
	if r.stale.Load() != 0 {
		t.Fatalf("%d stale reads", r.stale.Load())
	}
	if r.replica.Load() < r.reads.Load()*8/10 { // (a few may fall back on a loaded machine)
		t.Fatalf("%d of %d reads on replicas", r.replica.Load(), r.reads.Load())
	}
}

// The control: the same application without the wait sees its writes
// missing.
func TestIntegrationSqlcStyleOffIsStale(t *testing.T) {
	sqlcSetup(t)
	setDelay(t, 100*time.Millisecond)
	p := openPool(t, "read_your_writes=off&pool_max_conns=8")
	r := runSqlcApp(t, p, 2, 3)
	t.Logf("reads=%d stale=%d on replicas=%d errors=%d", r.reads.Load(), r.stale.Load(), r.replica.Load(), r.errs.Load())
	if r.errs.Load() != 0 {
		t.Fatal(r.firstErr.Load())
	}
	if r.stale.Load() == 0 {
		t.Fatal("read_your_writes=off observed no stale reads")
	}
}
