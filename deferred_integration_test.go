package pgryw_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgryw/pgryw"
)

// TestIntegrationDeferredCaptureSeenElsewhere: a write returns before the
// position riding behind it has arrived (deferred.go). A read on another
// connection of the pool, a read with the same Session on another pool,
// and a token taken at once must all still cover it. Replicas apply WAL
// 300 ms late, so a read that did not wait for the write would miss it.
func TestIntegrationDeferredCaptureSeenElsewhere(t *testing.T) {
	setDelay(t, 300*time.Millisecond)
	table := newTable(t)
	ctx := context.Background()
	db, c := openDB(t, "")
	cs := sqlConns(t, db, 2)
	a, b := cs[0], cs[1]
	insert := fmt.Sprintf("INSERT INTO %s (id, v) VALUES ($1, 1)", table)
	for i := 1; i <= 10; i++ {
		if _, err := a.ExecContext(ctx, insert, i); err != nil {
			t.Fatal(err)
		}
		// The pool's watermark (session_scope=db), on another connection.
		if n := countRows(t, ctx, b, table); n != i {
			t.Fatalf("read on another connection right after write %d saw %d rows", i, n)
		}
	}
	// A Session, read on another pool right away, and its token.
	other, _ := openDB(t, "session_scope=conn")
	for i := 11; i <= 15; i++ {
		sess := pgryw.NewSession()
		if _, err := a.ExecContext(pgryw.WithSession(ctx, sess), insert, i); err != nil {
			t.Fatal(err)
		}
		fresh := pgryw.NewSession()
		if err := fresh.Observe(sess.Token()); err != nil {
			t.Fatal(err)
		}
		if n := countRows(t, pgryw.WithSession(ctx, fresh), other, table); n != i {
			t.Fatalf("read with the token of write %d saw %d rows", i, n)
		}
	}
	if st := c.Stats(); st.ReplicaReads == 0 || st.CaptureFailures != 0 {
		t.Fatalf("stats %+v", st)
	}
}
