package pgryw_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// idleFatal is the error PostgreSQL sends as idle_session_timeout ends a
// session, before it closes the socket.
var idleFatal = &pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P05",
	Message: "terminating connection due to idle-session timeout"}

// The server's idle timer fires just as a write goes out on a connection
// used a moment ago (so pgryw did not look at its socket first): its
// FATAL 57P05 is the first answer, nothing ran, and pgryw sends the write
// again on a new connection, once, with no error. When the same error
// comes after the write's answer began, the write may have run: the
// caller gets the server's error, and nothing is sent again.
func TestProtocolIdleEndedWriteSentAgain(t *testing.T) {
	pc := newProtoCluster(t, "15.4", "")
	w := pc.w
	ctx := context.Background()
	conn, err := pc.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, protoInsert, 1); err != nil {
		t.Fatal(err)
	}

	w.mu.Lock()
	w.idleBefore = true
	w.mu.Unlock()
	if _, err := conn.ExecContext(ctx, protoInsert, 2); err != nil {
		t.Fatalf("write as the server's idle timer fired: %v", err)
	}
	w.mu.Lock()
	inserts, ended := w.inserts, w.idleEnded
	w.mu.Unlock()
	if inserts != 2 || ended != 1 {
		t.Fatalf("%d INSERTs run, %d sessions ended; want 2 and 1", inserts, ended)
	}
	var on []int
	for _, f := range with(flushes(pc.writer, false), "Bind "+protoInsert) {
		on = append(on, f.conn.ID())
	}
	if len(on) != 3 || on[0] != on[1] || on[2] == on[1] {
		t.Fatalf("INSERT flushes on connections %v: want the first two on one, the third on a new one", on)
	}

	w.mu.Lock()
	w.idleAfter = true
	w.mu.Unlock()
	_, err = conn.ExecContext(ctx, protoInsert, 3)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57P05" {
		t.Fatalf("write ended after its answer began: %v, want the server's 57P05", err)
	}
	w.mu.Lock()
	inserts = w.inserts
	w.mu.Unlock()
	if inserts != 3 {
		t.Fatalf("%d INSERTs run, want 3: a write that may have run was sent again", inserts)
	}
}

// The same through pgx's front end, for a write sent with Query (an
// INSERT … RETURNING, as sqlc's :one does) on a held PoolConn whose primary
// connection sat idle: pgx's Query returns before the write's answer, so
// after such a pause pgryw reads the first answer before returning (as it
// does for reads), sees the FATAL 57P05 that came first, and sends the
// write again on a new connection.
func TestProtocolIdleEndedPgxQueryWriteSentAgain(t *testing.T) {
	pc := newProtoCluster(t, "15.4", "")
	w := pc.w
	ctx := context.Background()
	p := protoPool(t, pc, "")
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	if _, err := c.Exec(ctx, protoInsert, 1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond) // idle: longer than pgryw's look-ahead threshold
	w.mu.Lock()
	w.idleBefore = true
	w.mu.Unlock()
	rows, err := c.Query(ctx, protoInsert, 2)
	if err == nil {
		for rows.Next() {
		}
		err = rows.Err()
	}
	if err != nil {
		t.Fatalf("a write sent with Query as the server's idle timer fired: %v", err)
	}
	w.mu.Lock()
	inserts, ended := w.inserts, w.idleEnded
	w.mu.Unlock()
	if inserts != 2 || ended != 1 {
		t.Fatalf("%d INSERTs run, %d sessions ended; want 2 and 1", inserts, ended)
	}
}
