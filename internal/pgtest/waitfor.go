package pgtest

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/pgryw/pgryw/internal/lsn"
)

// WaitForProxy stands in for PostgreSQL 19's WAIT FOR
// (https://www.postgresql.org/docs/19/sql-wait.html), which is in no
// package these machines can install (and the project builds no
// PostgreSQL from source). It stands in front of a real 15+ standby
// and answers WAIT FOR LSN itself, by the rules of PostgreSQL 19.0 as it
// shipped, so that pgryw's PostgreSQL 19 path runs end to end against real
// replicas:
//
//   - Syntax: WAIT FOR LSN '<lsn>' [WITH (option [, ...])], options MODE
//     'standby_replay' | 'standby_write' | 'standby_flush', TIMEOUT (a
//     number or a string with a time unit, ms by default) and NO_THROW, as
//     a simple Query (alone or first of several statements) or the Parse of
//     an extended-protocol statement, named or not.
//   - TIMEOUT is an integer number of milliseconds from 0 to 2147483647:
//     fractions are rounded to the nearest integer (half to even, as the
//     server's rint does), so 0.5 ms or less is 0, which means no timeout;
//     2147483648 or more, or a negative value, is refused with 22023.
//   - The snapshot rule: inside a transaction block that holds a snapshot
//     (a REPEATABLE READ or SERIALIZABLE block after its first query, an
//     open cursor) it is refused with 55000. The proxy reads this from
//     pg_stat_activity.backend_xmin of the session's backend.
//   - Not in recovery: status 'not in recovery' with NO_THROW, else 55000.
//   - A target already replayed returns 'success'.
//   - The lock rule: a target not yet replayed is refused with 55000
//     ("cannot wait for a standby LSN while holding locks", with DETAIL
//     and HINT) whenever the session holds any granted heavyweight lock
//     other than its own virtual transaction id: a relation lock left by an
//     earlier statement of its transaction, a session advisory lock. The
//     proxy reads the session's locks from pg_locks. NO_THROW does not make
//     it a status row.
//   - The wait: 'success' once replay reaches the target; at the timeout
//     'timeout' with NO_THROW, else 57014. A cancel request for the session
//     ends it with 57014, and a pending cancel wins over an expired
//     timeout. A statement_timeout given at connection start (a startup
//     parameter, or -c in options) ends it with 57014 as well.
//   - Top level only: a DO block whose text holds a WAIT FOR is refused
//     with 0A000 ("WAIT can only be executed as a top-level statement").
//
// The proxy waits out of band, on connections of its own to the standby:
// the session's server backend sees nothing of the wait, so it takes no
// snapshot and no lock, exactly as the real statement takes none. It does
// so only where the server has nothing of the client's in hand: a WAIT FOR
// that is the first statement of its pipeline segment (after a Sync, or a
// simple Query), which is where a client sends a wait in front of a read.
// A WAIT FOR later in a segment is passed to the server untouched, which
// refuses it as a syntax error (counted as MidPipeline). When the wait
// fails, the proxy has the server raise the same error (a DO block of its
// own, no caller text in it), so that a transaction block is aborted and
// the rest of the segment skipped, as the real server would.
//
// With ServerVersion set it also reports that server_version to the client
// (pgryw's wait_method=auto then takes the node for PostgreSQL 19), and
// pg_catalog.pg_stat_recovery in any statement reads
// public.pgtest_stat_recovery() (installed by InstallWaitFor), which
// returns the view's row on 15 and later: no row when not in recovery or
// for a role without pg_read_all_stats.
//
// What it cannot see: a statement_timeout set after connection start, and
// a WAIT FOR inside a function body (the standby's parser refuses it there
// as a syntax error).
type WaitForProxy struct {
	*proxy
	opts WaitForOptions

	mu       sync.Mutex
	sessions map[[2]uint32]*wfSession // by backend pid and secret key, for cancels
	side     []*pgx.Conn              // idle connections of the proxy's own

	counts waitForCounters
	notes  []string // what the session held at each locked wait or poll (the last 50)
}

// Notes says, for the last locked waits and polls (LockedWaits,
// LockedPolls), which locks the session held and what it had run.
func (p *WaitForProxy) Notes() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.notes...)
}

// note records what the session held at a locked wait or poll.
func (s *wfSession) note(what, held string) {
	s.p.mu.Lock()
	defer s.p.mu.Unlock()
	s.p.notes = append(s.p.notes, fmt.Sprintf("%s, pid %d: %s", what, s.pid, held))
	if len(s.p.notes) > 50 {
		s.p.notes = s.p.notes[1:]
	}
}

// WaitForOptions configures StartWaitForProxy.
type WaitForOptions struct {
	// Target is the standby, "host:port".
	Target string
	// DSN connects to the same standby as a role that may read every
	// session's pg_locks and pg_stat_activity rows (a superuser): the
	// proxy's own connections, which poll replay and read a session's
	// locks and snapshot.
	DSN string
	// ServerVersion, when not "", replaces the server_version parameter
	// the standby reports, e.g. "19.0 (emulated)".
	ServerVersion string
	// Polls, when not nil, reports whether a statement text is a replay
	// position poll: the proxy then records each one that runs while the
	// session holds a lock (LockedPolls), waiting for the server to finish
	// what came before it.
	Polls func(sql string) bool
}

type waitForCounters struct {
	emulated, success, timeouts, notInRecovery                  atomic.Int64
	lockRefusals, snapshotRefusals, topLevelRefusals, rangeErrs atomic.Int64
	cancels, statementTimeouts, lockedWaits, lockedPolls        atomic.Int64
	midPipeline, abortedTx                                      atomic.Int64
}

// WaitForCounts is what a WaitForProxy has seen, each rule of PostgreSQL
// 19.0's WAIT FOR that fired counted apart.
type WaitForCounts struct {
	Emulated          int64 // WAIT FOR statements answered
	Success           int64 // status 'success'
	Timeouts          int64 // the TIMEOUT ran out (a 'timeout' row, or 57014 without NO_THROW)
	NotInRecovery     int64 // the node was not a standby
	LockRefusals      int64 // refused by the lock rule (55000)
	SnapshotRefusals  int64 // refused by the snapshot rule (55000)
	TopLevelRefusals  int64 // a WAIT FOR inside a DO block (0A000)
	RangeErrors       int64 // a TIMEOUT out of range, or unreadable (22023)
	Cancels           int64 // ended by a cancel request (57014)
	StatementTimeouts int64 // ended by the session's statement_timeout (57014)
	AbortedTx         int64 // sent in a failed transaction block (25P02)
	// LockedWaits counts waits sent while the session held a lock,
	// whatever their outcome (a target already replayed succeeds even
	// then).
	LockedWaits int64
	// LockedPolls counts replay polls (WaitForOptions.Polls) run while
	// the session held a lock.
	LockedPolls int64
	// MidPipeline counts WAIT FOR statements that were not first in their
	// pipeline segment, passed to the server untouched.
	MidPipeline int64
}

// Counts returns what the proxy has seen so far.
func (p *WaitForProxy) Counts() WaitForCounts {
	c := &p.counts
	return WaitForCounts{
		Emulated: c.emulated.Load(), Success: c.success.Load(), Timeouts: c.timeouts.Load(),
		NotInRecovery: c.notInRecovery.Load(), LockRefusals: c.lockRefusals.Load(),
		SnapshotRefusals: c.snapshotRefusals.Load(), TopLevelRefusals: c.topLevelRefusals.Load(),
		RangeErrors: c.rangeErrs.Load(), Cancels: c.cancels.Load(), StatementTimeouts: c.statementTimeouts.Load(),
		AbortedTx: c.abortedTx.Load(), LockedWaits: c.lockedWaits.Load(), LockedPolls: c.lockedPolls.Load(),
		MidPipeline: c.midPipeline.Load(),
	}
}

// Add returns the sum of c and d, field by field.
func (c WaitForCounts) Add(d WaitForCounts) WaitForCounts {
	return WaitForCounts{
		Emulated: c.Emulated + d.Emulated, Success: c.Success + d.Success, Timeouts: c.Timeouts + d.Timeouts,
		NotInRecovery: c.NotInRecovery + d.NotInRecovery, LockRefusals: c.LockRefusals + d.LockRefusals,
		SnapshotRefusals: c.SnapshotRefusals + d.SnapshotRefusals, TopLevelRefusals: c.TopLevelRefusals + d.TopLevelRefusals,
		RangeErrors: c.RangeErrors + d.RangeErrors, Cancels: c.Cancels + d.Cancels,
		StatementTimeouts: c.StatementTimeouts + d.StatementTimeouts, AbortedTx: c.AbortedTx + d.AbortedTx,
		LockedWaits: c.LockedWaits + d.LockedWaits, LockedPolls: c.LockedPolls + d.LockedPolls,
		MidPipeline: c.MidPipeline + d.MidPipeline,
	}
}

// Sub returns c minus d, field by field: what happened between two Counts.
func (c WaitForCounts) Sub(d WaitForCounts) WaitForCounts {
	neg := WaitForCounts{
		Emulated: -d.Emulated, Success: -d.Success, Timeouts: -d.Timeouts, NotInRecovery: -d.NotInRecovery,
		LockRefusals: -d.LockRefusals, SnapshotRefusals: -d.SnapshotRefusals, TopLevelRefusals: -d.TopLevelRefusals,
		RangeErrors: -d.RangeErrors, Cancels: -d.Cancels, StatementTimeouts: -d.StatementTimeouts,
		AbortedTx: -d.AbortedTx, LockedWaits: -d.LockedWaits, LockedPolls: -d.LockedPolls, MidPipeline: -d.MidPipeline,
	}
	return c.Add(neg)
}

// Rewritten returns how many WAIT FOR statements the proxy has answered.
func (p *WaitForProxy) Rewritten() int64 { return p.counts.emulated.Load() }

// statRecoveryFunction stands in for PostgreSQL 19's pg_stat_recovery view
// on older standbys (same columns; the timelines are the last checkpoint's,
// the closest 15 shows).
const statRecoveryFunction = `CREATE OR REPLACE FUNCTION public.pgtest_stat_recovery()
RETURNS TABLE(promote_triggered boolean, last_replayed_read_lsn pg_lsn, last_replayed_end_lsn pg_lsn,
  last_replayed_tli integer, replay_end_lsn pg_lsn, replay_end_tli integer,
  recovery_last_xact_time timestamptz, current_chunk_start_time timestamptz, pause_state text)
LANGUAGE sql STABLE AS $$
  SELECT false, pg_last_wal_replay_lsn(), pg_last_wal_replay_lsn(),
    (pg_control_checkpoint()).timeline_id, pg_last_wal_replay_lsn(), (pg_control_checkpoint()).timeline_id,
    pg_last_xact_replay_timestamp(), NULL::timestamptz, pg_get_wal_replay_pause_state()
  WHERE pg_is_in_recovery() AND pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')
$$`

// InstallWaitFor creates on the writer (it replicates to the standbys) what
// the emulation reads on a standby, and waits until every replica has it.
func (c *Cluster) InstallWaitFor(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.WriterDSN())
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, statRecoveryFunction); err != nil {
		return fmt.Errorf("pgtest: install pgtest_stat_recovery: %w", err)
	}
	return c.WaitCaughtUp(ctx)
}

// StartWaitForProxy listens on a free loopback port and forwards to
// opts.Target, answering WAIT FOR itself.
func StartWaitForProxy(opts WaitForOptions) (*WaitForProxy, error) {
	p := &WaitForProxy{opts: opts, sessions: map[[2]uint32]*wfSession{}}
	var err error
	p.proxy, err = startProxy(opts.Target, func(client, server net.Conn) (func(), func()) {
		s := &wfSession{p: p, client: client, server: server, started: make(chan struct{}),
			stmts: map[string]*waitStmt{}, portals: map[string]*waitStmt{},
			pollStmts: map[string]bool{}, pendingRFQ: 1}
		s.cond = sync.NewCond(&s.mu)
		return s.frontend, s.backend
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// Close stops the proxy, its clients' connections and its own.
func (p *WaitForProxy) Close() error {
	err := p.proxy.Close()
	p.mu.Lock()
	side := p.side
	p.side = nil
	p.mu.Unlock()
	for _, c := range side {
		c.Close(context.Background())
	}
	return err
}

// sideConn takes one of the proxy's own connections to the standby: an
// idle one that still answers (a test may have terminated the standby's
// backends, or restarted it, since it was last used), or a new one.
func (p *WaitForProxy) sideConn(ctx context.Context) (*pgx.Conn, error) {
	for {
		p.mu.Lock()
		n := len(p.side)
		if n == 0 {
			p.mu.Unlock()
			return pgx.Connect(ctx, p.opts.DSN)
		}
		c := p.side[n-1]
		p.side = p.side[:n-1]
		p.mu.Unlock()
		if err := c.Ping(ctx); err == nil {
			return c, nil
		}
		c.Close(context.Background())
	}
}

// putSide gives a connection back, or closes it after an error.
func (p *WaitForProxy) putSide(c *pgx.Conn, err error) {
	if err != nil || c.IsClosed() {
		c.Close(context.Background())
		return
	}
	p.mu.Lock()
	p.side = append(p.side, c)
	p.mu.Unlock()
}

// waitStmt is a parsed WAIT FOR.
type waitStmt struct {
	target  lsn.LSN
	mode    string
	timeout time.Duration // 0: none
	noThrow bool
	bad     *pgproto3.ErrorResponse // refused as written (TIMEOUT out of range)
}

// wfSession is one client connection through the proxy.
type wfSession struct {
	p              *WaitForProxy
	client, server net.Conn
	started        chan struct{} // the startup phase is over; the backend may read
	startOnce      sync.Once

	wmu sync.Mutex    // whole messages to the client, from either side
	out *bufio.Writer // the client, under wmu

	mu         sync.Mutex
	cond       *sync.Cond
	pendingRFQ int  // ReadyForQuery messages the server still owes
	txStatus   byte // from the last ReadyForQuery
	drop       int  // ParseComplete/BindComplete to drop: a replacement's
	closed     bool

	pid, key    uint32
	inWait      atomic.Bool
	canceled    atomic.Bool
	gone        atomic.Bool   // the client's side of the connection ended
	stmtTimeout time.Duration // statement_timeout given at startup

	// The pipeline segment under way (up to its Sync).
	forwarded bool // something of it reached the server
	failed    bool // an error was raised: the rest goes to the server, which skips it

	stmts, portals map[string]*waitStmt
	pollStmts      map[string]bool
}

// toClient writes the proxy's own messages to the client.
func (s *wfSession) toClient(msgs ...pgproto3.BackendMessage) error {
	var b []byte
	for _, m := range msgs {
		var err error
		if b, err = m.Encode(b); err != nil {
			return err
		}
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if _, err := s.out.Write(b); err != nil {
		return err
	}
	return s.out.Flush()
}

// backend copies the server's messages to the client, a whole message at a
// time, learning the session's key, transaction status and answers owed.
func (s *wfSession) backend() {
	defer func() {
		s.mu.Lock()
		s.closed = true
		s.cond.Broadcast()
		s.mu.Unlock()
		s.p.mu.Lock()
		if s.p.sessions[[2]uint32{s.pid, s.key}] == s {
			delete(s.p.sessions, [2]uint32{s.pid, s.key})
		}
		s.p.mu.Unlock()
	}()
	<-s.started
	if s.out == nil {
		io.Copy(s.client, s.server) // TLS, or the startup failed: opaque
		return
	}
	r := bufio.NewReaderSize(s.server, 64<<10)
	for {
		t, body, err := readMessage(r)
		if err != nil {
			return
		}
		switch t {
		case 'K':
			if len(body) >= 8 {
				s.pid, s.key = binary.BigEndian.Uint32(body), binary.BigEndian.Uint32(body[4:])
				s.p.mu.Lock()
				s.p.sessions[[2]uint32{s.pid, s.key}] = s
				s.p.mu.Unlock()
			}
		case 'S':
			if v := s.p.opts.ServerVersion; v != "" {
				if name, _, ok := strings.Cut(string(body), "\x00"); ok && name == "server_version" {
					body = append([]byte("server_version\x00"+v), 0)
				}
			}
		case '1', '2':
			s.mu.Lock()
			skip := s.drop > 0
			if skip {
				s.drop--
			}
			s.mu.Unlock()
			if skip {
				continue
			}
		}
		s.wmu.Lock()
		var lenb [4]byte
		binary.BigEndian.PutUint32(lenb[:], uint32(len(body)+4))
		s.out.WriteByte(t)
		s.out.Write(lenb[:])
		s.out.Write(body)
		if t == 'Z' || r.Buffered() == 0 {
			err = s.out.Flush()
		}
		s.wmu.Unlock()
		if err != nil {
			return
		}
		if t == 'Z' && len(body) == 1 {
			s.mu.Lock()
			s.txStatus = body[0]
			s.pendingRFQ--
			s.cond.Broadcast()
			s.mu.Unlock()
		}
	}
}

// idle waits until the server owes nothing of what was forwarded before:
// it is idle, and its transaction status is known.
func (s *wfSession) idle() (byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.pendingRFQ > 0 && !s.closed {
		s.cond.Wait()
	}
	return s.txStatus, !s.closed
}

func (s *wfSession) toServer(t byte, body []byte) error {
	if t == 'S' || t == 'Q' || t == 'F' {
		s.mu.Lock()
		s.pendingRFQ++
		s.mu.Unlock()
	}
	msg := make([]byte, 5, 5+len(body))
	msg[0] = t
	binary.BigEndian.PutUint32(msg[1:], uint32(len(body)+4))
	_, err := s.server.Write(append(msg, body...))
	return err
}

// startup handles the client's startup packets: SSL and GSS requests
// (refused or not by the server; a TLS session is then passed through
// opaque), a cancel request (for a session in an emulated wait it is
// taken here), and the startup message, whose statement_timeout it notes.
// It reports whether the session goes on through the message loop.
func (s *wfSession) startup() bool {
	defer s.startOnce.Do(func() { close(s.started) })
	for {
		var hdr [4]byte
		if _, err := io.ReadFull(s.client, hdr[:]); err != nil {
			return false
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n < 8 || n > 1<<20 {
			return false
		}
		pkt := make([]byte, n)
		copy(pkt, hdr[:])
		if _, err := io.ReadFull(s.client, pkt[4:]); err != nil {
			return false
		}
		code := binary.BigEndian.Uint32(pkt[4:])
		switch code {
		case 80877102: // CancelRequest
			if len(pkt) >= 16 {
				key := [2]uint32{binary.BigEndian.Uint32(pkt[8:]), binary.BigEndian.Uint32(pkt[12:])}
				s.p.mu.Lock()
				target := s.p.sessions[key]
				s.p.mu.Unlock()
				if target != nil && target.inWait.Load() {
					target.canceled.Store(true)
					return false
				}
			}
			s.server.Write(pkt)
			return false
		case 80877103, 80877104: // SSLRequest, GSSENCRequest
			if _, err := s.server.Write(pkt); err != nil {
				return false
			}
			var yes [1]byte
			if _, err := io.ReadFull(s.server, yes[:]); err != nil {
				return false
			}
			if _, err := s.client.Write(yes[:]); err != nil {
				return false
			}
			if yes[0] != 'N' {
				s.startOnce.Do(func() { close(s.started) }) // the backend copies opaque bytes
				io.Copy(s.server, s.client)
				return false // encrypted from here on: passed through opaque
			}
			continue
		}
		s.noteStartup(pkt[8:])
		if _, err := s.server.Write(pkt); err != nil {
			return false
		}
		s.out = bufio.NewWriterSize(s.client, 64<<10)
		return true
	}
}

// noteStartup reads statement_timeout from the startup parameters.
func (s *wfSession) noteStartup(params []byte) {
	kv := strings.Split(string(params), "\x00")
	for i := 0; i+1 < len(kv); i += 2 {
		switch kv[i] {
		case "statement_timeout":
			s.stmtTimeout = parseTimeoutGUC(kv[i+1])
		case "options":
			for _, f := range strings.Fields(kv[i+1]) {
				f = strings.TrimPrefix(f, "-c")
				if v, ok := strings.CutPrefix(f, "statement_timeout="); ok {
					s.stmtTimeout = parseTimeoutGUC(v)
				}
			}
		}
	}
}

// parseTimeoutGUC reads a statement_timeout value (ms by default); 0 when
// unreadable.
func parseTimeoutGUC(v string) time.Duration {
	ms, ok := parseMillis(v)
	if !ok || ms <= 0 {
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}

func (s *wfSession) frontend() {
	if !s.startup() {
		return
	}
	// The client's messages are read apart from their handling, so that an
	// emulated wait sees the client go (pgx closes the connection when a
	// context ends, by default) and ends.
	msgs := make(chan clientMsg, 256)
	go func() {
		defer close(msgs)
		defer s.gone.Store(true)
		r := bufio.NewReaderSize(s.client, 64<<10)
		for {
			t, body, err := readMessage(r)
			if err != nil {
				return
			}
			msgs <- clientMsg{t, body}
		}
	}()
	for m := range msgs {
		if err := s.message(m.t, m.body); err != nil {
			s.client.Close()
			for range msgs {
			}
			return
		}
	}
}

type clientMsg struct {
	t    byte
	body []byte
}

// message handles one client message.
func (s *wfSession) message(t byte, body []byte) error {
	if s.failed && t != 'S' {
		return s.toServer(t, body) // the server skips it
	}
	switch t {
	case 'Q':
		return s.query(body)
	case 'P':
		name, rest, ok := cstring(body)
		query, tail, ok2 := cstring(rest)
		if !ok || !ok2 {
			break
		}
		query = rewriteStatRecovery(query)
		if w, isWait := parseWait(query); isWait {
			if s.forwarded {
				s.p.counts.midPipeline.Add(1)
				break
			}
			if _, ok := s.idle(); !ok {
				return io.EOF
			}
			s.stmts[name] = w
			return s.toClient(&pgproto3.ParseComplete{})
		}
		delete(s.stmts, name)
		s.pollStmts[name] = s.p.opts.Polls != nil && s.p.opts.Polls(query)
		if s.pollStmts[name] && !s.forwarded {
			// Parsing takes catalog locks of its own: what the session
			// held before the poll is read now.
			if err := s.notePoll(); err != nil {
				return err
			}
		}
		body = append(append(append([]byte(name), 0), query...), 0)
		body = append(body, tail...)
	case 'B':
		portal, rest, ok := cstring(body)
		stmt, _, ok2 := cstring(rest)
		if !ok || !ok2 {
			break
		}
		if w := s.stmts[stmt]; w != nil {
			s.portals[portal] = w
			return s.toClient(&pgproto3.BindComplete{})
		}
		delete(s.portals, portal)
		if s.pollStmts[stmt] && !s.forwarded {
			// Bind starts the statement (its transaction, its locks):
			// what the session held before it is read now (unless its
			// Parse came first in the segment, and was looked at then).
			if err := s.notePoll(); err != nil {
				return err
			}
		}
	case 'D':
		if len(body) < 2 {
			break
		}
		name, _, _ := cstring(body[1:])
		switch {
		case body[0] == 'S' && s.stmts[name] != nil:
			return s.toClient(&pgproto3.ParameterDescription{}, statusDescription())
		case body[0] == 'P' && s.portals[name] != nil:
			return s.toClient(statusDescription())
		}
	case 'C':
		if len(body) < 2 {
			break
		}
		name, _, _ := cstring(body[1:])
		m := s.stmts
		if body[0] == 'P' {
			m = s.portals
		}
		if m[name] != nil {
			delete(m, name)
			return s.toClient(&pgproto3.CloseComplete{})
		}
	case 'E':
		portal, _, _ := cstring(body)
		if w := s.portals[portal]; w != nil {
			return s.execute(w, false)
		}
	case 'S':
		wasForwarded := s.forwarded || s.failed
		s.forwarded, s.failed = false, false
		if !wasForwarded {
			st, ok := s.idle()
			if !ok {
				return io.EOF
			}
			return s.toClient(&pgproto3.ReadyForQuery{TxStatus: st})
		}
		return s.toServer(t, body)
	case 'H':
		if !s.forwarded {
			return nil // everything of the segment was answered already
		}
	}
	if t != 'X' {
		s.forwarded = true
	}
	return s.toServer(t, body)
}

// query handles a simple Query: a WAIT FOR first in it is answered here,
// the rest forwarded.
func (s *wfSession) query(body []byte) error {
	if len(body) == 0 {
		return s.toServer('Q', body)
	}
	sql := rewriteStatRecovery(string(body[:len(body)-1]))
	first, rest := splitFirst(sql)
	w, isWait := parseWait(first)
	switch {
	case isWait:
		st, ok := s.idle()
		if !ok {
			return io.EOF
		}
		row, perr := s.run(w, st)
		if perr != nil {
			return s.raise(perr, true)
		}
		if err := s.toClient(statusDescription(), statusRow(row), &pgproto3.CommandComplete{CommandTag: []byte("WAIT")}); err != nil {
			return err
		}
		if strings.TrimSpace(rest) == "" {
			st, _ := s.idle()
			return s.toClient(&pgproto3.ReadyForQuery{TxStatus: st})
		}
		return s.toServer('Q', append([]byte(rest), 0))
	case isDoWithWait(sql):
		s.p.counts.topLevelRefusals.Add(1)
		return s.raise(&pgproto3.ErrorResponse{Code: "0A000", Message: "WAIT can only be executed as a top-level statement"}, true)
	case s.p.opts.Polls != nil && s.p.opts.Polls(sql):
		if err := s.notePoll(); err != nil {
			return err
		}
	}
	return s.toServer('Q', append([]byte(sql), 0))
}

// execute runs an emulated wait bound to a portal.
func (s *wfSession) execute(w *waitStmt, simple bool) error {
	st, ok := s.idle()
	if !ok {
		return io.EOF
	}
	row, perr := s.run(w, st)
	if perr != nil {
		return s.raise(perr, simple)
	}
	return s.toClient(statusRow(row), &pgproto3.CommandComplete{CommandTag: []byte("WAIT")})
}

// raise has the server raise e: a DO block of the proxy's own, so that the
// server aborts a transaction block and skips the rest of the segment, as
// it would after the real statement's error. Nothing of the caller's is in
// its text (the message comes from the proxy's own constants and numbers).
func (s *wfSession) raise(e *pgproto3.ErrorResponse, simple bool) error {
	do := fmt.Sprintf("DO $pgtest$BEGIN RAISE EXCEPTION USING ERRCODE = %s, MESSAGE = %s, DETAIL = %s, HINT = %s; END$pgtest$",
		quoteLit(e.Code), quoteLit(e.Message), quoteLit(e.Detail), quoteLit(e.Hint))
	if simple {
		return s.toServer('Q', append([]byte(do), 0))
	}
	s.failed = true
	s.mu.Lock()
	s.drop += 2 // its ParseComplete and BindComplete: the client had the wait's
	s.mu.Unlock()
	parse := append(append([]byte{0}, do...), 0, 0, 0)
	if err := s.toServer('P', parse); err != nil {
		return err
	}
	if err := s.toServer('B', []byte{0, 0, 0, 0, 0, 0, 0, 0}); err != nil {
		return err
	}
	return s.toServer('E', []byte{0, 0, 0, 0, 0})
}

// quoteLit quotes one of the proxy's own strings as an SQL literal.
func quoteLit(v string) string { return "'" + strings.ReplaceAll(v, "'", "''") + "'" }

// notePoll records a replay poll run while the session holds a lock: once
// the server has finished what came before, the session's locks are read.
func (s *wfSession) notePoll() error {
	if _, ok := s.idle(); !ok {
		return io.EOF
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	held, _, err := s.sessionState(ctx, false)
	if err == nil && held != "" {
		s.p.counts.lockedPolls.Add(1)
		s.note("poll", held)
	}
	return nil
}

// sessionState reads, on a connection of the proxy's own, the locks the
// session's backend holds (other than its virtual transaction id; "" for
// none) and, with snap, whether it holds a snapshot.
func (s *wfSession) sessionState(ctx context.Context, snap bool) (locks string, snapshot bool, err error) {
	c, err := s.p.sideConn(ctx)
	if err != nil {
		return "", false, err
	}
	err = c.QueryRow(ctx, `SELECT coalesce((SELECT string_agg(locktype || ' ' || coalesce(relation::regclass::text, objid::text, '') || ' ' || mode, ', ')
		FROM pg_locks WHERE pid = $1 AND granted AND locktype <> 'virtualxid'), ''),
		$2 AND EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND backend_xmin IS NOT NULL)`, int32(s.pid), snap).Scan(&locks, &snapshot)
	s.p.putSide(c, err)
	return locks, snapshot, err
}

// replayed reads, on a connection of the proxy's own, whether the standby
// is in recovery and the position mode follows.
func (s *wfSession) replayed(ctx context.Context, c *pgx.Conn, mode string) (inRecovery bool, at lsn.LSN, err error) {
	q := `SELECT pg_is_in_recovery(), coalesce(pg_last_wal_replay_lsn()::text, '0/0')`
	switch mode {
	case "standby_flush":
		q = `SELECT pg_is_in_recovery(), coalesce(pg_last_wal_receive_lsn()::text, '0/0')`
	case "standby_write":
		q = `SELECT pg_is_in_recovery(), coalesce((SELECT written_lsn::text FROM pg_stat_wal_receiver), '0/0')`
	}
	var pos string
	if err = c.QueryRow(ctx, q).Scan(&inRecovery, &pos); err != nil {
		return false, 0, err
	}
	at, err = lsn.Parse(pos)
	return inRecovery, at, err
}

// run is the emulated statement: its status row, or the error it raises.
func (s *wfSession) run(w *waitStmt, txStatus byte) (string, *pgproto3.ErrorResponse) {
	c := &s.p.counts
	if txStatus == 'E' {
		c.abortedTx.Add(1)
		return "", &pgproto3.ErrorResponse{Code: "25P02", Message: "current transaction is aborted, commands ignored until end of transaction block"}
	}
	c.emulated.Add(1)
	if w.bad != nil {
		c.rangeErrs.Add(1)
		return "", w.bad
	}
	s.canceled.Store(false)
	s.inWait.Store(true)
	defer s.inWait.Store(false)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	held, snapshot, err := s.sessionState(ctx, txStatus == 'T')
	if err != nil {
		return "", internalError(err)
	}
	locks := held != ""
	if locks {
		c.lockedWaits.Add(1)
		s.note("wait", held)
	}
	if snapshot {
		c.snapshotRefusals.Add(1)
		return "", &pgproto3.ErrorResponse{Code: "55000", Message: "WAIT must be called without an active or registered snapshot",
			Detail: "Make sure WAIT isn't called within a transaction with an isolation level higher than READ COMMITTED, procedure, or a function."}
	}
	side, err := s.p.sideConn(ctx)
	if err != nil {
		return "", internalError(err)
	}
	defer func() { s.p.putSide(side, err) }()
	for first := true; ; first = false {
		var in bool
		var at lsn.LSN
		in, at, err = s.replayed(ctx, side, w.mode)
		if err != nil {
			return "", internalError(err)
		}
		switch {
		case s.gone.Load():
			return "", internalError(errors.New("the client went away"))
		case s.canceled.Load():
			c.cancels.Add(1)
			return "", &pgproto3.ErrorResponse{Code: "57014", Message: "canceling statement due to user request"}
		case !in:
			c.notInRecovery.Add(1)
			if w.noThrow {
				return "not in recovery", nil
			}
			return "", &pgproto3.ErrorResponse{Code: "55000", Message: "recovery is not in progress",
				Hint: "Waiting for the standby_replay LSN can only be executed during recovery."}
		case at >= w.target:
			c.success.Add(1)
			return "success", nil
		case first && locks:
			c.lockRefusals.Add(1)
			return "", &pgproto3.ErrorResponse{Code: "55000", Message: "cannot wait for a standby LSN while holding locks",
				Detail: fmt.Sprintf("Process %d holds a heavyweight lock.", s.pid),
				Hint:   "Release the locks, or execute WAIT FOR before acquiring them."}
		case s.stmtTimeout > 0 && time.Since(start) >= s.stmtTimeout:
			c.statementTimeouts.Add(1)
			return "", &pgproto3.ErrorResponse{Code: "57014", Message: "canceling statement due to statement timeout"}
		case w.timeout > 0 && time.Since(start) >= w.timeout:
			c.timeouts.Add(1)
			if w.noThrow {
				return "timeout", nil
			}
			return "", &pgproto3.ErrorResponse{Code: "57014",
				Message: fmt.Sprintf("timed out while waiting for target LSN %s to be replayed; current %s LSN %s", w.target, w.mode, at)}
		}
		time.Sleep(500 * time.Microsecond)
	}
}

func internalError(err error) *pgproto3.ErrorResponse {
	return &pgproto3.ErrorResponse{Code: "XX000", Message: "pgtest WAIT FOR emulation failed: " + err.Error()}
}

func statusDescription() *pgproto3.RowDescription {
	return &pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("status"), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1}}}
}

func statusRow(v string) *pgproto3.DataRow { return &pgproto3.DataRow{Values: [][]byte{[]byte(v)}} }

// cstring splits a NUL-terminated string off b.
func cstring(b []byte) (string, []byte, bool) {
	for i, c := range b {
		if c == 0 {
			return string(b[:i]), b[i+1:], true
		}
	}
	return "", nil, false
}

// rewriteStatRecovery points pg_catalog.pg_stat_recovery at the stand-in.
func rewriteStatRecovery(sql string) string {
	if !strings.Contains(sql, "pg_stat_recovery") {
		return sql
	}
	return strings.ReplaceAll(sql, "pg_catalog.pg_stat_recovery", "public.pgtest_stat_recovery()")
}

var waitInBodyRE = regexp.MustCompile(`(?i)\bWAIT\s+FOR\s+LSN\b`)

// isDoWithWait reports a DO block whose body holds a WAIT FOR LSN.
func isDoWithWait(sql string) bool {
	toks := sqlTokens(sql, 1)
	return len(toks) == 1 && strings.EqualFold(toks[0], "DO") && waitInBodyRE.MatchString(sql)
}

// splitFirst splits a simple Query's text after its first statement (at a
// semicolon outside quotes and comments).
func splitFirst(sql string) (first, rest string) {
	for i := 0; i < len(sql); i++ {
		switch c := sql[i]; {
		case c == '\'' || c == '"':
			j := strings.IndexByte(sql[i+1:], c)
			if j < 0 {
				return sql, ""
			}
			i += j + 1
		case c == '-' && strings.HasPrefix(sql[i:], "--"):
			j := strings.IndexByte(sql[i:], '\n')
			if j < 0 {
				return sql, ""
			}
			i += j
		case c == '/' && strings.HasPrefix(sql[i:], "/*"):
			j := strings.Index(sql[i:], "*/")
			if j < 0 {
				return sql, ""
			}
			i += j + 1
		case c == '$':
			// A dollar-quoted body: the statement runs to its end.
			j := strings.IndexByte(sql[i+1:], '$')
			if j < 0 {
				return sql, ""
			}
			tag := sql[i : i+j+2]
			k := strings.Index(sql[i+j+2:], tag)
			if k < 0 {
				return sql, ""
			}
			i += j + 2 + k + len(tag) - 1
		case c == ';':
			return sql[:i], sql[i+1:]
		}
	}
	return sql, ""
}

// sqlTokens returns up to n tokens of sql: words, numbers, quoted strings
// (with their quotes), and single punctuation characters; comments and
// white space are skipped.
func sqlTokens(sql string, n int) []string {
	var out []string
	for i := 0; i < len(sql) && len(out) < n; {
		c := sql[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case strings.HasPrefix(sql[i:], "--"):
			j := strings.IndexByte(sql[i:], '\n')
			if j < 0 {
				return out
			}
			i += j
		case strings.HasPrefix(sql[i:], "/*"):
			j := strings.Index(sql[i:], "*/")
			if j < 0 {
				return out
			}
			i += j + 2
		case c == '\'':
			j := i + 1
			for j < len(sql) {
				if sql[j] == '\'' {
					if j+1 < len(sql) && sql[j+1] == '\'' {
						j += 2
						continue
					}
					break
				}
				j++
			}
			if j >= len(sql) {
				return append(out, sql[i:])
			}
			out = append(out, sql[i:j+1])
			i = j + 1
		case isWordByte(c):
			j := i
			for j < len(sql) && isWordByte(sql[j]) {
				j++
			}
			out = append(out, sql[i:j])
			i = j
		default:
			out = append(out, sql[i:i+1])
			i++
		}
	}
	return out
}

func isWordByte(c byte) bool {
	return c == '_' || c == '.' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// parseWait reads a WAIT FOR LSN statement. isWait is false for anything
// else (and for text it cannot read, which the server then refuses as a
// syntax error); a statement it reads whose TIMEOUT is out of range comes
// back with bad set, raised when it runs.
func parseWait(sql string) (w *waitStmt, isWait bool) {
	toks := sqlTokens(sql, 1000)
	if len(toks) < 4 || !strings.EqualFold(toks[0], "WAIT") || !strings.EqualFold(toks[1], "FOR") || !strings.EqualFold(toks[2], "LSN") {
		return nil, false
	}
	target, ok := unquote(toks[3])
	if !ok {
		return nil, false
	}
	l, err := lsn.Parse(target)
	if err != nil {
		return nil, false
	}
	w = &waitStmt{target: l, mode: "standby_replay"}
	rest := toks[4:]
	if len(rest) > 0 && rest[len(rest)-1] == ";" {
		rest = rest[:len(rest)-1]
	}
	if len(rest) == 0 {
		return w, true
	}
	if len(rest) < 3 || !strings.EqualFold(rest[0], "WITH") || rest[1] != "(" || rest[len(rest)-1] != ")" {
		return nil, false
	}
	opts := rest[2 : len(rest)-1]
	for len(opts) > 0 {
		name := strings.ToLower(opts[0])
		var val string
		j := 1
		if j < len(opts) && opts[j] != "," {
			val = opts[j]
			j++
		}
		if j < len(opts) {
			if opts[j] != "," {
				return nil, false
			}
			j++
		}
		opts = opts[j:]
		switch name {
		case "no_throw":
			w.noThrow = true
		case "mode":
			m, _ := unquote(val)
			switch m = strings.ToLower(m); m {
			case "standby_replay", "standby_write", "standby_flush":
				w.mode = m
			default:
				w.bad = &pgproto3.ErrorResponse{Code: "22023", Message: "unrecognized value for WAIT option \"mode\""}
			}
		case "timeout":
			v, _ := unquote(val)
			ms, ok := parseMillis(v)
			switch {
			case !ok:
				w.bad = &pgproto3.ErrorResponse{Code: "22023", Message: "invalid timeout value for WAIT"}
			case ms < 0 || ms > math.MaxInt32:
				w.bad = &pgproto3.ErrorResponse{Code: "22023", Message: "timeout value for WAIT out of range",
					Detail: "The timeout must be between 0 and 2147483647 milliseconds."}
			default:
				w.timeout = time.Duration(ms) * time.Millisecond
			}
		default:
			return nil, false
		}
	}
	return w, true
}

// unquote reads a token as a string literal, or takes a bare number or word
// as it is.
func unquote(tok string) (string, bool) {
	if len(tok) >= 2 && tok[0] == '\'' && tok[len(tok)-1] == '\'' {
		return strings.ReplaceAll(tok[1:len(tok)-1], "''", "'"), true
	}
	return tok, tok != ""
}

// parseMillis reads a time value as a GUC of unit ms does: a number, a
// fraction allowed, and an optional unit (us, ms, s, min, h, d), rounded to
// the nearest millisecond, half to even. ok is false for anything else.
func parseMillis(v string) (int64, bool) {
	v = strings.TrimSpace(v)
	i := 0
	for i < len(v) && (v[i] >= '0' && v[i] <= '9' || v[i] == '.' || i == 0 && (v[i] == '-' || v[i] == '+')) {
		i++
	}
	var f float64
	if _, err := fmt.Sscan(v[:i], &f); err != nil || i == 0 {
		return 0, false
	}
	unit := map[string]float64{"": 1, "us": 0.001, "ms": 1, "s": 1000, "min": 60000, "h": 3600000, "d": 86400000}
	mul, ok := unit[strings.TrimSpace(v[i:])]
	if !ok {
		return 0, false
	}
	ms := math.RoundToEven(f * mul)
	if ms > math.MaxInt64/2 || ms < math.MinInt64/2 {
		return math.MaxInt64 / 2, true
	}
	return int64(ms), true
}
