package wire

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

func enc(t *testing.T, msgs ...pgproto3.BackendMessage) []byte {
	t.Helper()
	var b []byte
	for _, m := range msgs {
		var err error
		b, err = m.Encode(b)
		if err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func encF(t *testing.T, msgs ...pgproto3.FrontendMessage) []byte {
	t.Helper()
	var b []byte
	for _, m := range msgs {
		var err error
		b, err = m.Encode(b)
		if err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// chunked is a net.Conn whose reads return its data in random pieces,
// mostly small (1 to 7 bytes: a message's header split anywhere), one in
// three up to everything left (whole messages, which filter passes without
// looking at their bodies), and whose writes are recorded.
type chunked struct {
	net.Conn
	data    []byte
	rng     *rand.Rand
	written bytes.Buffer
}

func (c *chunked) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := 1 + c.rng.Intn(min(len(c.data), 7))
	if c.rng.Intn(3) == 0 {
		n = 1 + c.rng.Intn(len(c.data))
	}
	n = copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

func (c *chunked) Write(p []byte) (int, error) { return c.written.Write(p) }

func (c *chunked) SetReadDeadline(time.Time) error { return nil }

func TestAppendAfterExecStripsAnswer(t *testing.T) {
	pgxAnswer := enc(t,
		&pgproto3.BindComplete{},
		&pgproto3.CommandComplete{CommandTag: []byte("INSERT 0 1")},
		&pgproto3.ParameterStatus{Name: "in_hot_standby", Value: "off"},
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	)
	ours := enc(t,
		&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("lsn")}}},
		&pgproto3.NoticeResponse{Message: "hi"},
		&pgproto3.DataRow{Values: [][]byte{[]byte("0/3000100")}},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")},
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	)
	next := enc(t, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	notice := enc(t, &pgproto3.NoticeResponse{Message: "hi"})
	for seed := int64(0); seed < 200; seed++ {
		under := &chunked{data: append(append(append([]byte{}, pgxAnswer...), ours...), next...), rng: rand.New(rand.NewSource(seed))}
		c := Wrap(under)
		in := &Injection{SQL: "SELECT pg_current_wal_insert_lsn()"}
		c.AppendAfterExec(in)
		write := encF(t, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{})
		before := time.Now().UnixNano()
		if n, err := c.Write(write); err != nil || n != len(write) {
			t.Fatalf("write n=%d err=%v", n, err)
		}
		if !bytes.HasSuffix(under.written.Bytes(), []byte("SELECT pg_current_wal_insert_lsn()\x00")) || !in.Sent() {
			t.Fatalf("injection not appended: %q", under.written.Bytes())
		}
		if at := in.SentAt(); at < before || at > time.Now().UnixNano() {
			t.Fatalf("SentAt %d, not within the Write (from %d)", at, before)
		}
		got, _ := io.ReadAll(c)
		want := append(append(append([]byte{}, pgxAnswer...), notice...), next...)
		if !bytes.Equal(got, want) {
			t.Fatalf("seed %d: pgx saw\n%q\nwant\n%q", seed, got, want)
		}
		row, _ := in.Row()
		if !in.Done() || len(row) != 1 || row[0] != "0/3000100" {
			t.Fatalf("seed %d: injection %+v", seed, in)
		}
	}
}

// A fast-path FunctionCall rides behind pgx's write like a Sync-ended
// statement: its FunctionCallResponse is the row, and neither it nor its
// ReadyForQuery reaches pgx, however the bytes are chunked.
func TestAppendAfterExecFunctionCall(t *testing.T) {
	pgxAnswer := enc(t,
		&pgproto3.BindComplete{},
		&pgproto3.CommandComplete{CommandTag: []byte("INSERT 0 1")},
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	)
	ours := enc(t,
		&pgproto3.NoticeResponse{Message: "hi"},
		&pgproto3.FunctionCallResponse{Result: []byte("0/3000100")},
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	)
	next := enc(t, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	notice := enc(t, &pgproto3.NoticeResponse{Message: "hi"})
	call := encF(t, &pgproto3.FunctionCall{Function: 2852})
	for seed := int64(0); seed < 200; seed++ {
		under := &chunked{data: append(append(append([]byte{}, pgxAnswer...), ours...), next...), rng: rand.New(rand.NewSource(seed))}
		c := Wrap(under)
		in := &Injection{Msgs: call}
		if !in.FunctionCall() {
			t.Fatal("FunctionCall() false for a FunctionCall message")
		}
		c.AppendAfterExec(in)
		write := encF(t, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{})
		c.Write(write)
		if !bytes.Equal(under.written.Bytes(), append(append([]byte{}, write...), call...)) {
			t.Fatalf("wire carried %q", under.written.Bytes())
		}
		got, _ := io.ReadAll(c)
		want := append(append(append([]byte{}, pgxAnswer...), notice...), next...)
		if !bytes.Equal(got, want) {
			t.Fatalf("seed %d: pgx saw\n%q\nwant\n%q", seed, got, want)
		}
		row, null := in.Row()
		if !in.Done() || len(row) != 1 || row[0] != "0/3000100" || null[0] || in.Err() != nil {
			t.Fatalf("seed %d: injection %+v", seed, in)
		}
	}
	// A NULL result reads as NULL.
	under := &chunked{data: append(append([]byte{}, pgxAnswer...), enc(t, &pgproto3.FunctionCallResponse{}, &pgproto3.ReadyForQuery{TxStatus: 'I'})...), rng: rand.New(rand.NewSource(1))}
	c := Wrap(under)
	in := &Injection{Msgs: call}
	c.AppendAfterExec(in)
	c.Write(encF(t, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}))
	io.ReadAll(c)
	if row, null := in.Row(); !in.Done() || len(row) != 1 || !null[0] {
		t.Fatalf("NULL result: %q %v", row, null)
	}
}

func TestPrefixStripsErrorAndKeepsPgxAnswer(t *testing.T) {
	ours := enc(t,
		&pgproto3.ErrorResponse{Severity: "ERROR", Code: "42601", Message: "syntax error"},
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	)
	pgxAnswer := enc(t,
		&pgproto3.ParseComplete{},
		&pgproto3.BindComplete{},
		&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("v")}}},
		&pgproto3.DataRow{Values: [][]byte{[]byte("1"), nil}},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")},
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	)
	for seed := int64(0); seed < 200; seed++ {
		under := &chunked{data: append(append([]byte{}, ours...), pgxAnswer...), rng: rand.New(rand.NewSource(seed))}
		c := Wrap(under)
		in := &Injection{SQL: "WAIT FOR LSN '0/1'"}
		c.Prefix(in)
		c.Write(encF(t, &pgproto3.Parse{}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}))
		if !bytes.HasPrefix(under.written.Bytes(), []byte("Q")) {
			t.Fatal("injection not prefixed")
		}
		got, _ := io.ReadAll(c)
		if !bytes.Equal(got, pgxAnswer) {
			t.Fatalf("seed %d: pgx saw %q", seed, got)
		}
		if !in.Done() || in.Err() == nil {
			t.Fatalf("seed %d: injection %+v", seed, in)
		}
	}
}

func TestAwaitKeepsBytesForPgx(t *testing.T) {
	pgxAnswer := enc(t, &pgproto3.CommandComplete{CommandTag: []byte("INSERT 0 1")}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	ours := enc(t, &pgproto3.DataRow{Values: [][]byte{[]byte("0/1")}}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	async := enc(t, &pgproto3.NotificationResponse{Channel: "c", Payload: "p"})
	under := &chunked{data: append(append(append([]byte{}, pgxAnswer...), ours...), async...), rng: rand.New(rand.NewSource(1))}
	// A pipe-less stand-in: Await reads through Conn.Conn directly.
	c := Wrap(under)
	in := &Injection{SQL: "x"}
	c.AppendAfterExec(in)
	c.Write(encF(t, &pgproto3.Query{String: "INSERT"}))
	// pgx reads exactly its answer.
	buf := make([]byte, len(pgxAnswer))
	if _, err := io.ReadFull(c, buf); err != nil || !bytes.Equal(buf, pgxAnswer) {
		t.Fatalf("pgx read %q %v", buf, err)
	}
	if err := c.Await(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(c)
	if !bytes.Equal(rest, async) {
		t.Fatalf("pgx lost bytes: %q", rest)
	}
}

func TestNothingArmedIsTransparent(t *testing.T) {
	data := enc(t, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	under := &chunked{data: append([]byte{}, data...), rng: rand.New(rand.NewSource(1))}
	c := Wrap(under)
	w := encF(t, &pgproto3.Query{String: "SELECT 1"})
	c.Write(w)
	got, _ := io.ReadAll(c)
	if !bytes.Equal(got, data) || !bytes.Equal(under.written.Bytes(), w) {
		t.Fatal("changed bytes with nothing armed")
	}
}

// With nothing armed, every message reaches pgx as it came, and the
// notices and parameter statuses among them are counted, however the
// bytes are chunked.
func TestNothingArmedCountsNotices(t *testing.T) {
	data := enc(t,
		&pgproto3.ParameterStatus{Name: "in_hot_standby", Value: "off"},
		&pgproto3.NoticeResponse{Message: "one"},
		&pgproto3.BindComplete{},
		&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("v")}}},
		&pgproto3.DataRow{Values: [][]byte{bytes.Repeat([]byte("x"), 300)}},
		&pgproto3.NoticeResponse{Message: "two"},
		&pgproto3.DataRow{Values: [][]byte{nil}},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 2")},
		&pgproto3.NoticeResponse{Message: "three"},
		&pgproto3.ParameterStatus{Name: "application_name", Value: "x"},
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	)
	for seed := int64(0); seed < 200; seed++ {
		under := &chunked{data: append([]byte{}, data...), rng: rand.New(rand.NewSource(seed))}
		c := Wrap(under)
		got, _ := io.ReadAll(c)
		if !bytes.Equal(got, data) {
			t.Fatalf("seed %d: pgx saw\n%q\nwant\n%q", seed, got, data)
		}
		if n := c.Notices(); n != 3 {
			t.Fatalf("seed %d: %d notices counted, want 3", seed, n)
		}
		if n := c.Statuses(); n != 2 {
			t.Fatalf("seed %d: %d parameter statuses counted, want 2", seed, n)
		}
	}
}

// shortWriter accepts the first n bytes of a write and then fails.
type shortWriter struct {
	net.Conn
	n int
}

func (w *shortWriter) Write(p []byte) (int, error) {
	return min(w.n, len(p)), io.ErrClosedPipe
}

// A write cut part-way reports 0 only when none of the caller's bytes left:
// pgx treats 0 as safe to retry, and database/sql would run the statement
// again.
func TestPartialWriteCount(t *testing.T) {
	query := encF(t, &pgproto3.Query{String: "INSERT INTO t VALUES (1)"})
	pre := Injection{SQL: "SELECT 1"}
	preLen := len(appendQuery(nil, pre.SQL))
	post := Injection{SQL: "SELECT 2"}
	for n := 0; n <= preLen+len(query)+20; n++ {
		c := Wrap(&shortWriter{n: n})
		c.Prefix(&Injection{SQL: pre.SQL})
		c.AppendAfterExec(&Injection{SQL: post.SQL})
		got, err := c.Write(query)
		if err == nil {
			t.Fatal("want the write's error")
		}
		var want int
		switch {
		case n <= preLen:
			want = 0
		case n >= preLen+len(query):
			want = len(query)
		default:
			want = n - preLen
		}
		if got != want {
			t.Fatalf("%d bytes written: reported %d, want %d", n, got, want)
		}
	}
}

// pgx's background reader (started while a write is slow) may be blocked
// in Read when pgryw's answer arrives: it reads and strips the answer, and
// must then return rather than block again, so that Await, waiting beside
// it, sees the answer and returns (it used to wait for the deadline).
func TestAwaitBesideBackgroundReader(t *testing.T) {
	pgxAnswer := enc(t,
		&pgproto3.CommandComplete{CommandTag: []byte("INSERT 0 1")},
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	)
	ours := enc(t,
		&pgproto3.DataRow{Values: [][]byte{[]byte("0/3000100")}},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")},
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	)
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	c := Wrap(client)
	in := &Injection{SQL: "SELECT pg_current_wal_insert_lsn()"}
	c.AppendAfterExec(in)
	go func() {
		// The server reads the statement and ours, then answers in two
		// flushes.
		buf := make([]byte, 4096)
		server.Read(buf)
		server.Write(pgxAnswer)
		time.Sleep(50 * time.Millisecond)
		server.Write(ours)
	}()
	if _, err := c.Write(encF(t, &pgproto3.Query{String: "INSERT INTO t VALUES (1)"})); err != nil {
		t.Fatal(err)
	}
	// The background reader: it reads pgx's answer, then reads again.
	bg := make(chan error, 1)
	go func() {
		p := make([]byte, 4096)
		n, err := c.Read(p)
		if err != nil || !bytes.Equal(p[:n], pgxAnswer) {
			bg <- fmt.Errorf("first read: %q, %v", p[:n], err)
			return
		}
		n, err = c.Read(p)
		if n != 0 || err != nil {
			bg <- fmt.Errorf("second read: %q, %v", p[:n], err)
			return
		}
		bg <- nil
	}()
	time.Sleep(20 * time.Millisecond) // the second read is on the socket
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	if err := c.Await(ctx, in); err != nil {
		t.Fatalf("Await: %v after %v", err, time.Since(start))
	}
	if row, _ := in.Row(); !in.Done() || len(row) != 1 || row[0] != "0/3000100" {
		t.Fatalf("injection %+v", in)
	}
	if err := <-bg; err != nil {
		t.Fatal(err)
	}
}

// TestSeveralInjectionsEachSide: two prefixes go out in the order armed,
// ahead of pgx's write, and two suffixes behind it; each gets its own
// answer (one failing), and pgx sees only its own.
func TestSeveralInjectionsEachSide(t *testing.T) {
	row := func(v string) []byte {
		return enc(t,
			&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("x")}}},
			&pgproto3.DataRow{Values: [][]byte{[]byte(v)}},
			&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")},
			&pgproto3.ReadyForQuery{TxStatus: 'I'},
		)
	}
	failed := enc(t,
		&pgproto3.ErrorResponse{Severity: "ERROR", Code: "22023", Message: "invalid value"},
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	)
	pgxAnswer := enc(t,
		&pgproto3.BindComplete{},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 0")},
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	)
	var data []byte
	for _, part := range [][]byte{row("p1"), failed, pgxAnswer, row("s1"), row("s2")} {
		data = append(data, part...)
	}
	for seed := int64(0); seed < 200; seed++ {
		under := &chunked{data: append([]byte{}, data...), rng: rand.New(rand.NewSource(seed))}
		c := Wrap(under)
		p1, p2 := &Injection{SQL: "SELECT 'p1'"}, &Injection{SQL: "SELECT 'p2'"}
		s1, s2 := &Injection{SQL: "SELECT 's1'"}, &Injection{SQL: "SELECT 's2'"}
		c.Prefix(p1)
		c.Prefix(p2)
		c.AppendAfterExec(s1)
		c.AppendAfterExec(s2)
		write := encF(t, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{})
		if n, err := c.Write(write); err != nil || n != len(write) {
			t.Fatalf("write n=%d err=%v", n, err)
		}
		w := under.written.String()
		if i1, i2, iw, j1, j2 := strings.Index(w, "'p1'"), strings.Index(w, "'p2'"), strings.Index(w, "B\x00"), strings.Index(w, "'s1'"), strings.Index(w, "'s2'"); !(i1 < i2 && i2 < iw && iw < j1 && j1 < j2) {
			t.Fatalf("order on the wire: %q", w)
		}
		got, _ := io.ReadAll(c)
		if !bytes.Equal(got, pgxAnswer) {
			t.Fatalf("seed %d: pgx saw %q", seed, got)
		}
		for _, x := range []struct {
			in   *Injection
			want string
		}{{p1, "p1"}, {s1, "s1"}, {s2, "s2"}} {
			r, _ := x.in.Row()
			if !x.in.Done() || len(r) != 1 || r[0] != x.want {
				t.Fatalf("seed %d: %s: %+v", seed, x.want, x.in)
			}
		}
		if !p2.Done() || p2.Err() == nil {
			t.Fatalf("seed %d: p2 %+v", seed, p2)
		}
	}
}

// TestReadWaitsForAwait: another goroutine awaits a ride-along answer while
// pgx starts its next statement and reads: pgx's Read waits for the
// Await, then gets every byte meant for it, in order; a Read whose deadline
// passes while it waits fails as a timeout.
func TestReadWaitsForAwait(t *testing.T) {
	ours := enc(t,
		&pgproto3.DataRow{Values: [][]byte{[]byte("0/3000100")}},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")},
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	)
	first := enc(t, &pgproto3.CommandComplete{CommandTag: []byte("INSERT 0 1")}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	next := enc(t, &pgproto3.CommandComplete{CommandTag: []byte("INSERT 0 1")}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	c := Wrap(client)
	in := &Injection{SQL: "SELECT pg_current_wal_insert_lsn()"}
	c.AppendAfterExec(in)
	go func() {
		buf := make([]byte, 4096)
		server.Read(buf)
		server.Write(first)
		server.Read(buf) // the next statement
		time.Sleep(30 * time.Millisecond)
		server.Write(append(append([]byte{}, ours...), next...))
	}()
	if _, err := c.Write(encF(t, &pgproto3.Query{String: "INSERT 1"})); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 4096)
	n, err := c.Read(p)
	if err != nil || !bytes.Equal(p[:n], first) {
		t.Fatalf("first answer %q %v", p[:n], err)
	}
	// Our answer has not come. Another goroutine awaits it...
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		done <- c.Await(ctx, in)
	}()
	time.Sleep(10 * time.Millisecond)
	// ...while pgx sends its next statement and reads its answer.
	if _, err := c.Write(encF(t, &pgproto3.Query{String: "INSERT 2"})); err != nil {
		t.Fatal(err)
	}
	var got []byte
	for len(got) < len(next) {
		n, err := c.Read(p)
		if err != nil {
			t.Fatalf("pgx read: %v", err)
		}
		got = append(got, p[:n]...)
	}
	if !bytes.Equal(got, next) {
		t.Fatalf("pgx saw %q, want %q", got, next)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if row, _ := in.Row(); !in.Done() || len(row) != 1 || row[0] != "0/3000100" {
		t.Fatalf("injection %+v", in)
	}

	// A Read waiting for an Await honours pgx's deadline.
	in2 := &Injection{SQL: "SELECT 1"}
	c.AppendAfterExec(in2)
	go func() {
		buf := make([]byte, 4096)
		server.Read(buf)
		// never answers
	}()
	c.Write(encF(t, &pgproto3.Query{String: "INSERT 3"}))
	actx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	go c.Await(actx, in2)
	time.Sleep(10 * time.Millisecond)
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := c.Read(p); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past its deadline: %v", err)
	}
}

// A chained prefix goes out as an unnamed Parse/Bind/Execute with no Sync
// in front of pgx's extended-protocol messages, and its answer (up to its
// CommandComplete) is taken off; when it fails, pgx is given its error,
// since the server then answers pgx's messages with a bare ReadyForQuery.
// In front of a simple Query it goes as a Query of its own.
func TestChainedPrefix(t *testing.T) {
	pgxAnswer := enc(t,
		&pgproto3.BindComplete{},
		&pgproto3.DataRow{Values: [][]byte{[]byte("new")}},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")},
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	)
	ok := enc(t,
		&pgproto3.ParseComplete{},
		&pgproto3.BindComplete{},
		&pgproto3.NoticeResponse{Message: "hi"},
		&pgproto3.DataRow{Values: [][]byte{[]byte("success")}},
		&pgproto3.CommandComplete{CommandTag: []byte("WAIT")},
	)
	failed := enc(t,
		&pgproto3.ParseComplete{},
		&pgproto3.BindComplete{},
		&pgproto3.ErrorResponse{Severity: "ERROR", Code: "57014", Message: "canceling statement due to user request"},
	)
	bare := enc(t, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	pgxMsgs := encF(t, &pgproto3.Bind{PreparedStatement: "s"}, &pgproto3.Execute{}, &pgproto3.Sync{})
	wantWire := append(encF(t, &pgproto3.Parse{Query: "WAIT FOR LSN '0/1'"}, &pgproto3.Bind{}, &pgproto3.Execute{}), pgxMsgs...)
	for seed := int64(0); seed < 200; seed++ {
		for _, tc := range []struct {
			name     string
			answer   []byte
			pgxSees  []byte
			wantRow  string
			wantCode string
		}{
			{"success", append(append([]byte{}, ok...), pgxAnswer...), append(enc(t, &pgproto3.NoticeResponse{Message: "hi"}), pgxAnswer...), "success", ""},
			{"error", append(append([]byte{}, failed...), bare...), append(enc(t, &pgproto3.ErrorResponse{Severity: "ERROR", Code: "57014", Message: "canceling statement due to user request"}), bare...), "", "57014"},
		} {
			under := &chunked{data: tc.answer, rng: rand.New(rand.NewSource(seed))}
			c := Wrap(under)
			in := &Injection{SQL: "WAIT FOR LSN '0/1'", Chain: true}
			c.Prefix(in)
			c.Write(pgxMsgs)
			if !bytes.Equal(under.written.Bytes(), wantWire) {
				t.Fatalf("%s: wire\n% x\nwant\n% x", tc.name, under.written.Bytes(), wantWire)
			}
			got, _ := io.ReadAll(c)
			if !bytes.Equal(got, tc.pgxSees) {
				t.Fatalf("seed %d %s: pgx saw %q, want %q", seed, tc.name, got, tc.pgxSees)
			}
			if !in.Done() || !in.chained {
				t.Fatalf("seed %d %s: injection not done/chained", seed, tc.name)
			}
			row, _ := in.Row()
			if tc.wantRow != "" && (len(row) != 1 || row[0] != tc.wantRow) {
				t.Fatalf("seed %d %s: row %q", seed, tc.name, row)
			}
			var code string
			if err := in.Err(); err != nil {
				code = err.(interface{ SQLState() string }).SQLState()
			}
			if code != tc.wantCode {
				t.Fatalf("seed %d %s: error code %q, want %q", seed, tc.name, code, tc.wantCode)
			}
		}
	}
	// In front of a simple Query: a Query of its own.
	under := &chunked{rng: rand.New(rand.NewSource(1))}
	c := Wrap(under)
	in := &Injection{SQL: "WAIT FOR LSN '0/1'", Chain: true}
	c.Prefix(in)
	c.Write(encF(t, &pgproto3.Query{String: "begin"}))
	if !bytes.HasPrefix(under.written.Bytes(), []byte("Q")) || in.chained {
		t.Fatal("chained in front of a simple Query")
	}
}

// Prebuilt messages chained: a Bind and Execute of a statement prepared
// earlier go in front of pgx's extended-protocol messages without their
// Sync, and the answer (to its CommandComplete) is taken off; in front of
// a simple Query, or when the messages are a FunctionCall, they go whole.
func TestChainedPrebuiltMessages(t *testing.T) {
	msgs := encF(t, &pgproto3.Bind{PreparedStatement: "pgryw_check"}, &pgproto3.Execute{}, &pgproto3.Sync{})
	pgxMsgs := encF(t, &pgproto3.Bind{PreparedStatement: "s"}, &pgproto3.Execute{}, &pgproto3.Sync{})
	answer := enc(t,
		&pgproto3.BindComplete{},
		&pgproto3.DataRow{Values: [][]byte{[]byte("0/3000100"), []byte("t"), []byte("read committed")}},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")},
	)
	pgxAnswer := enc(t,
		&pgproto3.BindComplete{},
		&pgproto3.DataRow{Values: [][]byte{[]byte("new")}},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")},
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	)
	for seed := int64(0); seed < 100; seed++ {
		under := &chunked{data: append(append([]byte{}, answer...), pgxAnswer...), rng: rand.New(rand.NewSource(seed))}
		c := Wrap(under)
		in := &Injection{Chain: true}
		in.ResetMessages(msgs)
		in.Chain = true
		c.Prefix(in)
		c.Write(pgxMsgs)
		if want := append(append([]byte{}, msgs[:len(msgs)-5]...), pgxMsgs...); !bytes.Equal(under.written.Bytes(), want) {
			t.Fatalf("wire\n% x\nwant\n% x", under.written.Bytes(), want)
		}
		got, _ := io.ReadAll(c)
		if !bytes.Equal(got, pgxAnswer) {
			t.Fatalf("seed %d: pgx saw %q", seed, got)
		}
		if row, _ := in.Row(); !in.Done() || !in.SharesTx() || len(row) != 3 || row[2] != "read committed" {
			t.Fatalf("seed %d: done %v, chained %v, row %q", seed, in.Done(), in.SharesTx(), row)
		}
	}
	for _, tc := range []struct {
		name string
		in   []byte
		pgx  []byte
	}{
		{"in front of a simple Query", msgs, encF(t, &pgproto3.Query{String: "SELECT 1"})},
		{"a FunctionCall", encF(t, &pgproto3.FunctionCall{Function: 2852}), pgxMsgs},
	} {
		under := &chunked{rng: rand.New(rand.NewSource(1))}
		c := Wrap(under)
		in := &Injection{}
		in.ResetMessages(tc.in)
		in.Chain = true
		c.Prefix(in)
		c.Write(tc.pgx)
		if !bytes.HasPrefix(under.written.Bytes(), tc.in) || in.SharesTx() {
			t.Fatalf("%s: chained %v, wire\n% x", tc.name, in.SharesTx(), under.written.Bytes())
		}
	}
}

// LastWords looks past the answer to a ride-along that nobody has read yet
// (a capture behind a write that returned at its own ReadyForQuery) to
// what the server sent after it: an ended session's FATAL is found there.
func TestLastWordsSkipsUnreadAnswer(t *testing.T) {
	answer := enc(t,
		&pgproto3.FunctionCallResponse{Result: []byte("0/3000100")},
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	)
	fatal := enc(t, &pgproto3.ErrorResponse{Severity: "FATAL", Code: "57P01", Message: "terminating connection"})
	under := &chunked{rng: rand.New(rand.NewSource(1))}
	c := Wrap(under)
	in := &Injection{Msgs: encF(t, &pgproto3.FunctionCall{Function: 2852})}
	c.AppendAfterExec(in)
	c.Write(encF(t, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}))
	// pgx has read its own answer (the segment for its Sync is gone); the
	// capture's is still on the socket.
	c.mu.Lock()
	c.popQueue()
	c.mu.Unlock()
	for _, tc := range []struct {
		name string
		p    []byte
		t    byte
		ok   bool
	}{
		{"answer, then FATAL", append(append([]byte{}, answer...), fatal...), 'E', true},
		{"answer alone", answer, 0, false},
		{"answer cut short", answer[:len(answer)-2], 0, false},
		{"answer, then part of a header", append(append([]byte{}, answer...), 'E', 0), 'E', true},
		{"nothing", nil, 0, false},
	} {
		if got, ok := c.LastWords(tc.p); got != tc.t || ok != tc.ok {
			t.Errorf("%s: LastWords = %q, %v; want %q, %v", tc.name, got, ok, tc.t, tc.ok)
		}
	}
	// With nothing expected, the first byte is the message.
	idle := Wrap(&chunked{rng: rand.New(rand.NewSource(1))})
	if got, ok := idle.LastWords(fatal); got != 'E' || !ok {
		t.Errorf("idle connection: LastWords = %q, %v; want 'E', true", got, ok)
	}
}

// MustChain: an injection goes out only chained in front of a write that
// executes in the extended protocol. A write that only prepares passes it
// on to the next; a simple Query refuses it. Behind a transaction pooler
// (Peer.TxPooled) nothing else of pgryw's goes out: no prefix of its own,
// no suffix.
func TestMustChain(t *testing.T) {
	prepare := encF(t, &pgproto3.Parse{Name: "s", Query: "SELECT 1"}, &pgproto3.Describe{ObjectType: 'S', Name: "s"}, &pgproto3.Sync{})
	execute := encF(t, &pgproto3.Bind{PreparedStatement: "s"}, &pgproto3.Execute{}, &pgproto3.Sync{})
	chained := encF(t, &pgproto3.Parse{Query: "SELECT 2"}, &pgproto3.Bind{}, &pgproto3.Execute{})

	under := &chunked{rng: rand.New(rand.NewSource(1))}
	c := Wrap(under)
	in := &Injection{SQL: "SELECT 2", Chain: true, MustChain: true}
	c.Prefix(in)
	c.Write(prepare)
	if in.Sent() || !bytes.Equal(under.written.Bytes(), prepare) {
		t.Fatalf("sent in front of a write that only prepares:\n% x", under.written.Bytes())
	}
	under.written.Reset()
	c.Write(execute)
	if !in.Sent() || !in.chained || !bytes.Equal(under.written.Bytes(), append(append([]byte{}, chained...), execute...)) {
		t.Fatalf("not chained in front of the execution:\n% x", under.written.Bytes())
	}

	under = &chunked{rng: rand.New(rand.NewSource(1))}
	c = Wrap(under)
	in = &Injection{SQL: "SELECT 2", Chain: true, MustChain: true}
	c.Prefix(in)
	q := encF(t, &pgproto3.Query{String: "SELECT 3"})
	c.Write(q)
	if in.Sent() || !in.Refused() || !bytes.Equal(under.written.Bytes(), q) {
		t.Fatalf("in front of a simple Query: sent %v, refused %v", in.Sent(), in.Refused())
	}

	// pgx's describe_exec: it parses the unnamed statement in one flush
	// and binds it in the next. Chained in front of that Bind, the
	// injection's own unnamed Parse would take pgx's statement's place:
	// refused.
	under = &chunked{rng: rand.New(rand.NewSource(1))}
	c = Wrap(under)
	in = &Injection{SQL: "SELECT 2", Chain: true, MustChain: true}
	c.Prefix(in)
	c.Write(encF(t, &pgproto3.Parse{Query: "SELECT $1::int"}, &pgproto3.Describe{ObjectType: 'S'}, &pgproto3.Sync{}))
	under.written.Reset()
	bindUnnamed := encF(t, &pgproto3.Bind{Parameters: [][]byte{[]byte("1")}}, &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, &pgproto3.Sync{})
	c.Write(bindUnnamed)
	if in.Sent() || !in.Refused() || !bytes.Equal(under.written.Bytes(), bindUnnamed) {
		t.Fatalf("in front of a Bind of pgx's unnamed statement: sent %v, refused %v:\n% x", in.Sent(), in.Refused(), under.written.Bytes())
	}
	// A Bind of a named statement takes it.
	under = &chunked{rng: rand.New(rand.NewSource(1))}
	c = Wrap(under)
	in = &Injection{SQL: "SELECT 2", Chain: true, MustChain: true}
	c.Prefix(in)
	c.Write(execute)
	if !in.Sent() || !in.SharesTx() {
		t.Fatalf("in front of a Bind of a named statement: sent %v, shares the transaction %v", in.Sent(), in.SharesTx())
	}

	under = &chunked{rng: rand.New(rand.NewSource(1))}
	c = Wrap(under)
	c.Peer.TxPooled = true
	pre := &Injection{SQL: "SELECT 4"}
	post := &Injection{SQL: "SELECT 5"}
	c.Prefix(pre)
	c.AppendAfterExec(post)
	c.Write(execute)
	if pre.Sent() || post.Sent() || !pre.Refused() || !post.Refused() || !bytes.Equal(under.written.Bytes(), execute) {
		t.Fatalf("behind a transaction pooler: prefix sent %v, suffix sent %v:\n% x", pre.Sent(), post.Sent(), under.written.Bytes())
	}
	if c.Due() {
		t.Fatal("an answer is due for injections never sent")
	}
}

// An injection armed behind pgx's next execution, when pgx's write only
// prepares and pgryw then disarms, never went out: Dropped says so (its
// Parse, if it carried one, created nothing).
func TestDisarmedIsDropped(t *testing.T) {
	under := &chunked{rng: rand.New(rand.NewSource(1))}
	c := Wrap(under)
	after, before := &Injection{SQL: "SELECT 1"}, &Injection{SQL: "SELECT 2"}
	c.AppendAfterExec(after)
	write := encF(t, &pgproto3.Parse{Query: "SELECT 1; SELECT 2"}, &pgproto3.Describe{ObjectType: 'S'}, &pgproto3.Sync{})
	if _, err := c.Write(write); err != nil {
		t.Fatal(err)
	}
	if after.Sent() || after.Dropped() || !bytes.Equal(under.written.Bytes(), write) {
		t.Fatalf("sent %v, dropped %v behind a write that executes nothing", after.Sent(), after.Dropped())
	}
	c.Prefix(before)
	c.Disarm()
	if after.Sent() || !after.Dropped() || before.Sent() || !before.Dropped() {
		t.Fatalf("after Disarm: suffix sent %v dropped %v, prefix sent %v dropped %v", after.Sent(), after.Dropped(), before.Sent(), before.Dropped())
	}
	sent := &Injection{SQL: "SELECT 3"}
	c.AppendAfterExec(sent)
	if _, err := c.Write(encF(t, &pgproto3.Query{String: "SELECT 4"})); err != nil {
		t.Fatal(err)
	}
	c.Disarm()
	if !sent.Sent() || sent.Dropped() {
		t.Fatalf("sent %v, dropped %v", sent.Sent(), sent.Dropped())
	}
}

// Peek reads pgx's answers ahead to the ReadyForQuery of the last Sync pgx
// sent since Watch, keeps every byte of them for pgx, and reports the
// first error among them, with a check of pgryw's in front stripped as
// usual, however the bytes are chunked.
func TestWatchPeek(t *testing.T) {
	for seed := int64(1); seed <= 50; seed++ {
		ours := enc(t, &pgproto3.DataRow{Values: [][]byte{[]byte("0/1")}}, &pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
		prepare := enc(t, &pgproto3.ParseComplete{}, &pgproto3.ParameterDescription{}, &pgproto3.NoData{}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
		execute := enc(t,
			&pgproto3.BindComplete{}, &pgproto3.DataRow{Values: [][]byte{[]byte("1")}}, &pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")},
			&pgproto3.BindComplete{}, &pgproto3.ErrorResponse{Severity: "ERROR", Code: "0A000", Message: "cannot access temporary or unlogged relations during recovery"},
			&pgproto3.ReadyForQuery{TxStatus: 'I'})
		after := enc(t, &pgproto3.NotificationResponse{Channel: "c", Payload: "p"})
		data := append(append(append(append([]byte{}, ours...), prepare...), execute...), after...)
		under := &chunked{data: data, rng: rand.New(rand.NewSource(seed))}
		c := Wrap(under)
		c.Watch()
		check := &Injection{SQL: "check"}
		c.Prefix(check)
		c.Write(encF(t, &pgproto3.Parse{Query: "SELECT 1"}, &pgproto3.Describe{ObjectType: 'S'}, &pgproto3.Sync{}))
		// pgx reads the prepare phase's answer itself.
		buf := make([]byte, len(prepare))
		if _, err := io.ReadFull(c, buf); err != nil || !bytes.Equal(buf, prepare) {
			t.Fatalf("seed %d: pgx read %q %v", seed, buf, err)
		}
		c.Write(encF(t, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}))
		first, complete, err := c.Peek(t.Context(), 1<<20)
		c.Unwatch()
		if err != nil || !complete || first == nil || first.Code != "0A000" || !strings.Contains(first.Message, "during recovery") {
			t.Fatalf("seed %d: Peek = %v, %v, %v", seed, first, complete, err)
		}
		if !check.Done() {
			t.Fatalf("seed %d: the check's answer was not taken", seed)
		}
		rest := make([]byte, len(execute)+len(after))
		if _, err := io.ReadFull(c, rest); err != nil || !bytes.Equal(rest, append(append([]byte{}, execute...), after...)) {
			t.Fatalf("seed %d: pgx read %q %v", seed, rest, err)
		}
	}
}

// Peek stops at its limit, incomplete, and pgx still reads everything.
func TestPeekLimit(t *testing.T) {
	execute := enc(t, &pgproto3.BindComplete{}, &pgproto3.DataRow{Values: [][]byte{bytes.Repeat([]byte("x"), 300)}},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	under := &chunked{data: append([]byte{}, execute...), rng: rand.New(rand.NewSource(7))}
	c := Wrap(under)
	c.Watch()
	c.Write(encF(t, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}))
	first, complete, err := c.Peek(t.Context(), 100)
	c.Unwatch()
	if err != nil || complete || first != nil {
		t.Fatalf("Peek = %v, %v, %v", first, complete, err)
	}
	got, _ := io.ReadAll(c)
	if !bytes.Equal(got, execute) {
		t.Fatalf("pgx read %q", got)
	}
}

// deadlineConn is a net.Conn whose Read ends the context it is given
// (cancel) and then returns its data, and which records the last read
// deadline set on it.
type deadlineConn struct {
	net.Conn
	mu     sync.Mutex
	last   time.Time
	data   []byte
	cancel func()
}

func (d *deadlineConn) Read(p []byte) (int, error) {
	d.cancel()
	runtime.Gosched()
	return copy(p, d.data), nil
}

func (d *deadlineConn) Write(p []byte) (int, error) { return len(p), nil }

func (d *deadlineConn) SetReadDeadline(t time.Time) error {
	d.mu.Lock()
	d.last = t
	d.mu.Unlock()
	return nil
}

// An Await whose context ends as its read returns leaves pgx's read
// deadline on the socket, not the past one that interrupts the read: else
// pgx's next read on the connection fails with a timeout at once.
func TestAwaitContextEndKeepsPgxDeadline(t *testing.T) {
	ours := enc(t, &pgproto3.DataRow{Values: [][]byte{[]byte("0/1")}}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	for i := range 2000 {
		ctx, cancel := context.WithCancel(context.Background())
		under := &deadlineConn{data: ours, cancel: cancel}
		c := Wrap(under)
		pgxDL := time.Now().Add(time.Hour)
		c.SetReadDeadline(pgxDL)
		in := &Injection{SQL: "x"}
		c.AppendAfterExec(in)
		c.Write(encF(t, &pgproto3.Query{String: "INSERT"}))
		c.mu.Lock()
		c.queue = c.queue[1:] // pgx's own answer is not part of this test: only ours is due
		c.mu.Unlock()
		c.Await(ctx, in)
		time.Sleep(10 * time.Microsecond) // a late interrupt, if any, lands now
		under.mu.Lock()
		last := under.last
		under.mu.Unlock()
		if !last.Equal(pgxDL) {
			t.Fatalf("try %d: the socket's read deadline is %v after Await, want pgx's %v", i, last, pgxDL)
		}
	}
}

// Record notes the SQL of what pgx sends (Query, Parse), binds of
// statements a recording saw parsed, and calls anything else unknown.
func TestRecord(t *testing.T) {
	under := &chunked{rng: rand.New(rand.NewSource(1))}
	c := Wrap(under)
	c.Record()
	c.Write(encF(t, &pgproto3.Query{String: "-- ping"}))
	c.Write(encF(t, &pgproto3.Parse{Name: "s1", Query: "SELECT set_config('a.b', $1, false)"}, &pgproto3.Describe{ObjectType: 'S', Name: "s1"}, &pgproto3.Sync{}))
	c.Write(encF(t, &pgproto3.Bind{PreparedStatement: "s1"}, &pgproto3.Execute{}, &pgproto3.Sync{}))
	texts, unknown := c.Recorded()
	want := []string{"-- ping", "SELECT set_config('a.b', $1, false)", "SELECT set_config('a.b', $1, false)"}
	if unknown || !slices.Equal(texts, want) {
		t.Fatalf("recorded %q, unknown %v; want %q", texts, unknown, want)
	}
	// A later recording knows s1; not s2, prepared while nothing recorded.
	c.Write(encF(t, &pgproto3.Parse{Name: "s2", Query: "SELECT 2"}, &pgproto3.Sync{}))
	c.Record()
	c.Write(encF(t, &pgproto3.Bind{PreparedStatement: "s1"}, &pgproto3.Execute{}, &pgproto3.Sync{}))
	if texts, unknown := c.Recorded(); unknown || len(texts) != 1 {
		t.Fatalf("a bind of s1: %q, unknown %v", texts, unknown)
	}
	c.Record()
	c.Write(encF(t, &pgproto3.Bind{PreparedStatement: "s2"}, &pgproto3.Execute{}, &pgproto3.Sync{}))
	if _, unknown := c.Recorded(); !unknown {
		t.Fatal("a bind of a statement prepared outside a recording is not unknown")
	}
	c.Record()
	c.Write(encF(t, &pgproto3.FunctionCall{Function: 1}))
	if _, unknown := c.Recorded(); !unknown {
		t.Fatal("a FunctionCall is not unknown")
	}
}

// Send puts an injection on the wire on its own; its answer is taken off
// by Await (or, in the second round, by pgx's next read), and pgx reads
// only its own. Behind a transaction pooler nothing is sent.
func TestSend(t *testing.T) {
	ours := enc(t, &pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("l")}}},
		&pgproto3.DataRow{Values: [][]byte{[]byte("0/3000100")}}, &pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")},
		&pgproto3.ReadyForQuery{TxStatus: 'I'})
	pgxs := enc(t, &pgproto3.CommandComplete{CommandTag: []byte("SELECT 0")}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	for seed := int64(1); seed <= 20; seed++ {
		for _, await := range []bool{true, false} {
			under := &chunked{data: append(append([]byte{}, ours...), pgxs...), rng: rand.New(rand.NewSource(seed))}
			c := Wrap(under)
			in := &Injection{SQL: "SELECT pg_current_wal_insert_lsn()"}
			if err := c.Send(in); err != nil {
				t.Fatal(err)
			}
			if !in.Sent() || !bytes.Equal(under.written.Bytes(), encF(t, &pgproto3.Query{String: in.SQL})) {
				t.Fatalf("seed %d: sent %v, wrote %q", seed, in.Sent(), under.written.Bytes())
			}
			if await {
				if err := c.Await(t.Context(), in); err != nil {
					t.Fatal(err)
				}
			}
			c.Write(encF(t, &pgproto3.Query{String: "SELECT"}))
			got := make([]byte, len(pgxs))
			if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, pgxs) {
				t.Fatalf("seed %d: pgx read %q, %v", seed, got, err)
			}
			if row, _ := in.Row(); !in.Done() || len(row) != 1 || row[0] != "0/3000100" {
				t.Fatalf("seed %d: the injection's answer %q, done %v", seed, row, in.Done())
			}
		}
	}
	c := Wrap(&chunked{})
	c.SetTxPooled()
	in := &Injection{SQL: "SELECT 1"}
	if err := c.Send(in); err == nil || in.Sent() || !in.Refused() {
		t.Fatalf("behind a transaction pooler: Send = %v, sent %v, refused %v", err, in.Sent(), in.Refused())
	}
}
