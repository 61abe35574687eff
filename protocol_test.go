package pgryw_test

// Protocol tests: pgryw, through pgx and its own wire layer, against
// scripted fake servers (internal/pgfake) on loopback. Each test asserts
// what reached the servers, message by message and flush by flush, and what
// the caller got back. They start no PostgreSQL and run under -short.
//
// The fake standby replays a write only when a read arrives (its position
// moves as a batch of the pool's connection comes in, before it is
// answered), so neither pgryw's background monitor, which polls every
// 100 ms, nor an earlier answer can have told pgryw that it caught up: the
// first read after a write always carries its check, deterministically.
// Every poll (the monitor's simple queries, pgryw_poll) reports the same
// position, and the read's row says whether the write is visible there.

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgfake"
)

const (
	protoInsert     = "INSERT INTO t (v) VALUES ($1)"
	protoInsertLit  = "INSERT INTO t (v) VALUES (1)"
	protoRead       = "SELECT v FROM t WHERE id = $1"
	protoReadWriter = "SELECT v FROM t WHERE id = $1 /* pgryw:primary */"
	protoCapture    = "SELECT pg_catalog.pg_current_wal_insert_lsn(), pg_catalog.current_setting('wal_block_size'), pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_insert_lsn()), pg_catalog.to_regprocedure('pg_catalog.pg_current_wal_insert_lsn()')::pg_catalog.oid"
	protoPoll       = "SELECT pg_catalog.pg_last_wal_replay_lsn(), pg_catalog.pg_is_in_recovery()"
	protoCheck      = "SELECT pg_catalog.pg_last_wal_replay_lsn(), pg_catalog.pg_is_in_recovery(), pg_catalog.current_setting('transaction_isolation')"
	protoRecovery   = "SELECT pg_catalog.pg_is_in_recovery(), COALESCE(r.last_replayed_end_lsn, pg_catalog.pg_last_wal_replay_lsn()), r.last_replayed_tli, r.promote_triggered FROM (SELECT) AS one LEFT JOIN pg_catalog.pg_stat_recovery AS r ON true"
	protoCaptureLSN = "SELECT pg_catalog.pg_current_wal_insert_lsn()"
	protoSystem     = "SELECT CASE WHEN pg_catalog.has_function_privilege('pg_catalog.pg_control_system()', 'EXECUTE') THEN (SELECT s.system_identifier::pg_catalog.text FROM pg_catalog.pg_control_system() s) END"

	protoStart   = "0/2000000"  // the replica's replay position before the write
	protoLSN     = "0/3000100"  // the writer's position after the write
	protoLSNText = "0/03000100" // as pgryw formats it (%X/%08X)
	protoBehind  = "0/2FFFF00"  // a replay position short of it
)

// protoWriter scripts the fake writer.
type protoWriter struct {
	mu    sync.Mutex
	lsn   string // the capture's answer
	value string // the answer to protoRead on the writer
	cut   bool   // hang up once an INSERT arrives to be executed, unanswered
	// failInsert fails the INSERT's execution with a unique violation.
	failInsert bool
	inserts    int // INSERT executions received (answered or not)
	// cutRead hangs up once, when protoReadWriter arrives to be executed.
	cutRead bool
	reads   []int // the connections protoReadWriter executions arrived on
	// timeline is the writer's timeline (0 means 1): a promoted standby's
	// is higher.
	timeline uint32
	// holdCapture: the answer to a capture riding behind a statement is
	// held back after the statement's ReadyForQuery until release is
	// closed, as a busy server's second packet.
	holdCapture bool
	release     chan struct{}
	// fastFn is the function OID protoCapture reports (0: NULL, so pgryw
	// prepares protoCaptureLSN); a FunctionCall of it answers lsn, or
	// fails with failFast.
	fastFn   uint32
	failFast bool
	cutFast  bool // hang up at a FunctionCall, unanswered
	fastpath int  // FunctionCalls received
	// idleBefore, idleAfter: the server's idle_session_timeout ends the
	// session as the next INSERT arrives to be executed, before it runs
	// (its FATAL the first answer), or after it ran and was answered;
	// idleEnded counts the sessions so ended.
	idleBefore, idleAfter bool
	idleEnded             int
}

// fnOID is protoCapture's fourth column: fastFn, or NULL.
func (w *protoWriter) fnOID() []byte {
	if w.fastFn == 0 {
		return nil
	}
	return []byte(strconv.FormatUint(uint64(w.fastFn), 10))
}

// callsFunction reports a fast-path FunctionCall in b.
func callsFunction(b pgfake.Batch) bool {
	for _, m := range b.Msgs {
		if _, ok := m.(*pgproto3.FunctionCall); ok {
			return true
		}
	}
	return false
}

// walFile names the WAL file of the writer's position, as pg_walfile_name
// does; only its timeline matters to pgryw.
func (w *protoWriter) walFile() string {
	return fmt.Sprintf("%08X%016X", max(w.timeline, 1), 3)
}

func (w *protoWriter) handle(c *pgfake.Conn, b pgfake.Batch) []pgproto3.BackendMessage {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cut && (executes(c, b, protoInsert) || executes(c, b, protoInsertLit)) {
		w.inserts++
		c.Hangup()
		return nil
	}
	if (w.idleBefore || w.idleAfter) && executes(c, b, protoInsert) {
		w.idleEnded++
		c.Hangup()
		if w.idleBefore {
			w.idleBefore = false
			return []pgproto3.BackendMessage{idleFatal}
		}
		w.idleAfter = false
		w.inserts++
		return []pgproto3.BackendMessage{&pgproto3.BindComplete{}, &pgproto3.CommandComplete{CommandTag: []byte("INSERT 0 1")}, idleFatal}
	}
	if executes(c, b, protoReadWriter) {
		w.reads = append(w.reads, c.ID())
		if w.cutRead {
			w.cutRead = false
			c.Hangup()
			return nil
		}
	}
	if w.cutFast && callsFunction(b) {
		w.fastpath++
		c.Hangup()
		return nil
	}
	if w.holdCapture && (executes(c, b, protoCapture) || executes(c, b, protoCaptureLSN) || callsFunction(b)) {
		out := w.answer(c, b)
		if n := rfqs(out); n == 1 {
			// A capture sent on its own: held back whole.
			release := w.release
			go func() {
				<-release
				c.Send(out...)
			}()
			return nil
		}
		for i, m := range out {
			if _, ok := m.(*pgproto3.ReadyForQuery); ok && i < len(out)-1 {
				rest, release := out[i+1:], w.release
				go func() {
					<-release
					c.Send(rest...)
				}()
				return out[:i+1]
			}
		}
		return out
	}
	return w.answer(c, b)
}

// rfqs counts the ReadyForQuery messages in out.
func rfqs(out []pgproto3.BackendMessage) int {
	n := 0
	for _, m := range out {
		if _, ok := m.(*pgproto3.ReadyForQuery); ok {
			n++
		}
	}
	return n
}

func (w *protoWriter) answer(c *pgfake.Conn, b pgfake.Batch) []pgproto3.BackendMessage {
	return c.Answer(b, func(q pgfake.Query) pgfake.Result {
		if q.Function != 0 {
			w.fastpath++
			switch {
			case q.Function != w.fastFn || w.fastFn == 0:
				return pgfake.Result{Err: pgfake.Error("42883", fmt.Sprintf("function with OID %d does not exist", q.Function))}
			case w.failFast:
				return pgfake.Result{Err: pgfake.Error("0A000", "fast-path function calls not supported")}
			}
			return pgfake.Result{Rows: [][][]byte{pgfake.Row(w.lsn)}}
		}
		switch q.SQL {
		case protoCaptureLSN:
			return pgfake.Result{
				Cols: []pgfake.Column{{Name: "pg_current_wal_insert_lsn", OID: 3220}},
				Rows: [][][]byte{pgfake.Row(w.lsn)},
			}
		case protoCapture:
			return pgfake.Result{
				Cols: []pgfake.Column{{Name: "pg_current_wal_insert_lsn", OID: 3220}, {Name: "current_setting", OID: 25}, {Name: "pg_walfile_name", OID: 25}, {Name: "to_regprocedure", OID: 26}},
				Rows: [][][]byte{{[]byte(w.lsn), []byte("8192"), []byte(w.walFile()), w.fnOID()}},
			}
		case "SELECT 1": // probeFastPath's carrier
			return pgfake.Result{Cols: []pgfake.Column{{Name: "?column?", OID: 23}}, Rows: [][][]byte{pgfake.Row("1")}}
		case protoInsert, protoInsertLit:
			if !q.Describe {
				w.inserts++
				if w.failInsert {
					return pgfake.Result{Err: pgfake.Error("23505", "duplicate key value violates unique constraint \"t_pkey\"")}
				}
			}
			r := pgfake.Result{Tag: "INSERT 0 1"}
			if q.SQL == protoInsert {
				r.Params = []uint32{20}
			}
			return r
		case protoRead, protoReadWriter:
			return pgfake.Result{Params: []uint32{20}, Cols: []pgfake.Column{{Name: "v", OID: 25}}, Rows: [][][]byte{pgfake.Row(w.value)}}
		}
		if tag, ok := txTag(q.SQL); ok {
			return pgfake.Result{Tag: tag}
		}
		return pgfake.Result{Err: pgfake.Error("42601", "writer script: unexpected "+q.SQL)}
	})
}

// protoReplica scripts a fake standby.
type protoReplica struct {
	mu     sync.Mutex
	replay string   // replay position, as every poll reports it
	next   []string // positions replay takes, one per batch of the pool's as it arrives
	status string   // WAIT FOR LSN's status
	// waitErr, when set, is the SQLSTATE WAIT FOR raises instead of
	// answering with status.
	waitErr string
	waits   []string // WAIT FOR texts received
	// tli and promoting: pg_stat_recovery's last_replayed_tli and
	// promote_triggered, as the monitor reads them on PostgreSQL 19 ("":
	// NULL, as for a role without pg_read_all_stats).
	tli, promoting string
	reads          int // executions of protoRead
	// iso: transaction_isolation as sqlCheck reads it ("": read
	// committed).
	iso string
	// promoted: the standby was promoted; like PostgreSQL 14 and later it
	// says so (in_hot_standby off) with its next answer to a read.
	promoted bool
}

// replays sets the positions the standby will have replayed when each of
// the next reads arrives.
func (r *protoReplica) replays(pos ...string) {
	r.mu.Lock()
	r.next = pos
	r.mu.Unlock()
}

func (r *protoReplica) handle(c *pgfake.Conn, b pgfake.Batch) []pgproto3.BackendMessage {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !monitorPoll(b) && len(r.next) > 0 {
		r.replay, r.next = r.next[0], r.next[1:]
	}
	if r.promoted && executes(c, b, protoRead) {
		return append([]pgproto3.BackendMessage{&pgproto3.ParameterStatus{Name: "in_hot_standby", Value: "off"}}, r.answer(c, b)...)
	}
	return r.answer(c, b)
}

func (r *protoReplica) answer(c *pgfake.Conn, b pgfake.Batch) []pgproto3.BackendMessage {
	return c.Answer(b, func(q pgfake.Query) pgfake.Result {
		switch {
		case q.SQL == protoPoll:
			return pgfake.Result{
				Cols: []pgfake.Column{{Name: "pg_last_wal_replay_lsn", OID: 3220}, {Name: "pg_is_in_recovery", OID: 16}},
				Rows: [][][]byte{pgfake.Row(r.replay, "t")},
			}
		case q.SQL == protoCheck:
			iso := r.iso
			if iso == "" {
				iso = "read committed"
			}
			return pgfake.Result{
				Cols: []pgfake.Column{{Name: "pg_last_wal_replay_lsn", OID: 3220}, {Name: "pg_is_in_recovery", OID: 16}, {Name: "current_setting", OID: 25}},
				Rows: [][][]byte{pgfake.Row(r.replay, "t", iso)},
			}
		case q.SQL == protoSystem:
			return pgfake.Result{Cols: []pgfake.Column{{Name: "system_identifier", OID: 25}}, Rows: [][][]byte{{nil}}}
		case q.SQL == protoRecovery:
			row := [][]byte{[]byte("t"), []byte(r.replay), nil, nil}
			if r.tli != "" {
				row[2], row[3] = []byte(r.tli), []byte(r.promoting)
			}
			return pgfake.Result{
				Cols: []pgfake.Column{{Name: "pg_is_in_recovery", OID: 16}, {Name: "coalesce", OID: 3220}, {Name: "last_replayed_tli", OID: 23}, {Name: "promote_triggered", OID: 16}},
				Rows: [][][]byte{row},
			}
		case strings.HasPrefix(q.SQL, "WAIT FOR LSN "):
			r.waits = append(r.waits, q.SQL)
			if r.waitErr != "" && !q.Describe {
				return pgfake.Result{Err: pgfake.Error(r.waitErr, "WAIT refused (scripted)")}
			}
			return pgfake.Result{Cols: []pgfake.Column{{Name: "status", OID: 25}}, Rows: [][][]byte{pgfake.Row(r.status)}, Tag: "WAIT"}
		case q.SQL == protoRead:
			res := pgfake.Result{Params: []uint32{20}, Cols: []pgfake.Column{{Name: "v", OID: 25}}}
			if !q.Describe {
				r.reads++
				v := "old" // the write is not replayed
				if protoAt(r.replay) >= protoAt(protoLSN) {
					v = "new"
				}
				res.Rows = [][][]byte{pgfake.Row(v)}
			}
			return res
		}
		if tag, ok := txTag(q.SQL); ok {
			return pgfake.Result{Tag: tag}
		}
		return pgfake.Result{Err: pgfake.Error("42601", "replica script: unexpected "+q.SQL)}
	})
}

// txTag returns the command tag of transaction control (pgx sends "begin
// isolation level … read only", database/sql users "BEGIN").
func txTag(sql string) (string, bool) {
	for _, k := range []string{"BEGIN", "COMMIT", "ROLLBACK"} {
		if strings.HasPrefix(strings.ToUpper(sql), k) {
			return k, true
		}
	}
	return "", false
}

// protoAt parses an LSN of the script.
func protoAt(s string) uint64 {
	var hi, lo uint64
	if _, err := fmt.Sscanf(s, "%X/%X", &hi, &lo); err != nil {
		panic(err)
	}
	return hi<<32 | lo
}

// executes reports whether b executes sql: a Bind of a statement prepared
// with it, or a simple Query of it.
func executes(c *pgfake.Conn, b pgfake.Batch, sql string) bool {
	for _, m := range b.Msgs {
		switch m := m.(type) {
		case *pgproto3.Bind:
			if q, _ := c.StatementSQL(m.PreparedStatement); q == sql {
				return true
			}
		case *pgproto3.Query:
			if m.String == sql {
				return true
			}
		}
	}
	return false
}

// monitorPoll reports a batch of the monitor's: its poll, alone, as a
// simple query (or a connection's Terminate).
func monitorPoll(b pgfake.Batch) bool {
	if len(b.Msgs) != 1 {
		return false
	}
	switch m := b.Msgs[0].(type) {
	case *pgproto3.Query:
		return m.String == protoPoll || m.String == protoRecovery || m.String == protoSystem
	case *pgproto3.Terminate:
		return true
	}
	return false
}

type protoCluster struct {
	db      *sql.DB
	c       *pgryw.Connector
	writer  *pgfake.Server
	replica *pgfake.Server
	w       *protoWriter
	r       *protoReplica
}

// newProtoCluster starts a fake writer and a fake standby reporting
// version, and opens a pgryw pool of one connection on them with extra DSN
// keys.
func newProtoCluster(t *testing.T, version, extra string) *protoCluster {
	t.Helper()
	pc := &protoCluster{
		w: &protoWriter{lsn: protoLSN, value: "writer"},
		r: &protoReplica{replay: protoStart, status: "success"},
	}
	var err error
	pc.writer, err = pgfake.Start(pgfake.Config{ServerVersion: version, InHotStandby: "off", Handler: pc.w.handle})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.writer.Close() })
	pc.replica, err = pgfake.Start(pgfake.Config{ServerVersion: version, InHotStandby: "on", Handler: pc.r.handle})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.replica.Close() })
	dsn := fmt.Sprintf("host=%s port=%d user=app password=secret dbname=app sslmode=disable connect_timeout=2 replicas=%s %s",
		pc.writer.Host(), pc.writer.Port(), pc.replica.Addr(), extra)
	cfg, err := pgryw.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.c, err = pgryw.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pc.db = sql.OpenDB(pc.c)
	pc.db.SetMaxOpenConns(1)
	t.Cleanup(func() { pc.db.Close() })
	return pc
}

// flush is one batch a fake server received, summarized.
type flush struct {
	conn  *pgfake.Conn
	batch pgfake.Batch
	msgs  []string
}

func (f flush) String() string { return fmt.Sprintf("conn %d: %q", f.conn.ID(), f.msgs) }

// msgsOf returns each flush's messages, summarized.
func msgsOf(fs []flush) [][]string {
	var got [][]string
	for _, f := range fs {
		got = append(got, f.msgs)
	}
	return got
}

// flushes returns every batch s received on connections that used the
// extended protocol (the pool's; the monitor only sends simple queries)
// or, with all, on every connection, leaving out pgx's pings; pgx's
// statements are shown by their SQL, pgryw's by name.
func flushes(s *pgfake.Server, all bool) []flush {
	var fs []flush
	for _, c := range s.Conns() {
		var mine []flush
		pool := false
		for _, b := range c.Batches() {
			f := flush{conn: c, batch: b, msgs: pgfake.Summary(b, c.Label("pgryw_"))}
			if reflect.DeepEqual(f.msgs, []string{"Query -- ping"}) || reflect.DeepEqual(f.msgs, []string{"Query " + protoSystem}) {
				continue // pgx's, when database/sql reuses a connection; the monitor's
			}
			for _, m := range b.Msgs {
				if _, ok := m.(*pgproto3.Bind); ok {
					pool = true
				}
			}
			mine = append(mine, f)
		}
		if pool || all {
			fs = append(fs, mine...)
		}
	}
	return fs
}

// poolConns counts s's connections that served the pool (a Bind came on
// them), leaving out the monitor's, which opens whenever its first probe
// runs.
func poolConns(s *pgfake.Server) int {
	n := 0
	for _, c := range s.Conns() {
	batches:
		for _, b := range c.Batches() {
			for _, m := range b.Msgs {
				if _, ok := m.(*pgproto3.Bind); ok {
					n++
					break batches
				}
			}
		}
	}
	return n
}

// with returns the flushes holding msg.
func with(fs []flush, msg string) []flush {
	var out []flush
	for _, f := range fs {
		if slices.Contains(f.msgs, msg) {
			out = append(out, f)
		}
	}
	return out
}

func mentionsPgryw(f flush) bool {
	for _, m := range f.msgs {
		if strings.Contains(m, "pgryw_") || strings.Contains(m, "pg_current_wal") || strings.Contains(m, "pg_last_wal") || strings.Contains(m, "WAIT FOR") {
			return true
		}
	}
	return false
}

// Encoded ride-along messages, as pgryw must put them on the wire.
var (
	captureFirst = pgfake.Encode(&pgproto3.Parse{Name: "pgryw_capture", Query: protoCapture},
		&pgproto3.Bind{PreparedStatement: "pgryw_capture"}, &pgproto3.Execute{}, &pgproto3.Sync{})
	// Once the connection knows the block size and timeline: the position
	// alone, prepared on the second capture.
	captureLSNFirst = pgfake.Encode(&pgproto3.Parse{Name: "pgryw_lsn", Query: protoCaptureLSN},
		&pgproto3.Bind{PreparedStatement: "pgryw_lsn"}, &pgproto3.Execute{}, &pgproto3.Sync{})
	// The check in front of an extended-protocol read: chained, no Sync.
	checkFirst = pgfake.Encode(&pgproto3.Parse{Name: "pgryw_check", Query: protoCheck},
		&pgproto3.Bind{PreparedStatement: "pgryw_check"}, &pgproto3.Execute{})
)

var (
	insertExec = []string{"Bind " + protoInsert, "Describe P", "Execute", "Sync"}
	readExec   = []string{"Bind " + protoRead, "Execute", "Sync"}
	capFirst   = []string{"Parse pgryw_capture", "Bind pgryw_capture", "Execute", "Sync"}
	capLSN1    = []string{"Parse pgryw_lsn", "Bind pgryw_lsn", "Execute", "Sync"}
	pollMsgs   = []string{"Bind pgryw_poll", "Execute", "Sync"}
	parsePoll  = []string{"Parse pgryw_poll"}
	checkMsgs  = []string{"Bind pgryw_check", "Execute"}
	parseCheck = []string{"Parse pgryw_check"}
)

func cat(parts ...[]string) []string { return slices.Concat(parts...) }

// An autocommit write with an argument: pgx's Bind/Describe/Execute/Sync,
// then pgryw's capture in the same flush (Parse of it only the first time
// on the connection); the capture's answer is taken off the wire and the
// caller gets the INSERT's own result.
func TestProtocolAutocommitWriteCarriesCapture(t *testing.T) {
	pc := newProtoCluster(t, "15.4", "capture=always")
	for i, wantCapture := range [][]byte{captureFirst, captureLSNFirst} {
		res, err := pc.db.Exec(protoInsert, 1)
		if err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			t.Fatalf("write %d: RowsAffected %d, %v; want 1 from the INSERT's CommandComplete", i, n, err)
		}
		fs := with(flushes(pc.writer, false), "Bind "+protoInsert)
		if len(fs) != i+1 {
			t.Fatalf("write %d: INSERT executed in %d flushes, want %d", i, len(fs), i+1)
		}
		f := fs[i]
		wantMsgs := cat(insertExec, capFirst)
		if i > 0 {
			wantMsgs = cat(insertExec, capLSN1)
		}
		if !reflect.DeepEqual(f.msgs, wantMsgs) {
			t.Fatalf("write %d: one flush carried\n %q\nwant\n %q", i, f.msgs, wantMsgs)
		}
		// Byte level: pgx's messages end in its Sync, and pgryw's follow
		// verbatim.
		raw := f.batch.Raw
		if !bytes.HasSuffix(raw, wantCapture) {
			t.Fatalf("write %d: flush does not end with pgryw's capture bytes:\n% x", i, raw)
		}
		pgx := raw[:len(raw)-len(wantCapture)]
		if len(pgx) < 5 || !bytes.Equal(pgx[len(pgx)-5:], []byte{'S', 0, 0, 0, 4}) {
			t.Fatalf("write %d: pgx's part does not end in Sync: % x", i, pgx)
		}
		bind := f.batch.Msgs[0].(*pgproto3.Bind)
		if len(bind.Parameters) != 1 || !bytes.Equal(bind.Parameters[0], []byte{0, 0, 0, 0, 0, 0, 0, 1}) {
			t.Fatalf("write %d: INSERT bound %q", i, bind.Parameters)
		}
	}
	// The first write also prepared the INSERT (pgx's own round trip,
	// nothing of pgryw's in it); the second is one flush in all.
	all := flushes(pc.writer, false)
	want := [][]string{
		{"Parse " + protoInsert, "Describe S " + protoInsert, "Sync"},
		cat(insertExec, capFirst),
		cat(insertExec, capLSN1),
	}
	var got [][]string
	for _, f := range all {
		got = append(got, f.msgs)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("writer flushes\n %q\nwant\n %q", got, want)
	}
	// The capture's DataRow never reached pgx: the connection is in step,
	// and the next statement on the writer gets its own row.
	var v string
	if err := pc.db.QueryRow(protoReadWriter, 7).Scan(&v); err != nil || v != "writer" {
		t.Fatalf("read on the writer after the writes: %q, %v", v, err)
	}
	if got := pgryw.PoolWatermark(pc.c); got != protoLSNText {
		t.Errorf("pool watermark %s, want %s", got, protoLSNText)
	}
	if st := pc.c.Stats(); st.Captures != 3 || st.CaptureFailures != 0 {
		t.Errorf("stats %+v, want 3 captures (two writes, one primary read)", st)
	}
	// No replica saw anything but the monitor.
	if fs := flushes(pc.replica, false); len(fs) != 0 {
		t.Errorf("replica got %q", fs[0].msgs)
	}
}

// capture=auto: in a run of writes with no read asking for a watermark in
// between, a write after the first goes without its capture, and the read
// that follows sends one on its own before it trusts the replica: one
// capture for the run. The replica's first answer
// is at the position of the run's first write, which carried its capture,
// short of the later ones': served then, the read would be stale. The write after that read carries its capture again.
func TestProtocolWriteRunCapturesOnce(t *testing.T) {
	t.Parallel()
	pc := newProtoCluster(t, "15.4", "wait_timeout=2s")
	pc.w.mu.Lock()
	pc.w.lsn = protoBehind
	pc.w.mu.Unlock()
	warmReplica(t, pc) // a read, then a write that carries its capture
	pc.w.mu.Lock()
	pc.w.lsn = protoLSN
	pc.w.mu.Unlock()
	if _, err := pc.db.Exec(protoInsert, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.db.Exec(protoInsert, 3); err != nil {
		t.Fatal(err)
	}
	fs := flushes(pc.writer, false)
	var got [][]string
	for _, f := range fs[len(fs)-2:] {
		got = append(got, f.msgs)
	}
	if want := [][]string{insertExec, insertExec}; !reflect.DeepEqual(got, want) {
		t.Fatalf("writes in a run: writer flushes\n %q\nwant\n %q", got, want)
	}
	pc.r.replays(protoBehind, protoLSN)
	var v string
	if err := pc.db.QueryRow(protoRead, 7).Scan(&v); err != nil || v != "new" {
		t.Fatalf("read after the run: %q, %v; want the second write's row", v, err)
	}
	fs = flushes(pc.writer, false)
	if last := fs[len(fs)-1].msgs; !reflect.DeepEqual(last, capLSN1) {
		t.Fatalf("before the read the writer got %q, want the capture alone", last)
	}
	if _, err := pc.db.Exec(protoInsert, 4); err != nil {
		t.Fatal(err)
	}
	fs = flushes(pc.writer, false)
	if last := fs[len(fs)-1].msgs; !reflect.DeepEqual(last, cat(insertExec, []string{"Bind pgryw_lsn", "Execute", "Sync"})) {
		t.Fatalf("a write after a read: writer flush %q, want it with its capture", last)
	}
	// warmReplica's write, the read's and the last write's.
	if st := pc.c.Stats(); st.Captures != 3 || st.StaleReads != 0 {
		t.Errorf("stats %+v, want 3 captures", st)
	}
}

// capture=auto under concurrency: a connection writes twice in a row (the
// second write goes without its capture), and a read on another connection
// must then read a position afresh, a round trip of its own in its path,
// the light one once its connection knows the primary's block size. From
// then on, for a while, every write keeps its capture, a second one in a
// row too; without that, a pool whose workers often write twice running
// (database/sql hands a goroutine back the connection it just freed) pays
// a round trip in some read for every such write.
func TestProtocolWriteRunMissKeepsCaptures(t *testing.T) {
	t.Parallel()
	pc := newProtoCluster(t, "15.4", "wait_timeout=2s")
	pc.db.SetMaxOpenConns(2)
	pc.r.mu.Lock()
	pc.r.replay = protoLSN
	pc.r.mu.Unlock()
	ctx := context.Background()
	a, err := pc.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := pc.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// recaptures counts the positions read with round trips of their own
	// on the writer, on any connection.
	recaptures := func() (n int) {
		for _, f := range flushes(pc.writer, true) {
			if reflect.DeepEqual(f.msgs, []string{"Query " + protoCapture}) || reflect.DeepEqual(f.msgs, []string{"Query " + protoCaptureLSN}) {
				n++
			}
		}
		return n
	}
	write := func(what string, want []string) {
		t.Helper()
		if _, err := a.ExecContext(ctx, protoInsert, 1); err != nil {
			t.Fatal(err)
		}
		fs := flushes(pc.writer, false)
		var last flush
		for _, f := range fs {
			if len(f.msgs) > 0 && f.msgs[0] == "Bind "+protoInsert {
				last = f
			}
		}
		if !reflect.DeepEqual(last.msgs, want) {
			t.Fatalf("%s: writer flush %q, want %q", what, last.msgs, want)
		}
	}
	read := func(what string) {
		t.Helper()
		var v string
		if err := b.QueryRowContext(ctx, protoRead, 7).Scan(&v); err != nil || v != "new" {
			t.Fatalf("%s: %q, %v", what, v, err)
		}
	}
	read("a first read on b")
	write("a's first write", cat(insertExec, capFirst))
	read("b's read after it")
	write("a's write after a read", cat(insertExec, capLSN1))
	write("a's second write running", insertExec)
	read("b's read after a's run")
	if n := recaptures(); n != 1 {
		t.Fatalf("%d positions read on their own after a's run, want b's one", n)
	}
	write("a's write after the miss", cat(insertExec, []string{"Bind pgryw_lsn", "Execute", "Sync"}))
	write("a's second write running after the miss", cat(insertExec, []string{"Bind pgryw_lsn", "Execute", "Sync"}))
	read("b's read after that")
	if n := recaptures(); n != 1 {
		t.Errorf("%d positions read on their own in all, want b's one", n)
	}
	if st := pc.c.Stats(); st.StaleReads != 0 {
		t.Errorf("stats %+v", st)
	}
}

// capture=on_read: no write carries a capture, not even a connection's
// first or one after a read. The read after a write sends one on its own
// as it starts, and its check to the replica while the capture's answer
// is on its way; it waits for the position (the replica's first answer is
// short of it).
func TestProtocolCaptureOnRead(t *testing.T) {
	t.Parallel()
	pc := newProtoCluster(t, "15.4", "wait_timeout=2s capture=on_read")
	write := func(what string) {
		t.Helper()
		if _, err := pc.db.Exec(protoInsert, 1); err != nil {
			t.Fatal(err)
		}
		fs := flushes(pc.writer, false)
		if last := fs[len(fs)-1].msgs; !reflect.DeepEqual(last, insertExec) {
			t.Fatalf("%s: writer flush %q, want the INSERT alone", what, last)
		}
	}
	write("the first write")
	pc.r.replays(protoBehind, protoLSN)
	pc.w.mu.Lock()
	pc.w.holdCapture, pc.w.release = true, make(chan struct{})
	pc.w.mu.Unlock()
	before := len(flushes(pc.replica, false))
	got := make(chan error, 1)
	var v string
	go func() { got <- pc.db.QueryRow(protoRead, 7).Scan(&v) }()
	// The capture goes to the writer on its own, and the check to the
	// replica while its answer is held back.
	for dl := time.Now().Add(2 * time.Second); len(flushes(pc.replica, false)) == before; time.Sleep(time.Millisecond) {
		if time.Now().After(dl) {
			t.Fatal("no check reached the replica while the capture was on its way")
		}
	}
	// The capture was sent first, but the fake writer may record it a
	// moment after the replica recorded the check (CI at 113c27a).
	for dl := time.Now().Add(2 * time.Second); ; time.Sleep(time.Millisecond) {
		fs := flushes(pc.writer, false)
		last := fs[len(fs)-1].msgs
		if reflect.DeepEqual(last, capFirst) {
			break
		}
		if time.Now().After(dl) {
			t.Fatalf("before the read the writer got %q, want the capture alone", last)
		}
	}
	select {
	case err := <-got:
		t.Fatalf("the read returned %q, %v before the position arrived", v, err)
	case <-time.After(20 * time.Millisecond):
	}
	close(pc.w.release)
	if err := <-got; err != nil || v != "new" {
		t.Fatalf("read after the write: %q, %v; want the write's row", v, err)
	}
	write("a write after a read")
	if st := pc.c.Stats(); st.Captures != 1 || st.StaleReads != 0 {
		t.Errorf("stats %+v, want 1 capture, the read's", st)
	}
}

// Once the first capture has reported pg_current_wal_insert_lsn's OID and
// a probe of pgryw's own has seen a fast-path FunctionCall of it answered,
// a write carries one instead of a prepared statement, and the position it
// answers is the watermark. A node whose fast path fails gets prepared
// captures for a while, the failed write's position read again at once.
func TestProtocolFastPathCapture(t *testing.T) {
	pc := newProtoCluster(t, "19devel", "capture=always")
	pc.w.fastFn = 2852
	for i := range 3 {
		switch i {
		case 1:
			pc.w.mu.Lock()
			pc.w.lsn = "0/3000180"
			pc.w.mu.Unlock()
		case 2:
			pc.w.mu.Lock()
			pc.w.lsn, pc.w.failFast = "0/3000200", true
			pc.w.mu.Unlock()
		}
		if _, err := pc.db.Exec(protoInsert, 1); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		// The next statement on the connection settles the capture.
		var v string
		if err := pc.db.QueryRow(protoReadWriter, 7).Scan(&v); err != nil || v != "writer" {
			t.Fatalf("read on the writer after write %d: %q, %v", i, v, err)
		}
		if got := pgryw.PoolWatermark(pc.c); i == 1 && got != "0/03000180" {
			t.Fatalf("pool watermark %s after a fast-path capture answered 0/3000180", got)
		}
	}
	if _, err := pc.db.Exec(protoInsert, 1); err != nil {
		t.Fatal(err)
	}
	var got [][]string
	for _, f := range flushes(pc.writer, false) {
		got = append(got, f.msgs)
	}
	fast := []string{"FunctionCall 2852"}
	readW := []string{"Bind " + protoReadWriter, "Execute", "Sync"}
	want := [][]string{
		{"Parse " + protoInsert, "Describe S " + protoInsert, "Sync"},
		cat(insertExec, capFirst),
		{"Query SELECT 1", "FunctionCall 2852"}, // the probe, as the connection is handed out again
		{"Parse " + protoReadWriter, "Describe S " + protoReadWriter, "Sync"},
		cat(readW, fast),
		cat(insertExec, fast),
		cat(readW, fast),
		cat(insertExec, fast),        // answered with an error: lost,
		{"Query " + protoCaptureLSN}, // so read again at once, the position alone
		cat(readW, capLSN1),          // prepared from then on
		cat(insertExec, []string{"Bind pgryw_lsn", "Execute", "Sync"}),
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("writer flushes\n %q\nwant\n %q", got, want)
	}
	pc.w.mu.Lock()
	n := pc.w.fastpath
	pc.w.mu.Unlock()
	if n != 5 {
		t.Errorf("%d FunctionCalls arrived, want 5", n)
	}
	// The one error answer is the only capture that failed: the probe's
	// call is not a capture, and every other was answered.
	st := pc.c.Stats()
	if st.CaptureFailures != 1 {
		t.Errorf("stats %+v, want the one failed fast-path capture", st)
	}
	if got := pgryw.PoolWatermark(pc.c); got != "0/03000200" {
		t.Errorf("pool watermark %s, want 0/03000200, from the captures after the failed one", got)
	}
}

// A fast-path probe that fails, with an error answer or with the
// connection dropped at the FunctionCall (something in between that does
// not take the message), leaves the node's captures prepared, and the
// application sees nothing of it: a dropped connection is reported bad
// before it is handed out, and database/sql takes another.
func TestProtocolFastPathProbeFails(t *testing.T) {
	for _, drop := range []bool{false, true} {
		t.Run(fmt.Sprintf("drop=%v", drop), func(t *testing.T) {
			pc := newProtoCluster(t, "19devel", "")
			pc.w.fastFn, pc.w.failFast, pc.w.cutFast = 2852, !drop, drop
			for i := range 3 {
				if _, err := pc.db.Exec(protoInsert, 1); err != nil {
					t.Fatalf("write %d: %v", i, err)
				}
				var v string
				if err := pc.db.QueryRow(protoReadWriter, 7).Scan(&v); err != nil || v != "writer" {
					t.Fatalf("read after write %d: %q, %v", i, v, err)
				}
			}
			var probes, fast int
			for _, f := range flushes(pc.writer, true) {
				if slices.Contains(f.msgs, "FunctionCall 2852") {
					fast++
					if slices.Contains(f.msgs, "Query SELECT 1") {
						probes++
					}
				}
			}
			if probes != 1 || fast != 1 {
				t.Errorf("%d flushes carried a FunctionCall, %d of them the probe; want the one probe", fast, probes)
			}
			if st := pc.c.Stats(); st.CaptureFailures != 0 {
				t.Errorf("stats %+v: the probe's failure is not a capture's", st)
			}
		})
	}
}

// A standby promoted while pgryw holds a connection to it says so with its
// next answer (in_hot_standby, PostgreSQL 14 and later): that answer stands
// (it has everything the node replayed), and the next read goes to the
// primary without waiting for the monitor's next poll.
func TestProtocolPromotedReplicaSaysSoInAnswer(t *testing.T) {
	pc := newProtoCluster(t, "15.4", "")
	pgryw.StopMonitor(pc.c)
	var v string
	if err := pc.db.QueryRow(protoRead, 7).Scan(&v); err != nil || v != "old" {
		t.Fatalf("read before the promotion: %q, %v", v, err)
	}
	pc.r.mu.Lock()
	pc.r.promoted = true
	pc.r.mu.Unlock()
	if err := pc.db.QueryRow(protoRead, 7).Scan(&v); err != nil || v != "old" {
		t.Fatalf("read answered with the promotion: %q, %v; want the replica's answer", v, err)
	}
	if err := pc.db.QueryRow(protoRead, 7).Scan(&v); err != nil || v != "writer" {
		t.Fatalf("read after the promotion was reported: %q, %v; want the primary's", v, err)
	}
	pc.r.mu.Lock()
	reads := pc.r.reads
	pc.r.mu.Unlock()
	if reads != 2 {
		t.Errorf("the replica ran %d reads, want 2", reads)
	}
}

// warmReplica runs one read before any write (no check is needed, and the
// replica connection gets the read prepared, as in a running application),
// then the write. With one replica no poll rides behind a read (trailPolls):
// pgryw_poll is prepared by the first check in front of a read.
func warmReplica(t *testing.T, pc *protoCluster) {
	t.Helper()
	var v string
	if err := pc.db.QueryRow(protoRead, 7).Scan(&v); err != nil || v != "old" {
		t.Fatalf("warm-up read: %q, %v", v, err)
	}
	fs := flushes(pc.replica, false)
	want := [][]string{
		{"Parse " + protoRead, "Describe S " + protoRead, "Sync"},
		readExec,
	}
	var got [][]string
	for _, f := range fs {
		got = append(got, f.msgs)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("warm-up read: replica flushes\n %q\nwant\n %q", got, want)
	}
	if _, err := pc.db.Exec(protoInsert, 1); err != nil {
		t.Fatal(err)
	}
}

// A read after a write on a PostgreSQL 15 standby: pgryw_check in front of
// pgx's messages, in one flush; the replica has replayed the capture's
// position, so its rows are returned. The next read goes alone: the replica
// is known to be caught up. (With one replica nothing rides behind a read;
// TestProtocolTwoReplicasTrailingPoll shows the poll behind it.)
func TestProtocolReplicaReadPollsInOneFlush(t *testing.T) {
	t.Parallel()
	pc := newProtoCluster(t, "15.4", "")
	warmReplica(t, pc)
	pc.r.replays(protoLSN)
	writerBefore := len(flushes(pc.writer, false))
	before := len(flushes(pc.replica, false))

	for i, want := range [][]string{cat(parseCheck, checkMsgs, readExec), readExec} {
		var v string
		if err := pc.db.QueryRow(protoRead, 7).Scan(&v); err != nil || v != "new" {
			t.Fatalf("read %d: %q, %v", i, v, err)
		}
		fs := flushes(pc.replica, false)[before:]
		if len(fs) != i+1 {
			t.Fatalf("read %d took %d flushes on the replica, want 1: %v", i, len(fs)-i, fs)
		}
		f := fs[i]
		if !reflect.DeepEqual(f.msgs, want) {
			t.Fatalf("read %d: replica flush\n %q\nwant\n %q", i, f.msgs, want)
		}
		if i == 0 {
			if !bytes.HasPrefix(f.batch.Raw, checkFirst) {
				t.Fatalf("poll bytes not in front:\n% x", f.batch.Raw)
			}
			settleMonitor(t, pc)
		}
	}
	if n := len(flushes(pc.writer, false)); n != writerBefore {
		t.Errorf("the reads sent %d flushes to the writer", n-writerBefore)
	}
	if st := pc.c.Stats(); st.ReplicaReads != 3 || st.Fallbacks != 0 || st.Waits != 0 {
		t.Errorf("stats %+v", st)
	}
}

// With two replicas a poll rides behind every replica read, in the read's
// flush: it bounds what the read saw, so that the connection's next read,
// which may go to the other replica, sees no less (monotonic reads).
func TestProtocolTwoReplicasTrailingPoll(t *testing.T) {
	pc := newProtoCluster(t, "15.4", "")
	r2 := &protoReplica{replay: protoStart, status: "success"}
	second, err := pgfake.Start(pgfake.Config{ServerVersion: "15.4", InHotStandby: "on", Handler: r2.handle})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.Close() })
	db, _ := openDSN(t, fmt.Sprintf("host=%s port=%d user=app password=secret dbname=app sslmode=disable connect_timeout=2 replicas=%s,%s",
		pc.writer.Host(), pc.writer.Port(), pc.replica.Addr(), second.Addr()))
	db.SetMaxOpenConns(1)
	for i := 0; i < 4; i++ {
		var v string
		if err := db.QueryRow(protoRead, 7).Scan(&v); err != nil || v != "old" {
			t.Fatalf("read %d: %q, %v", i, v, err)
		}
	}
	var got [][]string
	for _, srv := range []*pgfake.Server{pc.replica, second} {
		for _, f := range flushes(srv, false) {
			if !reflect.DeepEqual(f.msgs, []string{"Parse " + protoRead, "Describe S " + protoRead, "Sync"}) {
				got = append(got, f.msgs)
			}
		}
	}
	if len(got) != 4 {
		t.Fatalf("%d reads on the replicas, want 4: %q", len(got), got)
	}
	for _, msgs := range got {
		if !reflect.DeepEqual(msgs, cat(readExec, pollMsgs)) && !reflect.DeepEqual(msgs, cat(readExec, parsePoll, pollMsgs)) {
			t.Fatalf("replica flush %q; want the read, pgryw_poll", msgs)
		}
	}
}

// chainedWaitFor reports whether a replica flush is WAIT FOR riding in front
// of the read with no Sync of its own (an unnamed Parse, Bind, Execute),
// and returns its SQL.
func chainedWaitFor(msgs []string) (string, bool) {
	if len(msgs) != 3+len(readExec) || !strings.HasPrefix(msgs[0], "Parse WAIT FOR ") ||
		msgs[1] != "Bind "+strings.TrimPrefix(msgs[0], "Parse ") || msgs[2] != "Execute" || !reflect.DeepEqual(msgs[3:], readExec) {
		return "", false
	}
	return strings.TrimPrefix(msgs[0], "Parse "), true
}

// A read right after a write whose position has not arrived yet. Before
// PostgreSQL 19 the check, a poll, needs no position: it rides in front of
// the read at once, and the position, read once the read's answer is in, is
// compared with the poll's answer; a replica found behind is polled again.
// On PostgreSQL 19 the read waits for the position (due within
// microseconds) and sends WAIT FOR with it.
func TestProtocolCheckBeforePositionArrives(t *testing.T) {
	for _, tc := range []struct {
		version string
		caught  bool
	}{
		{"15.4", true},
		{"15.4", false},
		{"19devel", true},
	} {
		t.Run(fmt.Sprintf("%s caught up %v", tc.version, tc.caught), func(t *testing.T) {
			pc := newProtoCluster(t, tc.version, "wait_timeout=2s capture=always")
			warmReplica(t, pc)
			if tc.caught {
				pc.r.replays(protoLSN)
			} else {
				pc.r.replays(protoBehind, protoLSN)
			}
			pc.w.mu.Lock()
			pc.w.holdCapture, pc.w.release = true, make(chan struct{})
			pc.w.mu.Unlock()
			if _, err := pc.db.Exec(protoInsert, 2); err != nil {
				t.Fatal(err)
			}
			before := len(flushes(pc.replica, false))
			type answer struct {
				v   string
				err error
			}
			got := make(chan answer, 1)
			go func() {
				var v string
				err := pc.db.QueryRow(protoRead, 7).Scan(&v)
				got <- answer{v, err}
			}()
			polls := tc.version != "19devel"
			if polls {
				for dl := time.Now().Add(2 * time.Second); len(flushes(pc.replica, false)) == before; time.Sleep(time.Millisecond) {
					if time.Now().After(dl) {
						t.Fatal("no check reached the replica while the position was on its way")
					}
				}
			}
			select {
			case a := <-got:
				t.Fatalf("the read returned %q, %v before the position arrived", a.v, a.err)
			case <-time.After(20 * time.Millisecond):
			}
			if !polls && len(flushes(pc.replica, false)) != before {
				t.Fatal("WAIT FOR went out before the position arrived")
			}
			close(pc.w.release)
			a := <-got
			if a.err != nil || a.v != "new" {
				t.Fatalf("read: %q, %v; want the replica's new row", a.v, a.err)
			}
			fs := flushes(pc.replica, false)[before:]
			switch {
			case !polls:
				sql, ok := chainedWaitFor(fs[0].msgs)
				if len(fs) != 1 || !ok || !strings.Contains(sql, protoLSNText) {
					t.Fatalf("attempts %v; want one WAIT FOR for %s, with the read", fs, protoLSNText)
				}
			case !reflect.DeepEqual(fs[0].msgs, cat(parseCheck, checkMsgs, readExec)):
				t.Fatalf("first attempt %q; want pgryw_check, the read", fs[0].msgs)
			case tc.caught && len(fs) != 1:
				t.Fatalf("%d attempts, want 1: %v", len(fs), fs)
			case !tc.caught && (len(fs) != 2 || !reflect.DeepEqual(fs[1].msgs, cat(checkMsgs, readExec))):
				t.Fatalf("attempts %v; want the poll's, then one more", fs)
			}
		})
	}
}

// settleMonitor waits for two more of the monitor's polls to arrive at the
// replica. A monitor answer sent before the standby caught up, but read
// after a check learned that it had, sets pgryw's knowledge of the replica
// back (probe takes a lower position for a rebuilt standby); the monitor
// handles each answer before sending its next poll, so once two polls have
// arrived after the catch-up, the latest answer it handled is current.
func settleMonitor(t *testing.T, pc *protoCluster) {
	t.Helper()
	count := func() int {
		n := 0
		for _, f := range flushes(pc.replica, true) {
			if monitorPoll(f.batch) {
				n++
			}
		}
		return n
	}
	start := count()
	for dl := time.Now().Add(2 * time.Second); count() < start+2; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(dl) {
			t.Fatal("the monitor stopped polling the replica")
		}
	}
}

// A read whose check finds the replica behind: that answer is discarded
// (though the replica sent rows), and the read is sent again with a new
// check, whose rows the caller gets.
func TestProtocolReplicaBehindDiscardsAndRereads(t *testing.T) {
	pc := newProtoCluster(t, "15.4", "")
	warmReplica(t, pc)
	pc.r.replays(protoBehind, protoLSN)
	before := len(flushes(pc.replica, false))

	var v string
	if err := pc.db.QueryRow(protoRead, 7).Scan(&v); err != nil || v != "new" {
		t.Fatalf("read: %q, %v; want only the good attempt's row", v, err)
	}
	fs := flushes(pc.replica, false)[before:]
	if len(fs) != 2 {
		t.Fatalf("read took %d flushes, want 2 (one per attempt): %v", len(fs), fs)
	}
	for i, f := range fs {
		want := cat(checkMsgs, readExec)
		if i == 0 {
			want = cat(parseCheck, want)
		}
		if !reflect.DeepEqual(f.msgs, want) {
			t.Fatalf("attempt %d: flush\n %q\nwant\n %q", i, f.msgs, want)
		}
	}
	pc.r.mu.Lock()
	reads := pc.r.reads
	pc.r.mu.Unlock()
	if reads != 3 {
		t.Errorf("replica executed the read %d times, want 3 (warm-up, discarded, served)", reads)
	}
	if st := pc.c.Stats(); st.ReplicaReads != 2 || st.Waits != 1 || st.Fallbacks != 0 {
		t.Errorf("stats %+v", st)
	}
}

var waitForRE = regexp.MustCompile(`^WAIT FOR LSN '([0-9A-F]+/[0-9A-F]{8})' WITH \(MODE 'standby_replay', TIMEOUT '(\d+)ms', NO_THROW\)$`)

// On a PostgreSQL 19 standby the check is a simple-protocol WAIT FOR LSN in
// front of the read. Its status decides: 'success' lets the read's rows
// through; 'timeout' applies on_timeout (primary, the default: the writer
// reads; error: ErrReplicaBehind; stale: the replica's rows, counted);
// 'not in recovery' sends the read to the writer.
func TestProtocolWaitForLSN(t *testing.T) {
	for _, tc := range []struct {
		name, status, replay, extra string
		want                        string // the caller's row; "" for ErrReplicaBehind
		onWriter                    bool
		stats                       func(pgryw.Stats) bool
	}{
		{"success", "success", protoLSN, "", "new", false, func(st pgryw.Stats) bool { return st.ReplicaReads == 2 && st.Fallbacks == 0 }},
		{"timeout", "timeout", protoBehind, "", "writer", true, func(st pgryw.Stats) bool { return st.Fallbacks == 1 && st.WaitTimeouts == 1 }},
		{"timeout error", "timeout", protoBehind, "on_timeout=error", "", false, func(st pgryw.Stats) bool { return st.BehindErrors == 1 && st.WaitTimeouts == 1 }},
		{"timeout stale", "timeout", protoBehind, "on_timeout=stale", "old", false, func(st pgryw.Stats) bool { return st.StaleReads == 1 && st.ReplicaReads == 2 }},
		{"not in recovery", "not in recovery", protoBehind, "", "writer", true, func(st pgryw.Stats) bool { return st.Fallbacks == 1 && st.WaitTimeouts == 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc := newProtoCluster(t, "19devel", "wait_timeout=200ms "+tc.extra)
			warmReplica(t, pc)
			pc.r.replays(tc.replay)
			pc.r.mu.Lock()
			pc.r.status = tc.status
			pc.r.mu.Unlock()
			before := len(flushes(pc.replica, false))
			writerBefore := len(flushes(pc.writer, false))

			var v string
			err := pc.db.QueryRow(protoRead, 7).Scan(&v)
			if tc.want == "" {
				if !errors.Is(err, pgryw.ErrReplicaBehind) || !strings.Contains(err.Error(), protoLSNText) || strings.Contains(err.Error(), "secret") {
					t.Fatalf("read: %v; want ErrReplicaBehind naming %s and no password", err, protoLSNText)
				}
			} else if err != nil || v != tc.want {
				t.Fatalf("read: %q, %v; want %q", v, err, tc.want)
			}
			fs := flushes(pc.replica, false)[before:]
			if len(fs) != 1 {
				t.Fatalf("read took %d flushes on the replica, want 1", len(fs))
			}
			msgs := fs[0].msgs
			sql, ok := chainedWaitFor(msgs)
			if !ok {
				t.Fatalf("replica flush %q; want WAIT FOR (Parse, Bind, Execute, no Sync), the read", msgs)
			}
			m := waitForRE.FindStringSubmatch(sql)
			if m == nil {
				t.Fatalf("check %q is not WAIT FOR LSN … NO_THROW", msgs[0])
			}
			if m[1] != protoLSNText {
				t.Errorf("WAIT FOR LSN %s, want the capture's %s", m[1], protoLSNText)
			}
			if ms, _ := strconv.Atoi(m[2]); ms < 1 || ms > 200 {
				t.Errorf("TIMEOUT %sms, want within wait_timeout=200ms", m[2])
			}
			wantQuery := pgfake.Encode(&pgproto3.Parse{Query: sql}, &pgproto3.Bind{}, &pgproto3.Execute{})
			if !bytes.HasPrefix(fs[0].batch.Raw, wantQuery) {
				t.Errorf("WAIT FOR is not the flush's first message")
			}
			// On the writer: the read (prepare, then execute with a capture
			// behind it) or nothing.
			wfs := flushes(pc.writer, false)[writerBefore:]
			if got := len(with(wfs, "Bind "+protoRead)); tc.onWriter && got != 1 || !tc.onWriter && len(wfs) != 0 {
				t.Errorf("writer flushes %v", wfs)
			}
			if st := pc.c.Stats(); !tc.stats(st) {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// Polling (before PostgreSQL 19) gives up at wait_timeout: a few tries
// with the check riding along with the read, then polls alone, then the
// writer reads.
func TestProtocolPollTimeoutFallsBack(t *testing.T) {
	pc := newProtoCluster(t, "15.4", "wait_timeout=30ms")
	warmReplica(t, pc)
	pc.r.replays(protoBehind)
	before := len(flushes(pc.replica, false))
	var v string
	if err := pc.db.QueryRow(protoRead, 7).Scan(&v); err != nil || v != "writer" {
		t.Fatalf("read: %q, %v; want the writer's row", v, err)
	}
	fs := flushes(pc.replica, false)[before:]
	pipelined := 0
	for i, f := range fs {
		switch {
		case reflect.DeepEqual(f.msgs, cat(checkMsgs, readExec)), i == 0 && reflect.DeepEqual(f.msgs, cat(parseCheck, checkMsgs, readExec)):
			if i != pipelined {
				t.Fatalf("flush %d carries the read after polls alone: %v", i, fs)
			}
			pipelined++
		case reflect.DeepEqual(f.msgs, []string{"Query " + protoPoll}):
		default:
			t.Fatalf("flush %d: %q", i, f.msgs)
		}
	}
	if pipelined < 1 || pipelined > 4 {
		t.Errorf("%d reads sent along with a check, want 1 to 4", pipelined)
	}
	if st := pc.c.Stats(); st.Fallbacks != 1 || st.WaitTimeouts != 1 {
		t.Errorf("stats %+v", st)
	}
}

// An autocommit write the server fails: the caller gets the server's error
// (a bare *pgconn.PgError), and the capture that rode behind it is still
// read and covers it.
func TestProtocolFailedWriteStillCaptures(t *testing.T) {
	pc := newProtoCluster(t, "15.4", "")
	pc.w.mu.Lock()
	pc.w.failInsert = true
	pc.w.mu.Unlock()
	_, err := pc.db.Exec(protoInsert, 1)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		t.Fatalf("got %v, want the server's 23505", err)
	}
	if _, ok := err.(*pgconn.PgError); !ok {
		t.Errorf("error %T is not a bare *pgconn.PgError", err)
	}
	fs := with(flushes(pc.writer, false), "Bind "+protoInsert)
	if len(fs) != 1 || !reflect.DeepEqual(fs[0].msgs, cat(insertExec, capFirst)) {
		t.Fatalf("write flushes %v", fs)
	}
	if got := pgryw.PoolWatermark(pc.c); got != protoLSNText {
		t.Errorf("pool watermark %s, want %s", got, protoLSNText)
	}
	if st := pc.c.Stats(); st.Captures != 1 {
		t.Errorf("stats %+v", st)
	}
}

// read_your_writes=off, and a pool without replicas: nothing of pgryw's on
// the wire (no capture, no check, no trailing poll, no monitor).
func TestProtocolNothingRidesAlong(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, extra string
		replicas    bool
	}{
		{"read_your_writes=off", "read_your_writes=off", true},
		{"no replicas", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc := newProtoCluster(t, "15.4", tc.extra)
			db := pc.db
			if !tc.replicas {
				cfg, err := pgryw.ParseDSN(fmt.Sprintf("host=%s port=%d user=app dbname=app sslmode=disable connect_timeout=2", pc.writer.Host(), pc.writer.Port()))
				if err != nil {
					t.Fatal(err)
				}
				c, err := pgryw.NewConnector(cfg)
				if err != nil {
					t.Fatal(err)
				}
				db = sql.OpenDB(c)
				defer db.Close()
			}
			for i := 0; i < 2; i++ {
				if _, err := db.Exec(protoInsert, 1); err != nil {
					t.Fatal(err)
				}
				var v string
				want := "old"
				if !tc.replicas {
					want = "writer"
				}
				if err := db.QueryRow(protoRead, 7).Scan(&v); err != nil || v != want {
					t.Fatalf("read: %q, %v; want %q", v, err, want)
				}
			}
			time.Sleep(150 * time.Millisecond) // a monitor would have polled by now
			for _, s := range []*pgfake.Server{pc.writer, pc.replica} {
				for _, f := range flushes(s, true) {
					if mentionsPgryw(f) {
						t.Errorf("pgryw sent %v", f)
					}
				}
			}
		})
	}
}

// An Exec'd BEGIN: nothing of pgryw's is sent while the block is open,
// neither on the writer nor on a replica; the capture rides behind COMMIT
// and, for a block that wrote, moves the pool's watermark.
func TestProtocolExecBeginDefersCapture(t *testing.T) {
	pc := newProtoCluster(t, "15.4", "")
	ctx := context.Background()
	conn, err := pc.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	mark := func() int { return len(flushes(pc.writer, true)) }
	steps := []struct {
		name string
		run  func() error
	}{
		{"BEGIN", func() error { _, err := conn.ExecContext(ctx, "BEGIN"); return err }},
		{"insert", func() error { _, err := conn.ExecContext(ctx, protoInsert, 1); return err }},
		{"read", func() error {
			var v string
			err := conn.QueryRowContext(ctx, protoRead, 7).Scan(&v)
			if err == nil && v != "writer" {
				err = fmt.Errorf("got %q, want the writer's row (inside the block)", v)
			}
			return err
		}},
		{"COMMIT", func() error { _, err := conn.ExecContext(ctx, "COMMIT"); return err }},
	}
	var inBlock []flush
	var commit []flush
	for _, s := range steps {
		n := mark()
		if err := s.run(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		fs := flushes(pc.writer, true)[n:]
		if s.name == "COMMIT" {
			commit = fs
		} else {
			inBlock = append(inBlock, fs...)
		}
	}
	for _, f := range inBlock {
		if mentionsPgryw(f) {
			t.Errorf("inside the block pgryw sent %q", f.msgs)
		}
	}
	if len(inBlock) != 5 { // BEGIN; INSERT prepare, execute; read prepare, execute
		t.Errorf("block took %d flushes, want 5: %v", len(inBlock), inBlock)
	}
	if len(commit) != 1 {
		t.Fatalf("COMMIT took %d flushes, want 1", len(commit))
	}
	if want := cat([]string{"Query COMMIT"}, capFirst); !reflect.DeepEqual(commit[0].msgs, want) {
		t.Fatalf("COMMIT flush\n %q\nwant\n %q", commit[0].msgs, want)
	}
	if !bytes.Equal(commit[0].batch.Raw, append(pgfake.Encode(&pgproto3.Query{String: "COMMIT"}), captureFirst...)) {
		t.Fatalf("COMMIT flush bytes\n% x", commit[0].batch.Raw)
	}
	if fs := flushes(pc.replica, false); len(fs) != 0 {
		t.Errorf("replica got %q while the block was open", fs[0].msgs)
	}
	if got := pgryw.PoolWatermark(pc.c); got != protoLSNText {
		t.Errorf("pool watermark %s after COMMIT, want %s", got, protoLSNText)
	}

	// A block that only read: its COMMIT carries the capture too (the
	// connection's floor), but the pool's watermark stays.
	pc.w.mu.Lock()
	pc.w.lsn = "0/3000200"
	pc.w.mu.Unlock()
	n := mark()
	for _, s := range []func() error{steps[0].run, steps[2].run, steps[3].run} {
		if err := s(); err != nil {
			t.Fatal(err)
		}
	}
	fs := flushes(pc.writer, true)[n:]
	if len(fs) != 3 || mentionsPgryw(fs[0]) || mentionsPgryw(fs[1]) || !reflect.DeepEqual(fs[2].msgs, cat([]string{"Query COMMIT"}, capLSN1)) {
		t.Fatalf("read-only block: flushes %v", fs)
	}
	if got := pgryw.PoolWatermark(pc.c); got != protoLSNText {
		t.Errorf("pool watermark %s after a read-only block, want %s still", got, protoLSNText)
	}
}

// database/sql transactions. A read-write one runs on the writer with
// nothing of pgryw's inside it; the capture rides behind its COMMIT (and
// behind a ROLLBACK, which moves only the connection's floor, not the pool's
// watermark). A read-only one runs on a replica whose check rides in front
// of its BEGIN, with a trailing poll behind its COMMIT: three flushes.
func TestProtocolTransactions(t *testing.T) {
	pc := newProtoCluster(t, "15.4", "")
	ctx := context.Background()
	tx, err := pc.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var v string
	if err := tx.QueryRow(protoRead, 7).Scan(&v); err != nil || v != "writer" {
		t.Fatalf("read in the transaction: %q, %v", v, err)
	}
	if _, err := tx.Exec(protoInsert, 1); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	fs := flushes(pc.writer, true)
	if len(fs) != 6 {
		t.Fatalf("read-write transaction took %d flushes, want 6: %v", len(fs), fs)
	}
	for _, f := range fs[:5] {
		if mentionsPgryw(f) {
			t.Errorf("inside the transaction pgryw sent %q", f.msgs)
		}
	}
	if !reflect.DeepEqual(fs[0].msgs, []string{"Query begin"}) {
		t.Errorf("BEGIN flush %q", fs[0].msgs)
	}
	if want := cat([]string{"Query commit"}, capFirst); !reflect.DeepEqual(fs[5].msgs, want) {
		t.Fatalf("COMMIT flush\n %q\nwant\n %q", fs[5].msgs, want)
	}
	if got := pgryw.PoolWatermark(pc.c); got != protoLSNText {
		t.Fatalf("pool watermark %s after COMMIT, want %s", got, protoLSNText)
	}

	// A rolled-back transaction: its capture moves nothing of the pool's.
	pc.w.mu.Lock()
	pc.w.lsn = "0/3000200"
	pc.w.mu.Unlock()
	tx, err = pc.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(protoInsert, 1); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	fs = flushes(pc.writer, true)[6:]
	if len(fs) != 3 || mentionsPgryw(fs[0]) || mentionsPgryw(fs[1]) || !reflect.DeepEqual(fs[2].msgs, cat([]string{"Query rollback"}, capLSN1)) {
		t.Fatalf("rolled-back transaction: flushes %v", fs)
	}
	if got := pgryw.PoolWatermark(pc.c); got != protoLSNText {
		t.Fatalf("pool watermark %s after ROLLBACK, want %s still", got, protoLSNText)
	}

	// A read-only transaction: check with BEGIN, the read, COMMIT with a
	// trailing poll, all on the replica.
	pc.r.replays("0/3000200")
	writerBefore := len(flushes(pc.writer, true))
	rtx, err := pc.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true, Isolation: sql.LevelRepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	if err := rtx.QueryRow(protoRead, 7).Scan(&v); err != nil || v != "new" {
		t.Fatalf("read-only transaction: %q, %v", v, err)
	}
	if err := rtx.Commit(); err != nil {
		t.Fatal(err)
	}
	var got [][]string
	for _, f := range flushes(pc.replica, true) {
		if !monitorPoll(f.batch) {
			got = append(got, f.msgs)
		}
	}
	want := [][]string{
		cat([]string{"Parse pgryw_poll"}, pollMsgs, []string{"Query begin isolation level repeatable read read only"}),
		{"Parse " + protoRead, "Describe S " + protoRead, "Sync"},
		readExec,
		{"Query commit"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("read-only transaction: replica flushes\n %q\nwant\n %q", got, want)
	}
	if n := len(flushes(pc.writer, true)); n != writerBefore {
		t.Errorf("read-only transaction sent %d flushes to the writer", n-writerBefore)
	}
}

// A write whose connection is cut after the statement arrived and before it
// was answered: the caller gets an error that is not driver.ErrBadConn (so
// database/sql does not run it again), and the server saw it once. The write
// may have committed, so the next replica read first reads the writer's
// position (its own round trip, on a new writer connection) and waits for
// it: its check rides in front of pgx's prepare on a new replica
// connection.
func TestProtocolCutWriteRunsOnce(t *testing.T) {
	for _, tc := range protoCuts {
		t.Run(tc.name, func(t *testing.T) {
			pc := newProtoCluster(t, "15.4", "")
			err := cutWrite(t, pc, tc.exec)
			if errors.Is(err, driver.ErrBadConn) {
				t.Errorf("error %v is driver.ErrBadConn", err)
			}
			t.Logf("caller got %T: %v (io.ErrUnexpectedEOF: %v, ErrConnLost: %v)", err, err, errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, pgryw.ErrConnLost))
			pc.w.mu.Lock()
			inserts := pc.w.inserts
			pc.w.cut = false
			pc.w.mu.Unlock()
			if inserts != 1 {
				t.Errorf("server received the INSERT %d times, want 1 (error %v)", inserts, err)
			}
			if n := len(pc.writer.Conns()); n != 1 {
				t.Fatalf("%d writer connections after the write: database/sql retried on a new one", n)
			}

			pc.r.replays(protoLSN)
			var v string
			if err := pc.db.QueryRow(protoRead, 7).Scan(&v); err != nil || v != "new" {
				t.Fatalf("read after the cut write: %q, %v", v, err)
			}
			conns := pc.writer.Conns()
			if len(conns) != 2 || len(conns[1].Batches()) == 0 {
				t.Fatalf("no new writer connection for the position (%d connections)", len(conns))
			}
			if got := pgfake.Summary(conns[1].Batches()[0], nil); !reflect.DeepEqual(got, []string{"Query " + protoCapture}) {
				t.Fatalf("new writer connection's first flush %q, want the capture alone", got)
			}
			got := msgsOf(flushes(pc.replica, false))
			want := [][]string{
				cat(parseCheck, checkMsgs, []string{"Parse " + protoRead, "Describe S " + protoRead, "Sync"}),
				readExec,
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("replica flushes\n %q\nwant\n %q", got, want)
			}
		})
	}
}

var protoCuts = []struct {
	name string
	exec func(db *sql.DB) error
}{
	{"argument", func(db *sql.DB) error { _, err := db.Exec(protoInsert, 1); return err }},
	{"no argument", func(db *sql.DB) error { _, err := db.Exec(protoInsertLit); return err }},
}

// cutWrite runs exec with the writer set to hang up on the INSERT, and
// returns its error.
func cutWrite(t *testing.T, pc *protoCluster, exec func(*sql.DB) error) error {
	t.Helper()
	pc.w.mu.Lock()
	pc.w.cut = true
	pc.w.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := pc.db.PingContext(ctx); err != nil {
		t.Fatal(err)
	}
	err := exec(pc.db)
	if err == nil {
		t.Fatal("write on a cut connection succeeded")
	}
	return err
}

// docs/guarantees.md ("Nothing runs twice"): "a connection lost after that is
// pgryw.ErrConnLost", whether pgx called it safe to retry (no arguments) or
// returned its own error (io.ErrUnexpectedEOF, still matched).
func TestProtocolCutWriteIsErrConnLost(t *testing.T) {
	for _, tc := range protoCuts {
		t.Run(tc.name, func(t *testing.T) {
			pc := newProtoCluster(t, "15.4", "")
			if err := cutWrite(t, pc, tc.exec); !errors.Is(err, pgryw.ErrConnLost) {
				t.Fatalf("got %v, want pgryw.ErrConnLost", err)
			}
		})
	}
}

// ServedBy says which watermark a replica read answered to and whether a
// check rode with it: after a write, the first read is checked (the poll
// in front of it) and the next one is not (the replica is known to have
// replayed the position); both answered to the write's position. A read
// before any write answers to none.
func TestProtocolServedByWatermark(t *testing.T) {
	pc := newProtoCluster(t, "15.4", "")
	var got []pgryw.ServedBy
	ctx := pgryw.WithServedBy(context.Background(), func(_ context.Context, s pgryw.ServedBy) { got = append(got, s) })
	read := func() pgryw.ServedBy {
		t.Helper()
		got = nil
		var v string
		if err := pc.db.QueryRowContext(ctx, protoRead, 7).Scan(&v); err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].Role != pgryw.RoleReplica {
			t.Fatalf("served by %+v, want one replica", got)
		}
		return got[0]
	}
	if s := read(); s.Watermark != 0 || s.Checked {
		t.Errorf("read before any write: watermark %X, checked %v; want 0, false", s.Watermark, s.Checked)
	}
	if _, err := pc.db.Exec(protoInsert, 1); err != nil {
		t.Fatal(err)
	}
	pc.r.replays(protoLSN)
	want := protoAt(protoLSN)
	first, second := read(), read()
	if first.Watermark != want || !first.Checked {
		t.Errorf("first read after the write: watermark %X, checked %v; want %X, true", first.Watermark, first.Checked, want)
	}
	if second.Watermark != want || second.Checked {
		t.Errorf("second read: watermark %X, checked %v; want %X, false", second.Watermark, second.Checked, want)
	}
}

// Reads waiting for a replica to replay their watermark share one poll
// loop, the monitor's: after a few tries each with its own check in front
// (for a replica about to get there), a read leaves the polling to the
// monitor's connection, which wakes it when the replica got there; it then
// reads without a check. Without the shared loop every waiting read polls
// on its own connection every few milliseconds, so the replica's polls grow
// with the waiting reads.
func TestProtocolWaitingReadsShareOnePoll(t *testing.T) {
	const (
		readers = 8
		// A read's own polls: pgryw's pipelinedAttempts tries with the read
		// riding along, then polls alone backing off from 100 µs until a
		// pause reaches 1 ms (followAfter): about 11, however long the
		// wait (at most 98 for the 8 reads in 38 of 40 runs). Once the
		// monitor has measured the lag, a read past the replica's
		// expected arrival retries every 20 µs for up to lagSteady (5
		// ms) before it hands over: 108 and 126 in the other 2. Polling
		// on its own up to 5 ms apart, a read waiting 150 ms would poll
		// about 40 times.
		ownPolls = 20
		lag      = 150 * time.Millisecond
	)
	pc := newProtoCluster(t, "15.4", "wait_timeout=2s")
	pc.db.SetMaxOpenConns(readers + 1)
	warmReplica(t, pc)
	pc.r.mu.Lock()
	pc.r.replay = protoBehind
	reads0 := pc.r.reads
	pc.r.mu.Unlock()
	time.AfterFunc(lag, func() {
		pc.r.mu.Lock()
		pc.r.replay = protoLSN
		pc.r.mu.Unlock()
	})
	seen := map[*pgfake.Conn]int{}
	for _, c := range pc.replica.Conns() {
		seen[c] = len(c.Batches())
	}
	var servedMu sync.Mutex
	var served []pgryw.ServedBy
	ctx := pgryw.WithServedBy(context.Background(), func(_ context.Context, s pgryw.ServedBy) {
		servedMu.Lock()
		served = append(served, s)
		servedMu.Unlock()
	})
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, readers)
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var v string
			if err := pc.db.QueryRowContext(ctx, protoRead, 7).Scan(&v); err != nil || v != "new" {
				errs <- fmt.Errorf("read: %q, %v; want the replayed row", v, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if d := time.Since(start); d < lag {
		t.Fatalf("reads returned after %v, before the replica got there (%v)", d, lag)
	}
	polls, monitor := 0, 0
	for _, c := range pc.replica.Conns() {
		bs := c.Batches()
		pool := false
		for _, b := range bs {
			for _, m := range b.Msgs {
				_, bind := m.(*pgproto3.Bind)
				pool = pool || bind
			}
		}
		for _, b := range bs[seen[c]:] {
			if !executes(c, b, protoPoll) {
				continue
			}
			if pool {
				polls++
			} else {
				monitor++
			}
		}
	}
	pc.r.mu.Lock()
	reads := pc.r.reads - reads0
	pc.r.mu.Unlock()
	t.Logf("%d reads waited %v: %d polls on their connections, %d on the monitor's, %d executions of the read", readers, lag, polls, monitor, reads)
	if max := readers * ownPolls; polls > max {
		t.Errorf("the waiting reads polled %d times on their own connections, want at most %d (%d each): they poll on their own", polls, max, ownPolls)
	}
	if max := readers * 5; reads > max {
		t.Errorf("the read ran %d times, want at most %d (4 riding with a check, once after)", reads, max)
	}
	// A read the monitor woke went without a check, and says so
	// (ServedBy.Checked); every read answered to the write's position.
	unchecked := 0
	for _, s := range served {
		if s.Role != pgryw.RoleReplica || s.Watermark != protoAt(protoLSN) {
			t.Errorf("served by %+v, want a replica answering to %s", s, protoLSN)
		}
		if !s.Checked {
			unchecked++
		}
	}
	if len(served) != readers || unchecked == 0 {
		t.Errorf("%d reads reported, %d without a check; want %d, some woken by the monitor without one", len(served), unchecked, readers)
	}
}
