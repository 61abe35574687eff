package pgryw

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pgryw/pgryw/internal/wire"
)

// backend is one open server connection of a Conn: a pgx stdlib
// connection, in unit tests as in production (a scripted server stands in
// for PostgreSQL on the wire, not a driver double).
type backend struct {
	conn  driver.Conn
	pg    *pgconn.PgConn
	wire  *wire.Conn     // nil without replicas (Connector.plain): nothing rides along
	pre   slot           // a statement riding in front of the next one (a replica's check)
	post  slot           // a statement riding behind the next one (a capture or a replay poll)
	post2 slot           // the capture's other slot, while one waits to be settled (deferred.go)
	state slot           // session state: its read-back on the primary, settings on a replica
	probe slot           // the fast-path capture's probe (Conn.probeFastPath)
	reset wire.Injection // reset_session's reset, riding in front of a statement

	applied applied // the settings a replica connection's session was given
	// born: the connector's count of replica connections opened when this
	// one was (Connector.opened), for Conn.bounds.
	born uint64
	// preps: statements of a read-only transaction's prepared on this
	// replica connection and not closed yet; it is not lent out while
	// any lives.
	preps int
	// custom: a custom parameter was set on this replica connection's
	// session (armSettings): it keeps a trace another session would not
	// have, so the connection is not lent to another Conn.
	custom bool

	// peer is what the connection learned of what it reached when it was
	// opened (Connector.identify): a pooler in between, the server
	// instance.
	peer wire.Peer
	// noChain: behind a transaction pooler, a read on this connection
	// went in the simple protocol, so a check could not share its
	// transaction: its reads that need one run on the primary.
	noChain bool
	// snapHeld: a check chained in a read's transaction found it at
	// REPEATABLE READ or SERIALIZABLE (a default isolation level): the
	// poll took the snapshot before it read the position. While the
	// connection carries the same settings (snapVersion, a Conn's
	// settings version), and for snapHeldFor, its checks go with a Sync
	// of their own, and behind a transaction pooler, where they cannot,
	// its reads that need one run on the primary (snapshotHeld).
	snapHeld    int64 // until (unix ns); 0: not seen
	snapVersion uint64
	// probedSince is when the monitor first probed over this connection
	// (unix ns; 0: not yet), for pooledConnAge.
	probedSince int64

	// The primary's wal_block_size and timeline, from the connection's
	// first capture (0: not yet). Neither changes while a connection to a
	// primary lives (a primary is never promoted again; a standby's
	// captures fail until it is), so later captures read the position
	// alone (injectCapture). Set by whichever goroutine applies the answer.
	walBlock atomic.Uint64
	walTLI   atomic.Uint32
	// captureFn is pg_current_wal_insert_lsn's OID on the primary, from the
	// same first capture (0: unknown): later captures call the function
	// with a FunctionCall message (injectCapture).
	captureFn atomic.Uint32

	// Names of pgryw's statements prepared on this connection, and the
	// generation of their server-side names (see forgetPrepared).
	prepared  map[string]bool
	confirmed map[string]bool // of those, the ones an answer showed to exist
	prepGen   int
	node      *node
	ups       uint32 // node.ups when the connection was opened

	major int // server major version; 0 when unknown

	// stillStandby's answer, and the wire layer's ParameterStatus count
	// when it was read; settled: the count had not moved since the call
	// before, so pgx had applied every status counted.
	standby       bool
	statusesAt    uint64
	statusSettled bool

	// peek sees, without waiting, whether the server has ended the
	// (idle) connection; nil when it cannot (no wire layer, a test's
	// wrapper, a platform without it).
	peek *sockPeek
	// usedAt is when pgryw last sent, or was about to send, a statement
	// of the application's on the connection (monoNow; 0: when opened),
	// for goneIdle. Only ever earlier than the truth (a send it misses
	// leaves it older), so the connection is looked at more, never less.
	usedAt int64
}

// idleLook is how long a connection must have carried nothing of the
// application's before pgryw looks at its socket (a system call) ahead of
// using it again: the server may have ended it meanwhile
// (idle_session_timeout, a restart). Far below any idle timeout a server
// is given, and far above the gaps of a busy connection, which pays
// nothing: the look comes after a pause that a network round trip
// dwarfs. A timeout shorter than this is caught by the server's error
// instead (EndedIdle).
const idleLook = 100 * time.Millisecond

// monoEpoch is the origin of monoNow.
var monoEpoch = time.Now()

// monoNow is the monotonic clock in nanoseconds since monoEpoch: immune
// to wall-clock steps, and cheaper to read than time.Now.
func monoNow() int64 { return int64(time.Since(monoEpoch)) }

// touch stamps b as about to carry a statement, and reports whether it
// had carried nothing for idleLook or longer: the server may have ended
// it meanwhile (look with gone).
func (b *backend) touch() (wasIdle bool) {
	now := monoNow()
	wasIdle = b.quietAt(now)
	b.usedAt = now
	return wasIdle
}

// quiet reports that b has carried nothing for idleLook or longer (as
// touch would, without stamping it).
func (b *backend) quiet() bool { return b.quietAt(monoNow()) }

// quietAt is quiet as of now (monoNow).
func (b *backend) quietAt(now int64) bool { return now-b.usedAt >= int64(idleLook) }

// endedIdle reports that the server ended b's session because it sat idle
// (idle_session_timeout), and unrun that nothing pgx sent since its
// last answers ran (wire.Conn.EndedIdle).
func (b *backend) endedIdle() (ended, unrun bool) {
	if b.wire == nil {
		return false, false
	}
	return b.wire.EndedIdle()
}

// newBackend takes one of the connector's server connections: every one
// is pgx's (a *stdlib.Conn), with pgryw's wire layer under pgconn
// (Connector.wireUp wraps the socket, after any TLS) unless the connector
// has no replicas.
func newBackend(dc driver.Conn, n *node) *backend {
	b := &backend{conn: dc, node: n, ups: n.ups.Load(), usedAt: monoNow()}
	b.pg = dc.(*stdlib.Conn).Conn().PgConn()
	b.major = majorVersion(b.pg.ParameterStatus("server_version"))
	// Without replicas (Connector.plain) there is no wire layer: the
	// connection is pgx's alone.
	if b.wire, _ = b.pg.Conn().(*wire.Conn); b.wire != nil {
		b.peer = b.wire.Peer
		if b.peer.Auto && !b.peer.TxPooled && n.pooledSeen.Load() {
			b.becomeTxPooled()
		}
		// Replica connections too: one a Conn holds, or one lent after it
		// sat in its node's pool, may have been ended by the replica's
		// idle_session_timeout.
		b.peek = newSockPeek(b.wire.Conn)
	}
	// Servers ≥ 14 report in_hot_standby; a replica entry that points at a
	// primary is caught here for free.
	if n.index >= 0 && b.pg.ParameterStatus("in_hot_standby") == "off" {
		n.record(eventPromoted)
	}
	return b
}

// majorVersion reads "15.18 (Debian …)" or "19devel" as 15 or 19.
func majorVersion(v string) int {
	i := 0
	for i < len(v) && v[i] >= '0' && v[i] <= '9' {
		i++
	}
	n, _ := strconv.Atoi(v[:i])
	return n
}

// pgx returns the backend's pgx connection, for pgx's front end.
func (b *backend) pgx() *pgx.Conn { return b.conn.(*stdlib.Conn).Conn() }

// snapHeldFor is how long a connection whose reads were found to hold
// their snapshot from their first statement checks with a Sync of its own
// before trying the chained check again: behind a transaction pooler the
// default isolation level that made it so may be another client's session
// state, gone once that server connection is reset.
const snapHeldFor = time.Minute

// holdSnapshot records that a chained check found b's read transactions,
// under settings version v, at REPEATABLE READ or SERIALIZABLE.
func (b *backend) holdSnapshot(v uint64) {
	b.snapHeld, b.snapVersion = time.Now().Add(snapHeldFor).UnixNano(), v
}

// snapshotHeld reports that b's reads under settings version v were found
// to hold their snapshot from their first statement, within snapHeldFor:
// a check cannot share their transaction.
func (b *backend) snapshotHeld(v uint64) bool {
	return b.snapHeld != 0 && b.snapVersion == v && time.Now().UnixNano() < b.snapHeld
}

func (b *backend) closed() bool {
	return b.pg.IsClosed()
}

// gone reports, without waiting, that the server has ended this idle
// connection (it died, was shut down or killed the session): nothing sent
// on it could run.
func (b *backend) gone() bool {
	if b.wire != nil {
		// Bytes the wire layer already read off the socket (settling a
		// ride-along answer) come before anything still in it.
		if first, ok := b.wire.PendingByte(); ok {
			return first == 'N' || first == 'E'
		}
	}
	return b.peek != nil && b.peek.gone(b.wire)
}

// idle reports whether no transaction is open on the server connection.
func (b *backend) idle() bool {
	return b.pg.TxStatus() == 'I'
}

// stillStandby reports what the server last said about recovery. Servers
// ≥ 14 update in_hot_standby with the first answer after a promotion.
//
// It runs after every replica read, and pgx's parameter map is a string
// lookup: with the wire layer, the answer is looked up again only when a
// ParameterStatus has passed to pgx since the last call, and once more on
// the call after (pgx applies a status when it reads it, which can be
// after the read that counted it returned: the server sends changed
// statuses just before ReadyForQuery, behind the rows).
func (b *backend) stillStandby() bool {
	if b.wire != nil {
		n := b.wire.Statuses()
		if n == b.statusesAt && b.statusSettled {
			return b.standby
		}
		b.statusSettled = n == b.statusesAt
		b.statusesAt = n
	}
	b.standby = b.pg.ParameterStatus("in_hot_standby") != "off"
	return b.standby
}

func (b *backend) exec(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if e, ok := b.conn.(driver.ExecerContext); ok {
		sent := b.sent()
		res, err := e.ExecContext(ctx, query, args)
		return res, b.callerError(ctx, err, sent)
	}
	return nil, driver.ErrSkip
}

func (b *backend) query(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if q, ok := b.conn.(driver.QueryerContext); ok {
		sent := b.sent()
		rows, err := q.QueryContext(ctx, query, args)
		return rows, b.callerError(ctx, err, sent)
	}
	return nil, driver.ErrSkip
}

// execVia is exec, through st where st was prepared on b (stmt), else of
// query's text.
func (b *backend) execVia(ctx context.Context, st *stmt, query string, args []driver.NamedValue) (driver.Result, error) {
	if st == nil {
		return b.exec(ctx, query, args)
	}
	ps := st.via(b)
	if ps == nil {
		return b.exec(ctx, query, args)
	}
	sent := b.sent()
	res, err := ps.(driver.StmtExecContext).ExecContext(ctx, args)
	return res, b.callerError(ctx, err, sent)
}

// queryVia is query, through st where st was prepared on b.
func (b *backend) queryVia(ctx context.Context, st *stmt, query string, args []driver.NamedValue) (driver.Rows, error) {
	if st == nil {
		return b.query(ctx, query, args)
	}
	ps := st.via(b)
	if ps == nil {
		return b.query(ctx, query, args)
	}
	sent := b.sent()
	rows, err := ps.(driver.StmtQueryContext).QueryContext(ctx, args)
	return rows, b.callerError(ctx, err, sent)
}

// peekLimit bounds what a replica batch's answer may hold for peekBatch
// to read it whole before the caller does.
const peekLimit = 1 << 20

// peekBatch reads a batch's whole answer from the replica before the
// caller reads any of it (pgx reads a batch's results when asked; Watch
// was called before the batch was sent), and returns its first error: a
// replica that refuses a statement as a standby (an unlogged table, say),
// or fails (a recovery conflict), is then passed over as for a single
// read, before any result reached the caller; any other error reaches the
// caller from the results, as pgx gives it. An answer too large to hold
// is left as it is. A socket that fails closes the connection.
func (b *backend) peekBatch(ctx context.Context) error {
	w := b.wire
	first, complete, err := w.Peek(ctx, peekLimit)
	w.Unwatch()
	switch {
	case err != nil && ctx.Err() == nil:
		b.close()
		return err
	case err != nil:
		return err
	case complete && first != nil:
		return first
	}
	return nil
}

// prepare prepares query on b's server connection, as pgx does (a named
// server-side prepared statement, described: its parameters counted).
func (b *backend) prepare(ctx context.Context, query string) (driver.Stmt, error) {
	p, ok := b.conn.(driver.ConnPrepareContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	sent := b.sent()
	st, err := p.PrepareContext(ctx, query)
	return st, b.callerError(ctx, err, sent)
}

// sent counts the bytes pgx has written on b's socket.
func (b *backend) sent() uint64 {
	if b.wire == nil {
		return 0
	}
	return b.wire.Sent()
}

// callerError turns err from a statement on b into what the caller gets.
// When b's connection broke after bytes of the statement left (sent is the
// count before it), the statement may or may not have run, and the error
// matches ErrConnLost: a driver.ErrBadConn (which would make database/sql
// run it again) becomes ErrConnLost itself, and pgx's own error (say,
// io.ErrUnexpectedEOF) is wrapped, so errors.Is finds both. The caller's
// context ending is left as pgx reports it. A server's error is handed on
// bare (see serverError).
func (b *backend) callerError(ctx context.Context, err error, sent uint64) error {
	if err == nil {
		return nil
	}
	left := b.wire != nil && b.wire.Sent() != sent // bytes of the statement left
	if errors.Is(err, driver.ErrBadConn) {
		if left {
			return ErrConnLost
		}
		return err
	}
	var pgErr *pgconn.PgError
	if left && b.closed() && ctx.Err() == nil && !errors.As(err, &pgErr) {
		return fmt.Errorf("%w: %w", ErrConnLost, err)
	}
	return serverError(err)
}

// serverError hands the server's *pgconn.PgError to the caller bare when
// pgx wrapped it in a *pgconn.PrepareError (a statement that failed to
// prepare, such as one naming a missing table): callers such as GORM
// type-assert err.(*pgconn.PgError) and would miss it.
func serverError(err error) error {
	if pe, ok := err.(*pgconn.PrepareError); ok {
		var pgErr *pgconn.PgError
		if errors.As(pe, &pgErr) {
			return pgErr
		}
	}
	return err
}

// control runs one of pgryw's own statements and returns its first row as
// text, with which values were NULL. With pgx it goes as a simple-protocol
// query: our statements embed an LSN, and every distinct text would
// otherwise take a slot in pgx's prepared statement cache (and a Parse
// round trip).
func (b *backend) control(ctx context.Context, query string) (row []string, null []bool, err error) {
	res, err := b.pg.Exec(ctx, query).ReadAll()
	if err != nil {
		return nil, nil, err
	}
	for _, r := range res {
		if r.Err != nil {
			return nil, nil, r.Err
		}
	}
	if len(res) == 0 || len(res[len(res)-1].Rows) == 0 {
		return nil, nil, fmt.Errorf("pgryw: %s returned no row", firstWords(query))
	}
	for _, v := range res[len(res)-1].Rows[0] {
		row = append(row, string(v))
		null = append(null, v == nil)
	}
	return row, null, nil
}

func firstWords(q string) string {
	f := strings.Fields(q)
	if len(f) > 2 {
		f = f[:2]
	}
	return strings.Join(f, " ")
}

func (b *backend) close() error { return b.conn.Close() }

// current reports whether b, a replica connection, is open and was opened
// in its node's up generation ups (one opened before the node was last
// down most likely died with the server).
func (b *backend) current(ups uint32) bool { return !b.closed() && b.ups == ups }

// slot is one reusable ride-along statement and its messages' buffer.
type slot struct {
	inj   wire.Injection
	msgs  []byte
	name  string // the prepared statement's base name
	parse bool   // inj carries name's Parse, not yet known to have reached the server
}

// injectPrepared readies a ride-along statement in s as an extended-protocol
// execution of sql, prepared under name on first use on this connection
// (Parse then, Bind/Execute/Sync every time): the server skips parse and
// plan, which a simple Query pays on every write. params are its bind
// parameters in text format (nil: NULL).
//
// Behind a pooler (peer.Unnamed) the statement is the unnamed one, parsed in
// the same flush every time: the server connection that has a named one
// may not be the one the next flush reaches, nor the only one that has it.
func (b *backend) injectPrepared(s *slot, name, sql string, params ...[]byte) *wire.Injection {
	b.reconcilePrepared()
	buf := s.msgs[:0]
	base := name
	if b.peer.Unnamed {
		name = ""
		buf, _ = (&pgproto3.Parse{Query: sql}).Encode(buf)
	} else if b.prepGen > 0 {
		name += "_" + strconv.Itoa(b.prepGen)
	}
	s.parse = false
	if !b.peer.Unnamed && !b.prepared[base] {
		buf, _ = (&pgproto3.Parse{Name: name, Query: sql}).Encode(buf)
		if b.prepared == nil {
			b.prepared = map[string]bool{}
		}
		b.prepared[base] = true // for the injections armed after it in the same flush
		s.parse = true
	}
	buf, _ = (&pgproto3.Bind{PreparedStatement: name, Parameters: params}).Encode(buf)
	buf, _ = (&pgproto3.Execute{}).Encode(buf)
	buf, _ = (&pgproto3.Sync{}).Encode(buf)
	s.msgs = buf
	s.name = base
	s.inj.ResetMessages(buf)
	return &s.inj
}

// slots returns b's ride-along slots that may carry a prepared statement.
func (b *backend) slots() [4]*slot { return [4]*slot{&b.pre, &b.post, &b.post2, &b.state} }

// reconcilePrepared brings b.prepared in line with what reached the
// server: a Parse whose injection was dropped before it was sent (pgx's own
// Parse failed, so nothing executed) or refused created nothing, and the
// next use parses again; one whose injection answered without an error is
// confirmed, so that only a confirmed statement's 26000 counts as evidence
// of a pooler (injectionFailed).
func (b *backend) reconcilePrepared() {
	for _, s := range b.slots() {
		if !s.parse {
			continue
		}
		in := &s.inj
		switch {
		case in.Msgs == nil || in.Msgs[0] != 'P':
			s.parse = false // reused (see reuse): what that Parse did is not known
		case in.Dropped() || in.Refused():
			delete(b.prepared, s.name)
			s.parse = false
		case in.Done() && in.Err() == nil:
			if b.confirmed == nil {
				b.confirmed = map[string]bool{}
			}
			b.confirmed[s.name] = true
			s.parse = false
		}
	}
}

// reuse readies slot s for an injection built outside injectPrepared: what
// the Parse it may still carry did is taken in first, and then the slot
// carries none.
func (b *backend) reuse(s *slot) {
	b.reconcilePrepared()
	s.parse = false
}

// slotName returns the base name of the prepared statement inj, armed in
// one of b's slots, executes.
func (b *backend) slotName(inj *wire.Injection) string {
	for _, s := range b.slots() {
		if inj == &s.inj {
			return s.name
		}
	}
	return ""
}

// fastCaptureTries is how many fast-path captures in a row may go
// unanswered on broken connections before a node's captures are prepared
// statements for fastCaptureOff. A connection breaks for other reasons
// too (a cancelled statement, a restart), with fast-path captures
// answered in between; something that drops the connection at every
// FunctionCall answers none, and then costs one broken connection per
// fastCaptureOff.
const (
	fastCaptureTries = 3
	fastCaptureOff   = time.Minute
)

// forgetPrepared is for a statement that may deallocate prepared
// statements (DEALLOCATE, DISCARD ALL): pgryw's ride-alongs behind it are
// prepared again under new names, which cannot clash with the old ones
// whether or not the statement dropped them.
func (b *backend) forgetPrepared() {
	b.prepGen++
	clear(b.prepared)
	clear(b.confirmed)
	for _, s := range b.slots() {
		s.parse = false
	}
}

// becomeTxPooled treats b, from now on, as behind a transaction pooler
// (wire.Conn.SetTxPooled): what pgryw sends on it, and what it takes its
// reads to have seen.
func (b *backend) becomeTxPooled() {
	b.wire.SetTxPooled()
	b.peer = b.wire.Peer
}

// injectionFailed notes a ride-along statement's error: a prepared statement
// that is gone (DEALLOCATE ALL, DISCARD ALL) is prepared again next time.
//
// A 26000 for a name an earlier answer showed prepared on this connection
// under its current generation, or a 42P05 for one it is preparing, means
// its flushes do not all reach one server connection: a transaction pooler
// the connect-time check did not see. The connection, and new connections
// to the node, are then treated as behind one (Pooler). (A Parse that never
// went out, or failed, proves nothing: see reconcilePrepared.)
func (b *backend) injectionFailed(name string, err error) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || b.peer.Unnamed {
		return
	}
	b.reconcilePrepared()
	pooled := false
	switch pgErr.Code {
	case sqlstateNoSuchStatement:
		pooled = b.confirmed[name]
	case sqlstateDuplicateStatement:
		pooled = b.prepared[name]
	}
	if name != "" && pooled && b.peer.Auto {
		b.becomeTxPooled()
		b.node.pooledSeen.Store(true)
	}
	switch pgErr.Code {
	case sqlstateNoSuchStatement:
		delete(b.prepared, name)
		delete(b.confirmed, name)
	case sqlstateDuplicateStatement:
		b.prepared[name] = true
	}
}
