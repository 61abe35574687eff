package pgfake_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/pgryw/pgryw/internal/pgfake"
)

func start(t *testing.T, cfg pgfake.Config) *pgfake.Server {
	t.Helper()
	s, err := pgfake.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func connect(t *testing.T, s *pgfake.Server) *pgconn.PgConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	pc, err := pgconn.Connect(ctx, fmt.Sprintf("host=%s port=%d user=app dbname=app sslmode=disable", s.Host(), s.Port()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close(context.Background()) })
	return pc
}

// script answers "SELECT $1::text" by echoing its argument, "BEGIN" and
// "COMMIT" with their tags, and fails "SELECT 1/0".
func script(q pgfake.Query) pgfake.Result {
	switch q.SQL {
	case "SELECT $1::text":
		r := pgfake.Result{Params: []uint32{25}, Cols: []pgfake.Column{{Name: "text", OID: 25}}}
		if !q.Describe {
			r.Rows = [][][]byte{q.Params[0:1]}
		}
		return r
	case "BEGIN", "COMMIT":
		return pgfake.Result{Tag: q.SQL}
	case "SELECT 1/0":
		return pgfake.Result{Err: pgfake.Error("22012", "division by zero")}
	}
	return pgfake.Result{Err: pgfake.Error("42601", "unexpected "+q.SQL)}
}

func TestStartupAndAnswer(t *testing.T) {
	s := start(t, pgfake.Config{ServerVersion: "19devel", InHotStandby: "on", Handler: func(c *pgfake.Conn, b pgfake.Batch) []pgproto3.BackendMessage {
		return c.Answer(b, script)
	}})
	pc := connect(t, s)
	if v := pc.ParameterStatus("server_version"); v != "19devel" {
		t.Errorf("server_version %q", v)
	}
	if v := pc.ParameterStatus("in_hot_standby"); v != "on" {
		t.Errorf("in_hot_standby %q", v)
	}
	if pc.PID() == 0 {
		t.Error("no BackendKeyData")
	}
	ctx := context.Background()

	// Extended protocol: prepare, then execute.
	sd, err := pc.Prepare(ctx, "echo", "SELECT $1::text", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(sd.ParamOIDs, []uint32{25}) || len(sd.Fields) != 1 {
		t.Fatalf("description %+v", sd)
	}
	res := pc.ExecStatement(ctx, sd, [][]byte{[]byte("hi")}, nil, nil).Read()
	if res.Err != nil || len(res.Rows) != 1 || string(res.Rows[0][0]) != "hi" || res.CommandTag.String() != "SELECT 1" {
		t.Fatalf("result %+v", res)
	}

	// Simple protocol, with a transaction block.
	if _, err := pc.Exec(ctx, "BEGIN").ReadAll(); err != nil {
		t.Fatal(err)
	}
	if pc.TxStatus() != 'T' {
		t.Fatalf("status %c after BEGIN", pc.TxStatus())
	}
	_, err = pc.Exec(ctx, "SELECT 1/0").ReadAll()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "22012" || pc.TxStatus() != 'E' {
		t.Fatalf("err %v, status %c", err, pc.TxStatus())
	}
	if _, err := pc.Exec(ctx, "COMMIT").ReadAll(); err != nil || pc.TxStatus() != 'I' {
		t.Fatalf("COMMIT: %v, status %c", err, pc.TxStatus())
	}
	if err := pc.Ping(ctx); err != nil {
		t.Fatal(err)
	}

	conns := s.Conns()
	if len(conns) != 1 {
		t.Fatalf("%d connections", len(conns))
	}
	c := conns[0]
	if c.StartupParam("user") != "app" {
		t.Errorf("user %q", c.StartupParam("user"))
	}
	var got [][]string
	for _, b := range c.Batches() {
		got = append(got, pgfake.Summary(b, c.Label("")))
	}
	want := [][]string{
		{"Parse SELECT $1::text", "Describe S SELECT $1::text", "Sync"},
		{"Bind SELECT $1::text", "Execute", "Sync"},
		{"Query BEGIN"},
		{"Query SELECT 1/0"},
		{"Query COMMIT"},
		{"Query -- ping"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("batches\n got %q\nwant %q", got, want)
	}
	b := c.Batches()[1]
	var msgs []pgproto3.Message
	for _, m := range b.Msgs {
		msgs = append(msgs, m)
	}
	if !reflect.DeepEqual(b.Raw, pgfake.Encode(msgs...)) {
		t.Fatal("Raw does not match the decoded messages")
	}
}

// Everything pgx writes in one flush is one batch, and an error skips the
// rest up to Sync.
func TestBatchAndErrorSkip(t *testing.T) {
	s := start(t, pgfake.Config{Handler: func(c *pgfake.Conn, b pgfake.Batch) []pgproto3.BackendMessage {
		return c.Answer(b, script)
	}})
	pc := connect(t, s)
	ctx := context.Background()
	batch := &pgconn.Batch{}
	batch.ExecParams("SELECT 1/0", nil, nil, nil, nil)
	batch.ExecParams("SELECT $1::text", [][]byte{[]byte("skipped")}, nil, nil, nil)
	// pgconn's batch has one Sync at the end: the error skips the second
	// statement.
	_, err := pc.ExecBatch(ctx, batch).ReadAll()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "22012" {
		t.Fatalf("err %v", err)
	}
	c := s.Conns()[0]
	bs := c.Batches()
	if len(bs) != 1 {
		t.Fatalf("%d batches, want 1", len(bs))
	}
	if got := pgfake.Summary(bs[0], nil); len(got) != 9 || got[len(got)-1] != "Sync" {
		t.Fatalf("batch %q", got)
	}
	// The connection is still in step.
	res := pc.ExecParams(ctx, "SELECT $1::text", [][]byte{[]byte("ok")}, nil, nil, nil).Read()
	if res.Err != nil || string(res.Rows[0][0]) != "ok" {
		t.Fatalf("after the error: %+v", res)
	}
}

func TestHangupAndTerminate(t *testing.T) {
	s := start(t, pgfake.Config{Handler: func(c *pgfake.Conn, b pgfake.Batch) []pgproto3.BackendMessage {
		if q, ok := b.Msgs[0].(*pgproto3.Query); ok && q.String == "hang up" {
			c.Hangup()
			return nil
		}
		return c.Answer(b, script)
	}})
	pc := connect(t, s)
	_, err := pc.Exec(context.Background(), "hang up").ReadAll()
	if err == nil {
		t.Fatal("no error after the server hung up")
	}
	c := s.Conns()[0]
	select {
	case <-c.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("connection not ended")
	}
	if n := len(c.Batches()); n != 1 {
		t.Fatalf("%d batches", n)
	}

	pc2 := connect(t, s)
	if err := pc2.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	c2 := s.Conns()[1]
	select {
	case <-c2.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("connection not ended by Terminate")
	}
	if got := pgfake.Summary(c2.Batches()[0], nil); !reflect.DeepEqual(got, []string{"Terminate"}) {
		t.Fatalf("batch %q", got)
	}
}

// A statement the script does not know fails on the server side, and a
// Bind of a deallocated statement fails with 26000.
func TestUnscriptedAndDeallocated(t *testing.T) {
	s := start(t, pgfake.Config{})
	pc := connect(t, s)
	ctx := context.Background()
	_, err := pc.Exec(ctx, "SELECT 1").ReadAll()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "XX000" {
		t.Fatalf("err %v", err)
	}
	sd, err := pc.Prepare(ctx, "s1", "SELECT 1", nil)
	if err == nil {
		t.Fatalf("prepare of an unscripted statement succeeded: %+v", sd)
	}
	s.Conns()[0].Deallocate("s1")
	res := pc.ExecStatement(ctx, &pgconn.StatementDescription{Name: "s1", SQL: "SELECT 1"}, nil, nil, nil).Read()
	if !errors.As(res.Err, &pgErr) || pgErr.Code != "26000" {
		t.Fatalf("err %v", res.Err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if !s.Conns()[0].Closed() {
		t.Fatal("Close left a connection open")
	}
}
