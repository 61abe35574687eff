package pgryw_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/pgryw/pgryw/internal/pgfake"
)

// A writer connection that the server ended while it sat idle in the pool
// (the writer died, shut down or was failed over: its last words are a
// notice, or it just closes) is found before anything is sent on it:
// database/sql takes a new connection, and the write runs once, there, with
// no error. A notification on an idle connection is no such sign.
func TestProtocolDeadIdleWriterConnection(t *testing.T) {
	for _, tc := range []struct {
		name string
		last []pgproto3.BackendMessage // what the server sends before closing; nil: it stays
		dies bool
	}{
		{"closed", nil, true},
		{"immediate shutdown", []pgproto3.BackendMessage{&pgproto3.NoticeResponse{Severity: "WARNING", Code: "57P01",
			Message: "terminating connection due to immediate shutdown command"}}, true},
		{"fatal", []pgproto3.BackendMessage{pgfake.Error("57P01", "terminating connection due to administrator command")}, true},
		{"notification", []pgproto3.BackendMessage{&pgproto3.NotificationResponse{PID: 1, Channel: "c", Payload: "p"}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc := newProtoCluster(t, "15.4", "")
			// Twice: database/sql resets a connection it hands out again,
			// and pgx's reset pings the first time and after a second
			// idle, but not in between, which is when a busy pool reuses
			// its connections.
			for i := 0; i < 2; i++ {
				if _, err := pc.db.Exec(protoInsert, 1); err != nil {
					t.Fatal(err)
				}
			}
			first := pc.writer.Conns()[0]
			flushes := len(first.Batches())
			if tc.last != nil {
				if err := first.Send(tc.last...); err != nil {
					t.Fatal(err)
				}
			}
			if tc.dies {
				first.Hangup()
				<-first.Done()
			}
			time.Sleep(10 * time.Millisecond) // for the bytes to cross loopback
			if _, err := pc.db.Exec(protoInsert, 2); err != nil {
				t.Fatalf("write after the idle connection ended: %v", err)
			}
			if n := pc.w.insertCount(); n != 3 {
				t.Errorf("the writer received %d INSERTs, want 3", n)
			}
			conns := pc.writer.Conns()
			want := 1
			if tc.dies {
				want = 2
			}
			if len(conns) != want {
				t.Fatalf("%d writer connections, want %d", len(conns), want)
			}
			if tc.dies && len(first.Batches()) != flushes {
				t.Errorf("the ended connection received %d flushes after it ended", len(first.Batches())-flushes)
			}
		})
	}
}

// The same within a sql.Conn, where database/sql cannot take another
// connection for a statement that fails with driver.ErrBadConn: the ended
// writer connection is found before the first statement on it and
// replaced under the caller, who sees no error. A read routed to the
// replica first does not look at the writer connection (it sends nothing
// there); the write after it does.
func TestProtocolDeadIdleWriterConnectionInSQLConn(t *testing.T) {
	for _, readFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("read first %v", readFirst), func(t *testing.T) {
			pc := newProtoCluster(t, "15.4", "capture=always")
			pc.r.replays(protoLSN)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			for i := 0; i < 2; i++ {
				if _, err := pc.db.ExecContext(ctx, protoInsert, 1); err != nil {
					t.Fatal(err)
				}
			}
			first := pc.writer.Conns()[0]
			flushes := len(first.Batches())
			first.Hangup()
			<-first.Done()
			time.Sleep(10 * time.Millisecond) // for the close to cross loopback
			conn, err := pc.db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if readFirst {
				var v string
				if err := conn.QueryRowContext(ctx, protoRead, 7).Scan(&v); err != nil || v != "new" {
					t.Fatalf("replica read: %q, %v", v, err)
				}
				if len(pc.writer.Conns()) != 1 {
					t.Fatal("the replica read opened a writer connection")
				}
			}
			if _, err := conn.ExecContext(ctx, protoInsert, 2); err != nil {
				t.Fatalf("write in a sql.Conn after its idle writer connection ended: %v", err)
			}
			if n := pc.w.insertCount(); n != 3 {
				t.Errorf("the writer received %d INSERTs, want 3", n)
			}
			if n := len(pc.writer.Conns()); n != 2 {
				t.Errorf("%d writer connections, want 2", n)
			}
			if len(first.Batches()) != flushes {
				t.Errorf("the ended connection received %d flushes after it ended", len(first.Batches())-flushes)
			}
		})
	}
}

// A read on the writer whose connection breaks before any row arrives is
// sent again, on a new connection, within the caller's context: a read is
// safe to run twice. database/sql does the resending, told by
// driver.ErrBadConn.
func TestProtocolLostWriterReadRunsAgain(t *testing.T) {
	pc := newProtoCluster(t, "15.4", "")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := pc.db.PingContext(ctx); err != nil {
		t.Fatal(err)
	}
	pc.w.mu.Lock()
	pc.w.cutRead = true
	pc.w.mu.Unlock()
	var v string
	if err := pc.db.QueryRowContext(ctx, protoReadWriter, 7).Scan(&v); err != nil || v != "writer" {
		t.Fatalf("read whose writer connection broke: %q, %v", v, err)
	}
	pc.w.mu.Lock()
	reads := pc.w.reads
	pc.w.mu.Unlock()
	if len(reads) != 2 || reads[0] == reads[1] {
		t.Fatalf("the read arrived on writer connections %v, want twice, on two", reads)
	}
}

// insertCount is how many INSERTs the fake writer has run.
func (w *protoWriter) insertCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.inserts
}
