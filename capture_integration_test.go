package pgryw_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgryw/pgryw"
)

// capture=auto (the default) under 100 ms of lag: runs of writes during
// which nothing reads, so that each connection's writes after its first go
// without their captures, then, at once, a read of every row of the run.
// The runs: autocommits on the *sql.DB, autocommits on one *sql.Conn read
// back on that Conn, committed transactions, and writes made in a Session
// whose token another pool's Session observes before it reads. No read may
// miss its row, and the runs must have cost fewer captures than writes.
// The same workload with read_your_writes=off reads stale rows: the
// control that shows the lag bites.
func TestIntegrationWriteRunsThenRead(t *testing.T) {
	setDelay(t, 100*time.Millisecond)
	for _, mode := range []string{"wait_timeout=2s", "read_your_writes=off"} {
		t.Run(mode, func(t *testing.T) {
			db, c := openDB(t, mode)
			other, _ := openDB(t, mode+"&session_scope=conn")
			r := writeRuns{t: t, db: db, other: other, table: newTable(t)}
			for round := range 3 {
				r.round(round)
			}
			st := c.Stats()
			t.Logf("writes=%d reads=%d stale=%d stats=%+v", r.writes.Load(), r.reads.Load(), r.stale.Load(), st)
			if mode == "read_your_writes=off" {
				if r.stale.Load() == 0 {
					t.Fatal("read_your_writes=off observed no stale reads: the lag simulation is not working")
				}
				return
			}
			if n := r.stale.Load(); n > 0 {
				t.Fatalf("%d of %d reads after runs of writes were stale", n, r.reads.Load())
			}
			if st.ReplicaReads == 0 {
				t.Fatal("no read was served by a replica")
			}
			if w := r.writes.Load(); st.Captures*2 > w {
				t.Fatalf("%d captures for %d writes: runs of writes still capture each write", st.Captures, w)
			}
		})
	}
}

// writeRuns is TestIntegrationWriteRunsThenRead's workload.
type writeRuns struct {
	t                    *testing.T
	db, other            *sql.DB
	table                string
	writes, reads, stale atomic.Int64
}

const runLength = 5

// round runs every shape's writes at once, then, once they have all
// returned, every shape's reads at once.
func (r *writeRuns) round(round int) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := r.db.Conn(ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	defer conn.Close()
	s := pgryw.NewSession()
	sctx := pgryw.WithSession(ctx, s)
	base := int64(round * 100)
	insert := "INSERT INTO " + r.table + " VALUES ($1, 1)"
	shapes := []struct {
		write func(id int64) error
		read  func(id int64) error
	}{
		{ // autocommits on the pool, read on the pool
			func(id int64) error { _, err := r.db.ExecContext(ctx, insert, id); return err },
			func(id int64) error { return r.read(ctx, r.db, id) },
		},
		{ // autocommits on one connection, read on it
			func(id int64) error { _, err := conn.ExecContext(ctx, insert, id); return err },
			func(id int64) error { return r.read(ctx, conn, id) },
		},
		{ // committed transactions
			func(id int64) error {
				tx, err := r.db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, insert, id); err != nil {
					_ = tx.Rollback()
					return err
				}
				return tx.Commit()
			},
			func(id int64) error { return r.read(ctx, r.db, id) },
		},
		{ // a Session's writes, read through its token on another pool
			func(id int64) error { _, err := r.db.ExecContext(sctx, insert, id); return err },
			func(id int64) error {
				tok, err := s.TokenContext(ctx)
				if err != nil {
					return err
				}
				s2 := pgryw.NewSession()
				if err := s2.Observe(tok); err != nil {
					return err
				}
				return r.read(pgryw.WithSession(ctx, s2), r.other, id)
			},
		},
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*len(shapes))
	each := func(do func(i int) error) {
		for i := range shapes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := do(i); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
	}
	id := func(shape, k int) int64 { return base + int64(shape*10+k) }
	each(func(i int) error {
		for k := range runLength {
			if err := shapes[i].write(id(i, k)); err != nil {
				return fmt.Errorf("shape %d write %d: %w", i, k, err)
			}
			r.writes.Add(1)
		}
		return nil
	})
	each(func(i int) error {
		for k := runLength - 1; k >= 0; k-- {
			if err := shapes[i].read(id(i, k)); err != nil {
				return fmt.Errorf("shape %d read %d: %w", i, k, err)
			}
		}
		return nil
	})
	close(errs)
	for err := range errs {
		r.t.Fatal(err)
	}
}

// read reads row id, counting it stale when it is not there.
func (r *writeRuns) read(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, id int64) error {
	var v int
	err := q.QueryRowContext(ctx, "SELECT v FROM "+r.table+" WHERE id = $1", id).Scan(&v)
	r.reads.Add(1)
	if errors.Is(err, sql.ErrNoRows) {
		r.stale.Add(1)
		return nil
	}
	return err
}
