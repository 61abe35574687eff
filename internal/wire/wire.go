// Package wire lets pgryw put its own statements on a pgx connection's wire
// in the same network flush as the application's, and take their answers off
// again before pgx sees them.
//
// Conn sits between pgconn and the socket (pgconn.Config.AfterNetConnect, so
// above TLS). An Injection is one simple-protocol Query message (or
// prebuilt messages ending in a Sync, or a fast-path FunctionCall, or,
// chained in front of pgx's extended-protocol messages, an unnamed
// Parse/Bind/Execute, or prebuilt messages less their Sync). Prefix sends
// it in front of pgx's next write (a replica's catch-up check ahead of a
// read); AppendAfterExec sends it behind pgx's next write that executes a
// statement (the writer's WAL position after the statement's Sync, so after
// its implicit commit). Either way it costs no extra round trip. On the read
// side Conn follows the server's message framing and removes the injected
// query's synchronous responses (RowDescription, DataRow, CommandComplete,
// ErrorResponse, ReadyForQuery), keeping asynchronous ones (ParameterStatus,
// NoticeResponse, NotificationResponse) for pgx; every ReadyForQuery the
// server sends belongs to exactly one Query or Sync, which is what lets Conn
// tell whose answer is whose.
package wire

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// Injection is one of pgryw's statements and, once Done, its answer. It is
// sent as a simple-protocol Query of SQL, or, when Msgs is set, as those
// frontend messages verbatim, which must end in exactly one Sync (an
// extended-protocol Bind/Execute/Sync of a statement prepared once per
// connection skips the parse and plan a Query costs every time) or be one
// FunctionCall (the fast path: a function called with no statement at all;
// its FunctionCallResponse's value is the Row).
type Injection struct {
	SQL  string
	Msgs []byte
	// Chain lets a prefix be sent without a Sync of its own, when pgx's
	// write right behind it starts with an extended-protocol message: SQL
	// as an unnamed Parse/Bind/Execute, Msgs (not a FunctionCall) less
	// their Sync. Its answer then comes in the same server flush as pgx's,
	// whose Sync ends the implicit transaction both run in. An error of
	// the injection's makes the server skip pgx's messages up to their
	// Sync: pgx is then given the ErrorResponse as its own.
	Chain bool
	// MustChain: sent only chained in front of a write of pgx's that
	// executes its statement in the extended protocol, so that both run in
	// one implicit transaction, which a transaction pooler keeps on one
	// server connection. A write that only prepares (Parse, Describe,
	// Sync) passes it on to the next; a simple-protocol one refuses it:
	// it is not sent (Sent stays false) and Refused says so. A segment of
	// its own would be answered on another server connection than pgx's
	// statement, or reach another client.
	MustChain bool

	chained bool
	refused bool // MustChain, and pgx's write could not take it // it went out so (set when sent)

	sent     bool
	withExec bool  // chained in front of pgx's execution of a statement
	sentAt   int64 // when, by time.Now().UnixNano(), just before the write
	dropped  bool  // disarmed before it was sent
	done     bool
	row      []string // first DataRow, text format; nil entries are NULL
	null     []bool
	err      *pgconn.PgError

	// mu is the lock of the Conn it was armed on: its answer is filled in
	// by whichever goroutine reads the socket (pgx's, or an Await on
	// another's behalf), so the accessors take it.
	mu *sync.Mutex
}

// lock and unlock take the Conn's lock, if in was armed on one. (Not a
// returned closure: a method value of in.mu allocates on every call, and
// these run several times per statement.)
func (in *Injection) lock() {
	if in.mu != nil {
		in.mu.Lock()
	}
}

func (in *Injection) unlock() {
	if in.mu != nil {
		in.mu.Unlock()
	}
}

// Sent reports whether the statement went out on the wire.
func (in *Injection) Sent() bool {
	in.lock()
	defer in.unlock()
	return in.sent
}

// SentAt returns when the statement went out (time.Now().UnixNano(), read
// just before the write), 0 if it did not: the server ran it no earlier.
func (in *Injection) SentAt() int64 {
	in.lock()
	defer in.unlock()
	return in.sentAt
}

// Dropped reports that in was disarmed (Disarm, or pgx's bytes did not
// parse) before it was sent: it never reached the server.
func (in *Injection) Dropped() bool {
	in.lock()
	defer in.unlock()
	return in.dropped
}

// Done reports whether its whole answer has arrived.
func (in *Injection) Done() bool {
	in.lock()
	defer in.unlock()
	return in.done
}

// Row returns the first row's values as text and which were NULL.
func (in *Injection) Row() ([]string, []bool) {
	in.lock()
	defer in.unlock()
	return in.row, in.null
}

// Err returns the server's error for the statement, if any.
func (in *Injection) Err() error {
	in.lock()
	defer in.unlock()
	if in.err != nil {
		return in.err
	}
	return nil
}

// Refused reports that in was MustChain and pgx's write could not take it
// chained.
func (in *Injection) Refused() bool {
	in.lock()
	defer in.unlock()
	return in.refused
}

// FunctionCall reports that in is a fast-path FunctionCall message, whose
// result is its Row's one value.
func (in *Injection) FunctionCall() bool { return len(in.Msgs) > 0 && in.Msgs[0] == 'F' }

// Reset readies in for reuse with a new SQL text.
func (in *Injection) Reset(sql string) {
	*in = Injection{SQL: sql, row: in.row[:0], null: in.null[:0], mu: in.mu}
}

// ResetMessages readies in for reuse with prebuilt frontend messages.
func (in *Injection) ResetMessages(msgs []byte) {
	*in = Injection{Msgs: msgs, row: in.row[:0], null: in.null[:0], mu: in.mu}
}

// SharesTx reports that in went out chained (Chain) in front of pgx's
// execution of a statement, so ran in that statement's implicit
// transaction. (Chained in front of a write of pgx's that only prepares,
// it ran in that one's, and pgx's statement runs in a later transaction.)
func (in *Injection) SharesTx() bool {
	in.lock()
	defer in.unlock()
	return in.sent && in.withExec
}

// parsesUnnamed reports whether in, chained, would Parse into the unnamed
// statement: SQL (appendChained), or messages that start with such a Parse.
func (in *Injection) parsesUnnamed() bool {
	if in.Msgs == nil {
		return true
	}
	return len(in.Msgs) > 5 && in.Msgs[0] == 'P' && in.Msgs[5] == 0
}

// bindsUnnamed reports whether pgx's write b starts with a Bind of the
// unnamed statement (its name is the second string of the message, after
// the portal's).
func bindsUnnamed(b []byte) bool {
	if len(b) < 6 || b[0] != 'B' {
		return false
	}
	i := 5
	for i < len(b) && b[i] != 0 { // the portal's name
		i++
	}
	return i+1 < len(b) && b[i+1] == 0
}

// chainable reports whether in can go without a Sync of its own: SQL, or
// prebuilt messages ending in their one Sync (not a FunctionCall).
func (in *Injection) chainable() bool {
	if in.Msgs == nil {
		return true
	}
	n := len(in.Msgs)
	return in.Msgs[0] != 'F' && n >= 5 && string(in.Msgs[n-5:]) == "S\x00\x00\x00\x04"
}

func (in *Injection) appendTo(buf []byte) []byte {
	if in.Msgs != nil {
		if in.chained {
			return append(buf, in.Msgs[:len(in.Msgs)-5]...) // less the Sync
		}
		return append(buf, in.Msgs...)
	}
	if in.chained {
		return appendChained(buf, in.SQL)
	}
	return appendQuery(buf, in.SQL)
}

// segment is the server's answer to one Query or Sync, ending with its
// ReadyForQuery; strip marks pgryw's own. A chained injection's segment
// ends with its CommandComplete or ErrorResponse instead.
type segment struct {
	strip bool
	inj   *Injection
}

// Peer is what the opener of a connection learned of what it reached, set
// while the connection is being opened (before any other use) and only
// read after.
type Peer struct {
	// TxPooled: a pooler in between may give the connection's statements
	// another server connection at the end of every transaction.
	TxPooled bool
	// Unnamed: pgryw's statements must not rely on statements prepared
	// in an earlier flush (a pooler in between, in any mode).
	Unnamed bool
	// Instance names the server instance the connection reached (0:
	// unknown, or not one instance for the connection's lifetime).
	Instance uint64
	// Auto: what is known came from asking the server (pooler=auto), and
	// evidence of a pooler later may change it.
	Auto bool
}

// Conn wraps one server connection; see the package documentation.
type Conn struct {
	net.Conn

	// Peer: see the type.
	Peer Peer

	mu           sync.Mutex
	prefix       []*Injection // in the order they go out
	suffix       []*Injection
	queue        []segment  // answers still to come, in order; empty: pass all
	qbuf         [4]segment // queue's usual backing array (popping from the front shrinks its capacity)
	pending      []byte     // pass-through bytes read by Await, for pgx's next Read
	wbuf         []byte
	sent         atomic.Uint64 // bytes of the caller's that went out
	notices      uint64        // NoticeResponses passed to pgx
	statuses     atomic.Uint64 // ParameterStatus messages passed to pgx
	reading      bool          // a Read or Await is on the socket
	readDeadline time.Time     // pgx's read deadline, restored after an Await
	waiter       chan struct{} // closed when that read returns, if someone waits
	gaveUp       bool          // a Drain gave up: the connection is being closed with answers due

	// Read-side framing state.
	hdr      [5]byte
	hdrN     int
	left     int
	curStrip bool // the message is pgryw's: pgx does not see it
	curKeep  bool // its body is kept for the injection's answer
	curWatch bool // it is pgx's, and watched (an ErrorResponse or a ReadyForQuery)
	curErr   bool // an ErrorResponse: its body is kept for its SQLSTATE
	curIndex uint64
	body     []byte

	// answers counts the server's messages read that answer something
	// (all but the asynchronous ones), pgx's and pgryw's; answersAtWrite
	// is the count when pgx last wrote (but for its Terminate). idleEnd
	// is 1 + the count before the ErrorResponse with which the server
	// ended the session for idleness (SQLSTATE 57P05), 0 before one came:
	// see EndedIdle.
	answers        uint64
	answersAtWrite uint64
	idleEnd        uint64
	abuf           []byte

	// Watch's state: pgx's Syncs sent and ReadyForQuery messages passed
	// since, and the first ErrorResponse passed.
	watch       bool
	watchSyncs  int
	watchReady  int
	watchErr    *pgconn.PgError
	watchPassed int // pgx's bytes kept for it by Peek

	// Record's state: the statements pgx sent since, and whether it sent
	// something whose text was not seen; recNames are the named
	// statements whose Parse a recording saw, kept across recordings.
	rec        bool
	recTexts   []string
	recUnknown bool
	recUnnamed bool // an unnamed Parse was seen in this recording
	recNames   map[string]string
}

// Wrap wraps c.
func Wrap(c net.Conn) *Conn {
	w := &Conn{Conn: c}
	w.queue = w.qbuf[:0]
	return w
}

// Prefix arms in to be sent ahead of pgx's next write, after any injection
// armed before it.
func (c *Conn) Prefix(in *Injection) {
	in.mu = &c.mu
	c.mu.Lock()
	c.prefix = append(c.prefix, in)
	c.mu.Unlock()
}

// AppendAfterExec arms in to be sent behind pgx's next write that contains
// an Execute or a Query message, after any injection armed before it.
func (c *Conn) AppendAfterExec(in *Injection) {
	in.mu = &c.mu
	c.mu.Lock()
	c.suffix = append(c.suffix, in)
	c.mu.Unlock()
}

// Send sends in on its own, at once, on a connection pgx is not using: pgx
// has read every answer it waited for and writes nothing until Send
// returns. in's answer is then taken off the wire as a ride-along's is, by
// pgx's next read or by Await. Behind a transaction pooler it is not sent
// (Refused reports it): a segment of its own may reach another server
// connection. A write error is returned as is; the connection is then
// unusable.
func (c *Conn) Send(in *Injection) error {
	in.mu = &c.mu
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.Peer.TxPooled {
		in.refused = true
		return errSendPooled
	}
	c.wbuf = in.appendTo(c.wbuf[:0])
	in.sent, in.sentAt = true, time.Now().UnixNano()
	c.queue = append(c.queue, segment{strip: true, inj: in})
	_, err := c.Conn.Write(c.wbuf)
	return err
}

var errSendPooled = errors.New("wire: nothing of pgryw's goes on its own behind a transaction pooler")

// Disarm drops injections that were armed but not sent (pgx failed before
// writing, or wrote nothing that executes).
func (c *Conn) Disarm() {
	c.mu.Lock()
	c.disarm()
	c.mu.Unlock()
}

func (c *Conn) disarm() {
	for _, in := range c.prefix {
		in.dropped = true
	}
	for _, in := range c.suffix {
		in.dropped = true
	}
	clear(c.prefix)
	clear(c.suffix)
	c.prefix, c.suffix = c.prefix[:0], c.suffix[:0]
}

// ErrFraming reports bytes from pgx that do not parse as protocol messages;
// Conn then injects nothing.
var ErrFraming = errors.New("wire: unexpected frontend message framing")

// Write implements net.Conn. pgx's Terminate goes out once nothing of
// pgryw's is due on the connection (Drain), or DrainWait has passed.
func (c *Conn) Write(b []byte) (int, error) {
	terminate := len(b) == 5 && b[0] == 'X'
	if terminate {
		c.Drain(time.Now().Add(DrainWait))
	}
	buf, lead := b, 0
	c.mu.Lock()
	if !terminate {
		c.answersAtWrite = c.answers
	}
	if len(c.prefix) > 0 || len(c.suffix) > 0 || len(c.queue) > 0 {
		buf, lead = c.splice(b)
	}
	if c.watch {
		syncs, _, _, _ := scanFrontend(b)
		c.watchSyncs += syncs
	}
	if c.rec {
		c.record(b)
	}
	c.mu.Unlock()
	n, err := c.Conn.Write(buf)
	n = callerBytes(n, lead, len(b))
	c.countSent(n)
	return n, err
}

// splice returns what goes on the wire for pgx's write b: b with the armed
// injections around it, and how many bytes of ours lead. It records the
// answers to expect. Call it with c.mu held.
func (c *Conn) splice(b []byte) (buf []byte, lead int) {
	syncs, simple, exec, ok := scanFrontend(b)
	if !ok {
		c.disarm()
		return b, 0
	}
	buf = c.wbuf[:0]
	var now int64 // read once, when something of ours goes out
	sent := func(in *Injection) {
		if now == 0 {
			now = time.Now().UnixNano()
		}
		in.sent, in.sentAt = true, now
	}
	extended := len(b) > 0 && (b[0] == 'P' || b[0] == 'B') && syncs > 0 && !simple
	// pgx binding the unnamed statement it parsed in an earlier flush
	// (describe_exec): an unnamed Parse of ours in front would take its
	// place.
	unnamedBind := len(c.prefix) > 0 && bindsUnnamed(b)
	var keep []*Injection
	for i, in := range c.prefix {
		in.chained = in.Chain && in.chainable() && extended && i == len(c.prefix)-1 && !(unnamedBind && in.parsesUnnamed())
		in.withExec = in.chained && exec
		if c.Peer.TxPooled && !in.MustChain {
			// A segment of its own behind a transaction pooler: never.
			in.refused = true
			continue
		}
		if in.MustChain && !(in.chained && exec) {
			in.chained = false
			if extended && !exec {
				keep = append(keep, in) // pgx prepares first: ride with its execution
			} else {
				in.refused = true
			}
			continue
		}
		buf = in.appendTo(buf)
		sent(in)
		c.queue = append(c.queue, segment{strip: true, inj: in})
	}
	lead = len(buf)
	buf = append(buf, b...)
	for i := 0; i < syncs; i++ {
		c.queue = append(c.queue, segment{})
	}
	if exec && c.Peer.TxPooled {
		// Behind a transaction pooler nothing rides behind a statement:
		// its ReadyForQuery may end the transaction.
		for _, in := range c.suffix {
			in.refused = true
		}
		clear(c.suffix)
		c.suffix = c.suffix[:0]
	}
	if exec {
		for _, in := range c.suffix {
			buf = in.appendTo(buf)
			sent(in)
			c.queue = append(c.queue, segment{strip: true, inj: in})
		}
		clear(c.suffix)
		c.suffix = c.suffix[:0]
	}
	clear(c.prefix)
	c.prefix = append(c.prefix[:0], keep...)
	c.trimQueue()
	c.wbuf = buf
	return buf, lead
}

func (c *Conn) countSent(n int) {
	c.sent.Add(uint64(n))
}

// Notices counts the NoticeResponse messages (warnings included) passed on
// to pgx: a caller that expects a server to signal something with a
// warning reads the count before and after a statement.
func (c *Conn) Notices() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.notices
}

// Statuses counts the ParameterStatus messages passed on to pgx (which
// applies each when it reads it, possibly after the read that counted it
// has returned). It may be called from any goroutine.
func (c *Conn) Statuses() uint64 { return c.statuses.Load() }

// Sent counts the bytes of the caller's (pgx's) that have gone out on the
// socket. A statement that failed with an error pgx calls safe to retry
// (pgx v5.12 says so of a read that failed after the statement was sent)
// did reach the server if Sent moved while it ran.
func (c *Conn) Sent() uint64 {
	return c.sent.Load()
}

// callerBytes turns a write of n bytes of our buffer (lead bytes of
// ours, then the caller's m bytes, then perhaps more of ours) into the count
// the caller is told. pgx treats a failed write of 0 bytes as safe to retry,
// and database/sql then runs the statement again on another connection, so 0
// is reported only when provably none of the caller's bytes left; once any
// did, at least 1 is reported, even if the server may have seen only part of
// a message.
func callerBytes(n, lead, m int) int {
	switch {
	case n <= lead:
		return 0
	case n-lead >= m:
		return m
	}
	return n - lead
}

// trimQueue drops trailing pass segments: with nothing of ours after them,
// passing everything is the same.
func (c *Conn) trimQueue() {
	n := len(c.queue)
	for n > 0 && !c.queue[n-1].strip {
		n--
	}
	c.queue = c.queue[:n]
	if n == 0 {
		c.queue = c.qbuf[:0]
	}
}

// popQueue drops the segment whose answer is complete. An emptied queue
// goes back to its own array: each statement's segments would otherwise
// take a new one.
func (c *Conn) popQueue() {
	c.queue[0] = segment{}
	c.queue = c.queue[1:]
	if len(c.queue) == 0 {
		c.queue = c.qbuf[:0]
	}
}

// scanFrontend walks pgx's messages: how many end in a ReadyForQuery (Sync,
// Query, FunctionCall), whether any is a Query or FunctionCall (simple: a
// chained injection would share its transaction), and whether any executes
// a statement.
func scanFrontend(b []byte) (syncs int, simple, exec, ok bool) {
	for i := 0; i < len(b); {
		if len(b)-i < 5 {
			return 0, false, false, false
		}
		t := b[i]
		n32 := binary.BigEndian.Uint32(b[i+1 : i+5])
		if n32 < 4 || uint64(n32) > uint64(len(b)-i-1) {
			return 0, false, false, false
		}
		n := int(n32) // fits: at most len(b)
		switch t {
		case 'S':
			syncs++
		case 'F':
			syncs++
			simple = true
		case 'Q':
			syncs++
			simple, exec = true, true
		case 'E':
			exec = true
		}
		i += 1 + n
	}
	return syncs, simple, exec, true
}

// appendChained appends sql as an unnamed Parse, Bind and Execute, with no
// Sync: text results, no parameters.
func appendChained(buf []byte, sql string) []byte {
	buf = append(buf, 'P')
	buf = binary.BigEndian.AppendUint32(buf, uint32(4+1+len(sql)+1+2))
	buf = append(buf, 0) // unnamed statement
	buf = append(buf, sql...)
	buf = append(buf, 0, 0, 0) // no parameter types
	buf = append(buf, 'B')
	buf = binary.BigEndian.AppendUint32(buf, 4+1+1+2+2+2)
	buf = append(buf, 0, 0)       // unnamed portal, unnamed statement
	buf = append(buf, 0, 0, 0, 0) // no parameter formats, no parameters
	buf = append(buf, 0, 0)       // results in text
	buf = append(buf, 'E')
	buf = binary.BigEndian.AppendUint32(buf, 4+1+4)
	return append(buf, 0, 0, 0, 0, 0) // unnamed portal, all rows
}

func appendQuery(buf []byte, sql string) []byte {
	buf = append(buf, 'Q')
	buf = binary.BigEndian.AppendUint32(buf, uint32(4+len(sql)+1))
	buf = append(buf, sql...)
	return append(buf, 0)
}

// LastWords returns the type of the first message in p (bytes peeked from
// the socket, not yet read) that is not part of an answer the Conn still
// expects: a ride-along's answer that nobody has read yet comes first on an
// idle connection (a write returns at its own ReadyForQuery, its capture's
// answer is read later), and a server that ended the session meanwhile
// sent its last words after it. It reports false when p ends first, or
// when the Conn's own framing is not at a message boundary.
func (c *Conn) LastWords(p []byte) (byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.hdrN != 0 || c.left != 0 {
		return 0, false
	}
	expect := 0
	for _, s := range c.queue {
		if s.strip && s.inj.chained {
			return 0, false // ends at a CommandComplete, not a ReadyForQuery
		}
		expect++
	}
	i := 0
	for ; expect > 0; expect-- {
		for {
			if len(p)-i < 5 {
				return 0, false
			}
			t := p[i]
			l := uint64(binary.BigEndian.Uint32(p[i+1 : i+5]))
			if l < 4 || l > uint64(len(p)-i-1) {
				return 0, false
			}
			i += 1 + int(l)
			if t == 'Z' {
				break
			}
		}
	}
	if i >= len(p) {
		return 0, false
	}
	return p[i], true
}

// PendingByte returns the first byte Await read from the socket and kept
// for pgx's next Read, if any: on an idle connection, the start of
// whatever the server sent unasked.
func (c *Conn) PendingByte() (byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) == 0 {
		return 0, false
	}
	return c.pending[0], true
}

// Read implements net.Conn, removing pgryw's answers from what pgx reads.
// While an Await (from another goroutine: a connection whose ride-along
// answer another session needs) is on the socket, Read waits for it, within
// pgx's read deadline, and then returns what it kept for pgx first.
func (c *Conn) Read(p []byte) (int, error) {
	c.mu.Lock()
	for c.reading && len(c.pending) == 0 {
		if c.waiter == nil {
			c.waiter = make(chan struct{})
		}
		w, dl := c.waiter, c.readDeadline
		c.mu.Unlock()
		if err := waitFor(w, dl); err != nil {
			return 0, err
		}
		c.mu.Lock()
	}
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		c.mu.Unlock()
		return n, nil
	}
	c.reading = true
	c.mu.Unlock()
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	m := c.readReturned(p[:n])
	c.mu.Unlock()
	// When everything read was pgryw's, this returns 0, nil rather than
	// reading again: pgx's readers loop on it, and pgx's background reader
	// (started while a slow write is in flight) gets to see that it was
	// asked to stop, instead of blocking on the socket and keeping Await
	// from reading the rest of pgryw's answer.
	return m, err
}

// readReturned ends a read on the socket (Read's or Await's): it filters
// the bytes read in place, returning how many are pgx's, and wakes an Await
// waiting for the socket. Call it with c.mu held.
func (c *Conn) readReturned(b []byte) int {
	m := c.filter(b)
	c.reading = false
	if c.waiter != nil {
		close(c.waiter)
		c.waiter = nil
	}
	return m
}

func isAsync(t byte) bool { return t == 'S' || t == 'N' || t == 'A' }

// filter compacts p in place to the bytes pgx should see and returns their
// count. It keeps the framing state across calls, so messages may be split
// anywhere.
func (c *Conn) filter(p []byte) int {
	w := 0
	for i := 0; i < len(p); {
		if c.hdrN == 0 && len(c.queue) == 0 && w == i && !c.watch {
			// Nothing of pgryw's is due: whole messages pass as they
			// are, header and body, with nothing to copy or keep. The
			// usual case, every answer of a connection with nothing
			// riding along; the loop below takes a message split
			// across reads, and the rest once something is due.
			if n := c.wholeMessages(p[i:]); n > 0 {
				i += n
				w = i
				continue
			}
		}
		if c.hdrN < 5 {
			b := p[i]
			if c.hdrN == 0 {
				ours := len(c.queue) > 0 && c.queue[0].strip
				// A chained injection's error makes the server skip
				// pgx's messages up to their Sync, answered with a bare
				// ReadyForQuery: pgx is given the error too, as its own.
				chainErr := ours && b == 'E' && c.queue[0].inj.chained
				c.curStrip = ours && !isAsync(b) && !chainErr
				c.curKeep = c.curStrip || chainErr
				c.curWatch = c.watch && !c.curStrip && (b == 'E' || b == 'Z')
				c.curErr = b == 'E'
				c.curIndex = c.answers
				if !isAsync(b) {
					c.answers++
				}
				if !c.curStrip {
					c.countPassed(b)
				}
			}
			c.hdr[c.hdrN] = b
			c.hdrN++
			i++
			if !c.curStrip {
				p[w] = b
				w++
			}
			if c.hdrN == 5 {
				// In uint64: a length of 2^31 or more is negative as a
				// 32-bit int (pgx refuses such messages anyway).
				l := uint64(binary.BigEndian.Uint32(c.hdr[1:5]))
				c.left = int(min(max(l, 4)-4, math.MaxInt32))
				c.body = c.body[:0]
				if c.left <= 0 {
					c.left = 0
					c.endMessage()
				}
			}
			continue
		}
		k := min(c.left, len(p)-i)
		if c.curKeep || c.curWatch || c.curErr {
			c.body = append(c.body, p[i:i+k]...)
		}
		if !c.curStrip {
			copy(p[w:], p[i:i+k])
			w += k
		}
		i += k
		c.left -= k
		if c.left == 0 {
			c.endMessage()
		}
	}
	return w
}

// wholeMessages returns how many bytes at the start of p are whole
// messages, all passed to pgx (countPassed).
func (c *Conn) wholeMessages(p []byte) int {
	i := 0
	for len(p)-i >= 5 {
		l := uint64(binary.BigEndian.Uint32(p[i+1 : i+5]))
		if l < 4 || l > uint64(len(p)-i-1) {
			break // split across reads (or a length pgx will refuse)
		}
		t := p[i]
		c.countPassed(t)
		if !isAsync(t) {
			if t == 'E' {
				c.noteError(c.answers, p[i+5:i+1+int(l)])
			}
			c.answers++
		}
		i += 1 + int(l)
	}
	return i
}

// countPassed counts a message of type t passed to pgx, for Notices and
// Statuses.
func (c *Conn) countPassed(t byte) {
	switch t {
	case 'N':
		c.notices++
	case 'S':
		c.statuses.Add(1)
	}
}

func (c *Conn) endMessage() {
	t := c.hdr[0]
	c.hdrN = 0
	if c.curErr {
		c.noteError(c.curIndex, c.body)
	}
	if c.curWatch {
		c.watched(t, c.body)
	}
	if c.curKeep {
		in := c.queue[0].inj
		switch t {
		case 'D':
			if len(in.row) == 0 {
				var dr pgproto3.DataRow
				if dr.Decode(c.body) == nil {
					for _, v := range dr.Values {
						in.row = append(in.row, string(v))
						in.null = append(in.null, v == nil)
					}
				}
			}
		case 'V':
			if len(in.row) == 0 {
				var fr pgproto3.FunctionCallResponse
				if fr.Decode(c.body) == nil {
					in.row = append(in.row, string(fr.Result))
					in.null = append(in.null, fr.Result == nil)
				}
			}
		case 'E':
			var er pgproto3.ErrorResponse
			if er.Decode(c.body) == nil {
				in.err = pgconn.ErrorResponseToPgError(&er)
			}
		}
	}
	if len(c.queue) > 0 {
		s := c.queue[0]
		switch {
		case s.strip && s.inj.chained && (t == 'C' || t == 'E' || t == 'I'):
			s.inj.done = true
			c.popQueue()
		case t == 'Z':
			if s.strip {
				s.inj.done = true
			}
			c.popQueue()
		}
	}
}

// sqlstateIdleSession is idle_session_timeout's SQLSTATE: the server ended
// the session because it sat idle, outside a transaction, waiting for the
// client's next message.
const sqlstateIdleSession = "57P05"

// noteError takes in an ErrorResponse's body, the index-th answer read:
// whether the server ended the session for idleness. Call it with c.mu
// held.
func (c *Conn) noteError(index uint64, body []byte) {
	if c.idleEnd == 0 && hasCode(body, sqlstateIdleSession) {
		c.idleEnd = index + 1
	}
}

// hasCode reports whether an ErrorResponse's body has SQLSTATE code. It
// allocates nothing: it runs on every error a connection reads.
func hasCode(body []byte, code string) bool {
	for i := 0; i < len(body) && body[i] != 0; {
		t := body[i]
		i++
		j := i
		for j < len(body) && body[j] != 0 {
			j++
		}
		if t == 'C' {
			return string(body[i:j]) == code
		}
		i = j + 1
	}
	return false
}

// EndedIdle reports that the server ended the session because it sat idle
// (idle_session_timeout, SQLSTATE 57P05), and unrun that its error came
// before any answer to pgx's last write (but for a Terminate): nothing
// pgx has sent since the answers before it ran.
//
// PostgreSQL raises that error only while it waits for the client's next
// message, idle outside any transaction, or as it has just read one, at
// its first check for interrupts, before anything of it ran or was
// answered: every message sent before the server's last ReadyForQuery was
// answered, and everything after went unread or unrun. So a statement pgx
// sent (in one write, or in several whose first ones only prepare it)
// whose answer begins with that error, or that was sent once the error
// was in, never ran: it may be sent again, on another connection.
func (c *Conn) EndedIdle() (ended, unrun bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.idleEnd != 0, c.idleEnd != 0 && c.idleEnd-1 <= c.answersAtWrite
}

// Record starts noting the statements pgx sends: the SQL of its Query and
// Parse messages, and whether it sent anything whose text was not seen (a
// Bind of a statement prepared outside a recording, a FunctionCall).
// Recorded ends it. For what pgx's callers do with the connection directly
// (a pool's hooks), which pgryw does not route.
func (c *Conn) Record() {
	c.mu.Lock()
	c.rec, c.recTexts, c.recUnknown, c.recUnnamed = true, nil, false, false
	c.mu.Unlock()
}

// Recorded ends Record and returns the statements' texts, and unknown:
// something was sent whose text was not seen.
func (c *Conn) Recorded() (texts []string, unknown bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rec = false
	return c.recTexts, c.recUnknown
}

// record notes the statements in pgx's write b. Call it with c.mu held.
func (c *Conn) record(b []byte) {
	for i := 0; i+5 <= len(b); {
		t := b[i]
		n := int(binary.BigEndian.Uint32(b[i+1 : i+5]))
		if n < 4 || i+1+n > len(b) {
			c.recUnknown = true
			return
		}
		body := b[i+5 : i+1+n]
		i += 1 + n
		switch t {
		case 'Q':
			c.recTexts = append(c.recTexts, cstring(body))
		case 'P':
			name := cstring(body)
			query := cstring(body[min(len(name)+1, len(body)):])
			if name == "" {
				c.recUnnamed = true
			} else {
				if c.recNames == nil {
					c.recNames = map[string]string{}
				}
				c.recNames[name] = query
			}
			c.recTexts = append(c.recTexts, query)
		case 'B':
			portal := cstring(body)
			stmt := cstring(body[min(len(portal)+1, len(body)):])
			if q, ok := c.recNames[stmt]; ok {
				c.recTexts = append(c.recTexts, q)
			} else if stmt != "" || !c.recUnnamed {
				c.recUnknown = true
			}
		case 'F':
			c.recUnknown = true
		}
	}
}

// cstring returns b up to its first NUL.
func cstring(b []byte) string {
	for i, x := range b {
		if x == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// Watch starts watching pgx's own answers, from the next message read on:
// Peek then reads ahead to the end of the answers to what pgx sent since,
// and says whether one was an error. Unwatch ends it.
func (c *Conn) Watch() {
	c.mu.Lock()
	c.watch, c.watchSyncs, c.watchReady, c.watchErr = true, 0, 0, nil
	c.mu.Unlock()
}

// Unwatch ends Watch.
func (c *Conn) Unwatch() {
	c.mu.Lock()
	c.watch = false
	c.mu.Unlock()
}

// watched notes one of pgx's messages while watching: the first
// ErrorResponse, and each ReadyForQuery. Call it with c.mu held.
func (c *Conn) watched(t byte, body []byte) {
	switch t {
	case 'Z':
		c.watchReady++
	case 'E':
		if c.watchErr != nil {
			return
		}
		var er pgproto3.ErrorResponse
		if er.Decode(body) == nil {
			c.watchErr = pgconn.ErrorResponseToPgError(&er)
		}
	}
}

// Peek reads ahead, beside pgx, until every Sync (or Query) pgx sent since
// Watch has its ReadyForQuery, keeping pgx's bytes for its next Reads, and
// returns the first error among pgx's answers (nil for none). It stops
// early, with complete false, once it has kept limit bytes for pgx: an
// answer that large is left for pgx to read as it comes. It waits as long
// as pgx would, within ctx only. An error is the socket's, or the
// context's.
func (c *Conn) Peek(ctx context.Context, limit int) (first *pgconn.PgError, complete bool, err error) {
	// No deadline of its own, not even the context's: its end interrupts
	// the read (readBy), so an error is always after it, and a socket
	// that outlived the deadline is not taken for a failed one.
	c.mu.Lock()
	c.watchPassed = 0
	c.mu.Unlock()
	err = c.readUntilFunc(ctx, time.Time{}, true, func() bool {
		return c.watchReady >= c.watchSyncs || c.watchPassed >= limit
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.watchErr, c.watchReady >= c.watchSyncs, err
}

// Await reads from the socket until in's answer is complete, keeping any
// bytes meant for pgx for its next Read. It may run beside pgx's use of the
// connection, even from another goroutine: a read of pgx's already on the
// socket is waited for (what it reads is filtered as usual), and pgx's
// reads wait while Await reads. The framing state is kept across an error
// (the caller's context ending, say), so the connection stays in step; a
// socket error leaves it to pgx to find.
func (c *Conn) Await(ctx context.Context, in *Injection) error {
	c.mu.Lock()
	done := in.done || !in.sent
	c.mu.Unlock()
	if done {
		return nil
	}
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(30 * time.Second)
	}
	return c.readUntil(ctx, dl, in)
}

// IsTimeout reports whether err, from Await, is a wait that ran out of
// time: the context's deadline (the socket's read deadline is the
// context's, and may pass a moment before the context's own timer says
// so), or Await's own bound without one. The answer may still come, and
// the connection is still in step.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		errors.Is(err, errAwaitTimeout) || errors.As(err, &ne) && ne.Timeout()
}

// readUntil reads from the socket, beside pgx's use of it, until in's
// answer is complete (or, with in nil, until nothing of pgryw's is due),
// dl passes or ctx ends. A read of pgx's already on the socket is waited
// for (what it reads is filtered as usual). Bytes meant for pgx are kept
// for its next Read, except with in nil (Drain: the connection is being
// closed).
func (c *Conn) readUntil(ctx context.Context, dl time.Time, in *Injection) error {
	return c.readUntilFunc(ctx, dl, in != nil, func() bool { return c.reached(in) })
}

// readUntilFunc is readUntil, until done reports true (called with c.mu
// held), keeping pgx's bytes with keep.
func (c *Conn) readUntilFunc(ctx context.Context, dl time.Time, keep bool, done func() bool) error {
	for {
		c.mu.Lock()
		if done() {
			c.mu.Unlock()
			return nil
		}
		if c.reading {
			if c.waiter == nil {
				c.waiter = make(chan struct{})
			}
			w := c.waiter
			c.mu.Unlock()
			if err := waitUntil(ctx, w, dl); err != nil {
				return err
			}
			continue
		}
		c.reading = true
		if c.abuf == nil {
			c.abuf = make([]byte, 4096)
		}
		c.mu.Unlock()
		n, err := c.readBy(ctx, dl)
		c.mu.Lock()
		m := c.readReturned(c.abuf[:n])
		if keep {
			c.pending = append(c.pending, c.abuf[:m]...)
			c.watchPassed += m
		}
		finished := done()
		c.mu.Unlock()
		if finished {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// reached reports readUntil's end: in's answer complete, or with in nil
// nothing of pgryw's due. Call it with c.mu held.
func (c *Conn) reached(in *Injection) bool {
	if in != nil {
		return in.done
	}
	return len(c.queue) == 0
}

// DrainWait bounds how long closing a connection waits for answers of
// pgryw's still due on it (Drain).
const DrainWait = 500 * time.Millisecond

// Due reports whether an answer to one of pgryw's statements is still to
// come on the connection.
func (c *Conn) Due() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue) > 0
}

// Drain reads until no answer of pgryw's is due on the connection, or dl
// passes, and reports whether none is. What it reads is thrown away: it is
// for a connection about to be closed, whose server connection something
// in between (a pooler) may hand to another client once it has seen the
// last ReadyForQuery; an answer still in flight then would reach that
// client as its own.
func (c *Conn) Drain(dl time.Time) bool {
	c.mu.Lock()
	gaveUp := c.gaveUp
	c.mu.Unlock()
	if !gaveUp {
		c.readUntil(context.Background(), dl, nil)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending = nil
	c.gaveUp = len(c.queue) > 0
	return !c.gaveUp
}

// Close implements net.Conn, after a Drain when pgx closes without a
// Terminate.
func (c *Conn) Close() error {
	c.Drain(time.Now().Add(DrainWait))
	return c.Conn.Close()
}

// SetTxPooled marks the connection as behind a transaction pooler from now
// on (Peer.TxPooled): no prefix unless chained, no suffix.
func (c *Conn) SetTxPooled() {
	c.mu.Lock()
	c.Peer = Peer{TxPooled: true, Unnamed: true, Auto: c.Peer.Auto}
	c.mu.Unlock()
}

// errAwaitTimeout: no deadline was given and pgryw's answer did not come
// within 30 seconds.
var errAwaitTimeout = errors.New("wire: timed out waiting for a ride-along answer")

// readBy reads once into abuf, giving up at dl or when ctx ends, and then
// puts back the read deadline pgx asked for.
//
// The context's end interrupts the read by a deadline in the past, set
// from the context's own goroutine: when the context ends as the read
// returns, that goroutine may still be about to set it, and pgx's deadline
// is put back only once it has (else the past deadline would stay on the
// socket, and pgx's next read would fail with a timeout at once).
func (c *Conn) readBy(ctx context.Context, dl time.Time) (int, error) {
	c.Conn.SetReadDeadline(dl)
	interrupted := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		c.Conn.SetReadDeadline(time.Unix(1, 0))
		close(interrupted)
	})
	defer func() {
		if !stop() {
			<-interrupted
		}
		c.mu.Lock()
		pgxDL := c.readDeadline
		c.mu.Unlock()
		c.Conn.SetReadDeadline(pgxDL)
	}()
	return c.Conn.Read(c.abuf)
}

// waitUntil waits until w is closed, ctx ends or dl (when set) passes.
func waitUntil(ctx context.Context, w chan struct{}, dl time.Time) error {
	var expire <-chan time.Time
	if !dl.IsZero() {
		t := time.NewTimer(time.Until(dl))
		defer t.Stop()
		expire = t.C
	}
	select {
	case <-w:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-expire:
		return errAwaitTimeout
	}
}

// waitFor waits until w is closed, or until dl (when set) passes.
func waitFor(w chan struct{}, dl time.Time) error {
	if dl.IsZero() {
		<-w
		return nil
	}
	d := time.Until(dl)
	if d <= 0 {
		return os.ErrDeadlineExceeded
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w:
		return nil
	case <-t.C:
		return os.ErrDeadlineExceeded
	}
}

// SetDeadline implements net.Conn, noting the read deadline pgx asks for
// (it interrupts reads with one when its context ends).
func (c *Conn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.readDeadline = t
	c.mu.Unlock()
	return c.Conn.SetDeadline(t)
}

// SetReadDeadline implements net.Conn; see SetDeadline.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.readDeadline = t
	c.mu.Unlock()
	return c.Conn.SetReadDeadline(t)
}
