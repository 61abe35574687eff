// Package pgfake is a scripted fake PostgreSQL server for protocol tests, in
// the spirit of pgx's pgmock: it speaks the wire protocol on a loopback
// port, accepts any client with trust authentication, records what each
// client flush carried, and answers by a script the test supplies.
//
// A Server listens on 127.0.0.1:0. For every connection it performs the
// startup (SSL and GSS encryption requests are declined; AuthenticationOk,
// ParameterStatus server_version, in_hot_standby, standard_conforming_strings,
// client_encoding and any extra Config.Params, BackendKeyData and
// ReadyForQuery), then loops: it reads one Batch (the frontend messages
// that arrived together: everything the socket holds once a first byte has
// come, completed to a message boundary), records it on the Conn, and writes
// back what the Handler returns for it, in one write. Terminate and a closed
// socket end the connection; Conn.Hangup ends it from the script (for
// instance after a statement arrived and before it is answered).
//
// Handlers usually answer through Conn.Answer, which walks a batch the way a
// server does (Parse, Bind, Describe, Execute, Sync, Query, Close) and asks
// a Responder for each statement's Result; an error result makes the rest of
// an extended-protocol batch be skipped up to its Sync, as PostgreSQL does.
package pgfake

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Handler answers one batch of frontend messages received on c; the
// returned messages are written back in one write. A Handler runs on the
// connection's goroutine, one batch at a time per connection, but
// concurrently for different connections.
type Handler func(c *Conn, b Batch) []pgproto3.BackendMessage

// Config describes a fake server.
type Config struct {
	// ServerVersion is reported as server_version; "15.4" when empty.
	// pgx and pgryw read the major version from it ("19devel" is 19).
	ServerVersion string
	// InHotStandby is reported as in_hot_standby ("on" for a standby, "off"
	// for a primary); the parameter is not sent when empty.
	InHotStandby string
	// Params are further ParameterStatus messages sent at startup.
	Params map[string]string
	// Pooled makes the server look like a pooler in front of one: the
	// answer to pgryw's connection identity query (IdentityPrefix) names
	// another backend process than the BackendKeyData of the startup.
	Pooled bool
	// System is the system identifier the identity query reports; empty:
	// NULL, as for a role that may not read it.
	System string
	// Handler answers each batch. When nil, every batch gets
	// Conn.Answer(b, nil): each statement an error.
	Handler Handler
}

// Batch is what one client flush delivered: the bytes as received and the
// frontend messages decoded from them, in order.
type Batch struct {
	Seq  int    // 0 for the connection's first batch after startup
	Raw  []byte // the messages' bytes, exactly as they arrived
	Msgs []pgproto3.FrontendMessage
}

// Server is a running fake server. Its methods are safe for concurrent use.
type Server struct {
	cfg Config
	ln  net.Listener
	wg  sync.WaitGroup

	mu       sync.Mutex
	conns    []*Conn
	accepted map[net.Conn]bool // every socket not yet closed, in startup or not
	cancels  int
	closed   bool
	instance string // what the identity query reports (SetInstance)
}

// Start starts a fake server on 127.0.0.1 with a free port.
func Start(cfg Config) (*Server, error) {
	if cfg.ServerVersion == "" {
		cfg.ServerVersion = "15.4"
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, ln: ln, accepted: map[net.Conn]bool{}}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr returns the server's address as host:port.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Host returns the address the server listens on ("127.0.0.1").
func (s *Server) Host() string { return s.ln.Addr().(*net.TCPAddr).IP.String() }

// Port returns the port the server listens on.
func (s *Server) Port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// Conns returns the connections that completed startup, in order of
// arrival, open or not.
func (s *Server) Conns() []*Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Conn(nil), s.conns...)
}

// CancelRequests counts the query cancellation requests received.
func (s *Server) CancelRequests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cancels
}

// Close stops accepting, closes every connection and waits for their
// goroutines to end.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	var socks []net.Conn
	for nc := range s.accepted {
		socks = append(socks, nc)
	}
	s.mu.Unlock()
	err := s.ln.Close()
	for _, nc := range socks {
		nc.Close()
	}
	s.wg.Wait()
	return err
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			return
		}
		s.accepted[nc] = true
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.accepted, nc)
				s.mu.Unlock()
			}()
			s.serve(nc)
		}()
	}
}

// Conn is one client connection of a Server.
type Conn struct {
	nc     net.Conn
	id     int
	params map[string]string // the client's startup parameters

	mu        sync.Mutex
	batches   []Batch
	seen      map[string]string // every statement name the client parsed -> SQL
	stmts     map[string]string // the statements Answer holds prepared
	portal    portal            // the unnamed portal (the only one clients here use)
	tx        byte              // transaction status: 'I', 'T' or 'E'
	hangup    bool
	inHandler bool
	done      chan struct{}
	rbuf      []byte
	instance  string // what the identity query told it
}

// Instance returns the server instance the connection's identity query was
// told ("" when it sent none).
func (c *Conn) Instance() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.instance
}

type portal struct {
	ok      bool
	stmt    string
	params  [][]byte
	formats []int16
}

// ID returns the connection's index in Server.Conns.
func (c *Conn) ID() int { return c.id }

// StartupParam returns a startup parameter the client sent ("user",
// "database", "application_name", ...).
func (c *Conn) StartupParam(name string) string { return c.params[name] }

// Batches returns a copy of the batches received so far, in order.
func (c *Conn) Batches() []Batch {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Batch(nil), c.batches...)
}

// StatementSQL returns the SQL text of the last Parse the client sent for
// name (the unnamed statement is ""), and whether it sent one. Unlike the
// statements Conn.Answer holds prepared, a Close or Deallocate does not
// forget it.
func (c *Conn) StatementSQL(name string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	q, ok := c.seen[name]
	return q, ok
}

// Deallocate makes Conn.Answer forget the prepared statement name, as
// DEALLOCATE or DISCARD ALL would: a later Bind of it fails with SQLSTATE
// 26000.
func (c *Conn) Deallocate(name string) {
	c.mu.Lock()
	delete(c.stmts, name)
	c.mu.Unlock()
}

func (c *Conn) prepared(name string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	q, ok := c.stmts[name]
	return q, ok
}

// TxStatus returns the transaction status the next ReadyForQuery from
// Conn.Answer reports: 'I' (idle), 'T' (in a block) or 'E' (failed block).
func (c *Conn) TxStatus() byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tx
}

// Hangup makes the server close the connection once the current Handler
// call returns, after writing what it returned (return nil to close without
// answering). Called from outside a Handler, it closes the connection at
// once.
func (c *Conn) Hangup() {
	c.mu.Lock()
	c.hangup = true
	now := !c.inHandler
	c.mu.Unlock()
	if now {
		c.nc.Close()
	}
}

// Send writes messages to the client outside a Handler, as a server does
// unasked: a notification, or the notice it sends an idle client on an
// immediate shutdown.
func (c *Conn) Send(msgs ...pgproto3.BackendMessage) error {
	var out []byte
	for _, m := range msgs {
		out = encode(out, m)
	}
	_, err := c.nc.Write(out)
	return err
}

// Closed reports whether the connection has ended.
func (c *Conn) Closed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Done is closed when the connection has ended.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Close closes the connection from the server side at once.
func (c *Conn) Close() error { return c.nc.Close() }

// Startup request codes that come in place of a protocol version.
const (
	codeCancel = 80877102
	codeSSL    = 80877103
	codeGSS    = 80877104
)

func (s *Server) serve(nc net.Conn) {
	defer nc.Close()
	params, ok := s.startup(nc)
	if !ok {
		return
	}
	s.mu.Lock()
	c := &Conn{nc: nc, id: len(s.conns), params: params, seen: map[string]string{}, stmts: map[string]string{}, tx: 'I', done: make(chan struct{})}
	s.conns = append(s.conns, c)
	s.mu.Unlock()
	defer close(c.done)

	var out []byte
	out = encode(out, &pgproto3.AuthenticationOk{})
	ps := []struct{ k, v string }{
		{"server_version", s.cfg.ServerVersion},
		{"server_encoding", "UTF8"},
		{"client_encoding", "UTF8"},
		{"standard_conforming_strings", "on"},
		{"DateStyle", "ISO, MDY"},
		{"integer_datetimes", "on"},
		{"TimeZone", "UTC"},
	}
	if s.cfg.InHotStandby != "" {
		ps = append(ps, struct{ k, v string }{"in_hot_standby", s.cfg.InHotStandby})
	}
	for k, v := range s.cfg.Params {
		ps = append(ps, struct{ k, v string }{k, v})
	}
	for _, p := range ps {
		out = encode(out, &pgproto3.ParameterStatus{Name: p.k, Value: p.v})
	}
	out = encode(out, &pgproto3.BackendKeyData{ProcessID: uint32(1000 + c.id), SecretKey: []byte{0, 0, 0, byte(c.id)}})
	out = encode(out, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	if _, err := nc.Write(out); err != nil {
		return
	}

	for {
		raw, err := c.readBatch()
		if len(raw) > 0 && s.isIdentity(raw) {
			if _, err := nc.Write(s.identity(c)); err != nil {
				return
			}
			continue
		}
		if len(raw) > 0 {
			msgs, stmts := decodeFrontend(raw)
			c.mu.Lock()
			b := Batch{Seq: len(c.batches), Raw: raw, Msgs: msgs}
			c.batches = append(c.batches, b)
			for k, v := range stmts {
				c.seen[k] = v
			}
			c.inHandler = true
			c.mu.Unlock()
			terminate := false
			for _, m := range msgs {
				if _, ok := m.(*pgproto3.Terminate); ok {
					terminate = true
				}
			}
			var reply []pgproto3.BackendMessage
			if h := s.cfg.Handler; h != nil {
				reply = h(c, b)
			} else {
				reply = c.Answer(b, nil)
			}
			out = out[:0]
			for _, m := range reply {
				out = encode(out, m)
			}
			if len(out) > 0 {
				if _, err := nc.Write(out); err != nil {
					return
				}
			}
			c.mu.Lock()
			hangup := c.hangup
			c.inHandler = false
			c.mu.Unlock()
			if terminate || hangup {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// IdentityPrefix starts the query pgryw sends on each new server connection
// to learn which backend and server instance it reached. The fake answers
// it itself, without a batch: scripts see what comes after.
const IdentityPrefix = "SELECT pg_catalog.pg_backend_pid()"

// SetInstance changes the server instance the identity query reports (""
// means "fake"): a stand-in for an address that starts leading to another
// server.
func (s *Server) SetInstance(inst string) {
	s.mu.Lock()
	s.instance = inst
	s.mu.Unlock()
}

// isIdentity reports a batch that is exactly pgryw's identity query.
func (s *Server) isIdentity(raw []byte) bool {
	msgs, _ := decodeFrontend(raw)
	if len(msgs) != 1 {
		return false
	}
	q, ok := msgs[0].(*pgproto3.Query)
	return ok && strings.HasPrefix(q.String, IdentityPrefix)
}

// identity answers the identity query on c: its backend PID (another one
// with Config.Pooled), the instance, the port and Config.System.
func (s *Server) identity(c *Conn) []byte {
	pid := 1000 + c.id
	if s.cfg.Pooled {
		pid += 50000
	}
	s.mu.Lock()
	inst := s.instance
	s.mu.Unlock()
	if inst == "" {
		inst = "fake"
	}
	var system []byte
	if s.cfg.System != "" {
		system = []byte(s.cfg.System)
	}
	c.mu.Lock()
	c.instance = inst
	c.mu.Unlock()
	return Encode(
		rowDescription([]Column{{Name: "pid", OID: 25}, {Name: "instance", OID: 25}, {Name: "port", OID: 25}, {Name: "system", OID: 25}}),
		&pgproto3.DataRow{Values: [][]byte{[]byte(fmt.Sprint(pid)), []byte(inst), []byte(fmt.Sprint(s.Port())), system}},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")},
		&pgproto3.ReadyForQuery{TxStatus: c.TxStatus()},
	)
}

// startup reads the startup packet, declining SSL and GSS encryption
// requests, and returns the client's parameters. A cancel request is counted
// and ends the connection.
func (s *Server) startup(nc net.Conn) (map[string]string, bool) {
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	defer nc.SetDeadline(time.Time{})
	for {
		var hdr [4]byte
		if _, err := io.ReadFull(nc, hdr[:]); err != nil {
			return nil, false
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n < 8 || n > 10000 {
			return nil, false
		}
		body := make([]byte, n-4)
		if _, err := io.ReadFull(nc, body); err != nil {
			return nil, false
		}
		switch binary.BigEndian.Uint32(body) {
		case codeSSL, codeGSS:
			if _, err := nc.Write([]byte{'N'}); err != nil {
				return nil, false
			}
			continue
		case codeCancel:
			s.mu.Lock()
			s.cancels++
			s.mu.Unlock()
			return nil, false
		}
		var sm pgproto3.StartupMessage
		if err := sm.Decode(body); err != nil {
			return nil, false
		}
		return sm.Parameters, true
	}
}

// readBatch waits for the client's next bytes, then takes everything
// already available on the socket without blocking, and reads on only as
// far as needed to end at a message boundary.
func (c *Conn) readBatch() ([]byte, error) {
	if c.rbuf == nil {
		c.rbuf = make([]byte, 64<<10)
	}
	var data []byte
	n, err := c.nc.Read(c.rbuf)
	data = append(data, c.rbuf[:n]...)
	for err == nil {
		if complete(data) {
			m := drain(c.nc, c.rbuf)
			if m == 0 {
				break
			}
			data = append(data, c.rbuf[:m]...)
			continue
		}
		n, err = c.nc.Read(c.rbuf)
		data = append(data, c.rbuf[:n]...)
	}
	// Keep whole messages only: a connection that failed mid-message
	// delivered the rest to nobody.
	return data[:wholeLen(data)], err
}

// complete reports whether b ends at a message boundary.
func complete(b []byte) bool { return wholeLen(b) == len(b) }

// wholeLen returns how many leading bytes of b are whole messages.
func wholeLen(b []byte) int {
	i := 0
	for len(b)-i >= 5 {
		n := int(binary.BigEndian.Uint32(b[i+1 : i+5]))
		if n < 4 || len(b)-i-1 < n {
			break
		}
		i += 1 + n
	}
	return i
}

// decodeFrontend splits raw into messages, decoding each into a fresh value
// (from a copy of its bytes), and returns the statements parsed in it.
func decodeFrontend(raw []byte) ([]pgproto3.FrontendMessage, map[string]string) {
	var msgs []pgproto3.FrontendMessage
	stmts := map[string]string{}
	for i := 0; i < len(raw); {
		t := raw[i]
		n := int(binary.BigEndian.Uint32(raw[i+1 : i+5]))
		body := append([]byte(nil), raw[i+5:i+1+n]...)
		i += 1 + n
		var m pgproto3.FrontendMessage
		switch t {
		case 'P':
			m = &pgproto3.Parse{}
		case 'B':
			m = &pgproto3.Bind{}
		case 'D':
			m = &pgproto3.Describe{}
		case 'E':
			m = &pgproto3.Execute{}
		case 'S':
			m = &pgproto3.Sync{}
		case 'H':
			m = &pgproto3.Flush{}
		case 'Q':
			m = &pgproto3.Query{}
		case 'C':
			m = &pgproto3.Close{}
		case 'X':
			m = &pgproto3.Terminate{}
		case 'd':
			m = &pgproto3.CopyData{}
		case 'c':
			m = &pgproto3.CopyDone{}
		case 'f':
			m = &pgproto3.CopyFail{}
		case 'F':
			m = &pgproto3.FunctionCall{}
		}
		if m == nil || m.Decode(body) != nil {
			m = &Unknown{Type: t, Body: body}
		}
		if p, ok := m.(*pgproto3.Parse); ok {
			stmts[p.Name] = p.Query
		}
		msgs = append(msgs, m)
	}
	return msgs, stmts
}

// Unknown is a frontend message pgfake does not decode (or could not): its
// type byte and body.
type Unknown struct {
	Type byte
	Body []byte
}

// Frontend marks Unknown as a frontend message.
func (*Unknown) Frontend() {}

// Decode implements pgproto3.Message.
func (u *Unknown) Decode(src []byte) error {
	u.Body = append(u.Body[:0], src...)
	return nil
}

// Encode implements pgproto3.Message.
func (u *Unknown) Encode(dst []byte) ([]byte, error) {
	dst = append(dst, u.Type)
	dst = binary.BigEndian.AppendUint32(dst, uint32(4+len(u.Body)))
	return append(dst, u.Body...), nil
}

func encode(dst []byte, m pgproto3.Message) []byte {
	out, err := m.Encode(dst)
	if err != nil {
		panic(fmt.Sprintf("pgfake: encoding %T: %v", m, err))
	}
	return out
}

// Encode returns the wire bytes of msgs, back to back: for comparing a
// Batch's Raw bytes with what a client is expected to send.
func Encode(msgs ...pgproto3.Message) []byte {
	var b []byte
	for _, m := range msgs {
		b = encode(b, m)
	}
	return b
}

// Query is one statement Conn.Answer asks a Responder about.
type Query struct {
	SQL string
	// Name is the prepared statement's name for the extended protocol ("" for
	// the unnamed statement and for a simple Query).
	Name string
	// Simple is set for a simple-protocol Query message.
	Simple bool
	// Describe is set when the statement is only being described (Describe
	// of a statement or portal): the Responder's Params, Cols and Err are
	// used, not its rows or tag. An error a statement raises only when it
	// runs is returned for !Describe alone.
	Describe bool
	// Params are the bound parameter values as sent (nil entries are NULL);
	// FormatCodes are the Bind's parameter format codes.
	Params      [][]byte
	FormatCodes []int16
	// Function is the OID a fast-path FunctionCall message calls (SQL is
	// empty then; Params are its arguments): the Responder's first value of
	// its first row is the result, or its Err the error.
	Function uint32
}

// Column is a result column.
type Column struct {
	Name string
	OID  uint32 // type OID: 25 text, 23 int4, 20 int8, 16 bool, 3220 pg_lsn
}

// Result is a Responder's answer to one statement.
type Result struct {
	// Params are the parameter type OIDs reported when the statement is
	// described (ParameterDescription).
	Params []uint32
	// Cols describe the result rows; nil means the statement returns none
	// (NoData).
	Cols []Column
	// Rows are sent as DataRows, values as given (nil is NULL). The client
	// chose each column's format in its Bind (Query.FormatCodes is the
	// parameters'); text-format types such as 25 keep it simple.
	Rows [][][]byte
	// Tag is the CommandComplete tag; "SELECT <rows>" when empty and Cols is
	// set, "OK" otherwise. "BEGIN" moves Conn.TxStatus to 'T', "COMMIT" and
	// "ROLLBACK" to 'I'.
	Tag string
	// Err, when set, is sent instead of the description or of rows and tag
	// (and the rest of an extended-protocol batch is skipped up to its
	// Sync).
	Err *pgproto3.ErrorResponse
}

// Row builds one row of text values.
func Row(vals ...string) [][]byte {
	r := make([][]byte, len(vals))
	for i, v := range vals {
		r[i] = []byte(v)
	}
	return r
}

// Error builds an ErrorResponse with severity ERROR.
func Error(code, msg string) *pgproto3.ErrorResponse {
	return &pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: code, Message: msg}
}

// Responder answers one statement for Conn.Answer.
type Responder func(q Query) Result

// unscripted is the Responder Answer uses when given none.
func unscripted(q Query) Result {
	return Result{Err: Error("XX000", "pgfake: unscripted statement: "+q.SQL)}
}

// Answer answers a batch as a server would, asking f about each statement
// (a nil f fails each one): ParseComplete for Parse, BindComplete for Bind
// (an ErrorResponse 26000 for an unknown statement), ParameterDescription
// and RowDescription or NoData for Describe, DataRows and CommandComplete
// for Execute, ReadyForQuery with the transaction status for Sync; a Query
// gets RowDescription, DataRows and CommandComplete (EmptyQueryResponse for
// an empty or comment-only text, as pgx's "-- ping") and ReadyForQuery.
// After an error, extended-protocol messages are skipped up to the next
// Sync; an error inside a block makes the status 'E'. Close gets
// CloseComplete (and forgets a statement), Flush and Terminate nothing.
// The portal is the unnamed one, reset by each Sync.
func (c *Conn) Answer(b Batch, f Responder) []pgproto3.BackendMessage {
	if f == nil {
		f = unscripted
	}
	var out []pgproto3.BackendMessage
	skip := false
	fail := func(e *pgproto3.ErrorResponse) {
		out = append(out, e)
		c.mu.Lock()
		if c.tx != 'I' {
			c.tx = 'E'
		}
		c.mu.Unlock()
	}
	for _, m := range b.Msgs {
		if _, ok := m.(*pgproto3.Sync); !ok && skip {
			continue
		}
		switch m := m.(type) {
		case *pgproto3.Parse:
			c.mu.Lock()
			c.stmts[m.Name] = m.Query
			c.mu.Unlock()
			out = append(out, &pgproto3.ParseComplete{})
		case *pgproto3.Bind:
			if _, ok := c.prepared(m.PreparedStatement); !ok {
				fail(Error("26000", fmt.Sprintf("prepared statement %q does not exist", m.PreparedStatement)))
				skip = true
				continue
			}
			c.mu.Lock()
			c.portal = portal{ok: true, stmt: m.PreparedStatement, params: m.Parameters, formats: m.ParameterFormatCodes}
			c.mu.Unlock()
			out = append(out, &pgproto3.BindComplete{})
		case *pgproto3.Describe:
			var q Query
			if m.ObjectType == 'S' {
				sql, ok := c.prepared(m.Name)
				if !ok {
					fail(Error("26000", fmt.Sprintf("prepared statement %q does not exist", m.Name)))
					skip = true
					continue
				}
				q = Query{SQL: sql, Name: m.Name, Describe: true}
			} else {
				var ok bool
				if q, ok = c.portalQuery(); !ok {
					fail(errNoPortal)
					skip = true
					continue
				}
				q.Describe = true
			}
			r := f(q)
			if r.Err != nil {
				fail(r.Err)
				skip = true
				continue
			}
			if m.ObjectType == 'S' {
				out = append(out, &pgproto3.ParameterDescription{ParameterOIDs: r.Params})
			}
			out = append(out, rowDescription(r.Cols))
		case *pgproto3.Execute:
			q, ok := c.portalQuery()
			if !ok {
				fail(errNoPortal)
				skip = true
				continue
			}
			r := f(q)
			if r.Err != nil {
				fail(r.Err)
				skip = true
				continue
			}
			out = c.appendRows(out, r, false)
		case *pgproto3.Sync:
			skip = false
			c.mu.Lock()
			c.portal = portal{}
			c.mu.Unlock()
			out = append(out, c.readyForQuery())
		case *pgproto3.Query:
			if emptyQuery(m.String) {
				out = append(out, &pgproto3.EmptyQueryResponse{})
			} else if r := f(Query{SQL: m.String, Simple: true}); r.Err != nil {
				fail(r.Err)
			} else {
				out = c.appendRows(out, r, true)
			}
			out = append(out, c.readyForQuery())
		case *pgproto3.FunctionCall:
			codes := make([]int16, len(m.ArgFormatCodes))
			for i, c := range m.ArgFormatCodes {
				codes[i] = int16(c)
			}
			r := f(Query{Function: m.Function, Params: m.Arguments, FormatCodes: codes})
			if r.Err != nil {
				fail(r.Err)
			} else {
				var v []byte
				if len(r.Rows) > 0 && len(r.Rows[0]) > 0 {
					v = r.Rows[0][0]
				}
				out = append(out, &pgproto3.FunctionCallResponse{Result: v})
			}
			out = append(out, c.readyForQuery())
		case *pgproto3.Close:
			if m.ObjectType == 'S' {
				c.Deallocate(m.Name)
			}
			out = append(out, &pgproto3.CloseComplete{})
		}
	}
	return out
}

// readyForQuery ends an answer, with the connection's transaction status.
func (c *Conn) readyForQuery() *pgproto3.ReadyForQuery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return &pgproto3.ReadyForQuery{TxStatus: c.tx}
}

// appendRows appends a result: its RowDescription when simple (the extended
// protocol sends one only for a Describe), DataRows and CommandComplete, and
// applies the tag to the transaction status.
func (c *Conn) appendRows(out []pgproto3.BackendMessage, r Result, simple bool) []pgproto3.BackendMessage {
	if simple && r.Cols != nil {
		out = append(out, rowDescription(r.Cols))
	}
	for _, row := range r.Rows {
		out = append(out, &pgproto3.DataRow{Values: row})
	}
	tag := r.Tag
	if tag == "" {
		if r.Cols != nil {
			tag = fmt.Sprintf("SELECT %d", len(r.Rows))
		} else {
			tag = "OK"
		}
	}
	c.mu.Lock()
	switch {
	case strings.HasPrefix(tag, "BEGIN") || strings.HasPrefix(tag, "START TRANSACTION"):
		if c.tx == 'I' {
			c.tx = 'T'
		}
	case strings.HasPrefix(tag, "COMMIT") || strings.HasPrefix(tag, "ROLLBACK"):
		c.tx = 'I'
	}
	c.mu.Unlock()
	return append(out, &pgproto3.CommandComplete{CommandTag: []byte(tag)})
}

func rowDescription(cols []Column) pgproto3.BackendMessage {
	if cols == nil {
		return &pgproto3.NoData{}
	}
	rd := &pgproto3.RowDescription{}
	for _, col := range cols {
		size := int16(-1)
		switch col.OID {
		case 16:
			size = 1
		case 23:
			size = 4
		case 20, 3220:
			size = 8
		}
		rd.Fields = append(rd.Fields, pgproto3.FieldDescription{Name: []byte(col.Name), DataTypeOID: col.OID, DataTypeSize: size, TypeModifier: -1})
	}
	return rd
}

// emptyQuery reports a query text with nothing but blanks, semicolons and
// line comments.
func emptyQuery(q string) bool {
	for _, line := range strings.Split(q, "\n") {
		line = strings.TrimSpace(line)
		if i := strings.Index(line, "--"); i >= 0 {
			line = line[:i]
		}
		if strings.Trim(line, " \t\r;") != "" {
			return false
		}
	}
	return true
}

// Summary describes a batch's messages compactly, one string per message,
// for asserting what one flush carried: "Parse <name>", "Bind <name>",
// "Describe S <name>" or "Describe P", "Execute", "Sync", "Query <text>",
// "Close S <name>", "Flush", "Terminate", "FunctionCall <oid>", or the
// message's Go type. label turns a prepared statement's name into what the
// summary shows (nil shows names as they are; see Conn.Label).
func Summary(b Batch, label func(name string) string) []string {
	if label == nil {
		label = func(name string) string { return name }
	}
	var s []string
	for _, m := range b.Msgs {
		switch m := m.(type) {
		case *pgproto3.Parse:
			s = append(s, "Parse "+label(m.Name))
		case *pgproto3.Bind:
			s = append(s, "Bind "+label(m.PreparedStatement))
		case *pgproto3.Describe:
			if m.ObjectType == 'S' {
				s = append(s, "Describe S "+label(m.Name))
			} else {
				s = append(s, "Describe P")
			}
		case *pgproto3.Execute:
			s = append(s, "Execute")
		case *pgproto3.Sync:
			s = append(s, "Sync")
		case *pgproto3.Query:
			s = append(s, "Query "+m.String)
		case *pgproto3.Close:
			s = append(s, fmt.Sprintf("Close %c %s", m.ObjectType, label(m.Name)))
		case *pgproto3.Flush:
			s = append(s, "Flush")
		case *pgproto3.Terminate:
			s = append(s, "Terminate")
		case *pgproto3.FunctionCall:
			s = append(s, fmt.Sprintf("FunctionCall %d", m.Function))
		default:
			s = append(s, fmt.Sprintf("%T", m))
		}
	}
	return s
}

// Label shows a prepared statement name as the summary of c's batches
// should: names that start with keep stay as they are (pgryw_capture), and
// others become the SQL text they were prepared with (pgx names statements
// after a hash of it), or stay as they are when unknown.
func (c *Conn) Label(keep string) func(name string) string {
	return func(name string) string {
		if keep != "" && strings.HasPrefix(name, keep) {
			return name
		}
		if q, ok := c.StatementSQL(name); ok {
			return q
		}
		return name
	}
}

// errNoPortal is the server's answer to Describe or Execute without a Bind.
var errNoPortal = Error("34000", "portal \"\" does not exist")

// portalQuery returns the unnamed portal (the last Bind) as a Query, and
// false when there is none.
func (c *Conn) portalQuery() (Query, bool) {
	c.mu.Lock()
	p := c.portal
	c.mu.Unlock()
	if !p.ok {
		return Query{}, false
	}
	sql, _ := c.prepared(p.stmt)
	return Query{SQL: sql, Name: p.stmt, Params: p.params, FormatCodes: p.formats}, true
}
