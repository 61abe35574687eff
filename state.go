package pgryw

import (
	"context"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pgryw/pgryw/internal/sqlclass"
	"github.com/pgryw/pgryw/internal/wire"
)

// Session state: what a connection's primary session holds that later
// statements depend on.
//
// A statement that touches session state (sqlclass.Result.Pin) runs on the
// primary. Riding behind it, in the same flush, pgryw reads back from the
// server what state the session now holds (sqlState): session advisory
// locks, LISTEN channels, temporary tables, SQL-level prepared statements,
// cursors WITH HOLD, and every session-level setting. While any of the
// first five lives, the connection is pinned: its reads run on the primary.
// Once none does, reads go back to replicas. Settings do not pin: each
// replica connection gets the same settings, riding in front of its next
// read, whenever they changed (sqlApplySettings). A setting a standby
// refuses (a default of SERIALIZABLE) pins while it is set. What the text
// cannot tell or the server cannot show pins for the connection's life:
// set_config with a computed name until DISCARD ALL, LOAD and setseed for
// good.
//
// While pinned, every statement that is not a read gets the read-back too
// (DROP TABLE may drop the last temporary table; a function may release a
// lock). A statement inside a transaction block cannot carry it (it would
// run inside the block); the state is then read back when the block ends,
// and the connection is pinned until then.

// pinReason is a set of reasons a connection's reads stay on the primary.
type pinReason uint16

const (
	pinLock      pinReason = 1 << iota // a session advisory lock is held
	pinListen                          // LISTEN on some channel
	pinTemp                            // a temporary table (or other temporary relation) exists
	pinPrepared                        // a PREPAREd statement exists
	pinCursor                          // a cursor WITH HOLD is open
	pinSettings                        // a setting a standby refuses, or that a replica did not take
	pinUntracked                       // set_config with a computed name: until DISCARD ALL
	pinPermanent                       // LOAD or setseed: for the connection's life
	pinUnread                          // state changed and has not been read back yet

	numPinReasons = iota
)

// pinReasonNames name the reasons in Stats.PinnedBy and in log lines.
var pinReasonNames = [numPinReasons]string{
	"advisory lock", "LISTEN", "temporary table", "prepared statement", "cursor WITH HOLD",
	"setting a standby refuses", "set_config with a computed name", "LOAD or setseed", "state not read back yet",
}

// readBack are the reasons a read-back answers (and clears).
const readBack = pinLock | pinListen | pinTemp | pinPrepared | pinCursor | pinSettings | pinUnread

func (p pinReason) names() []string {
	var out []string
	for i := range numPinReasons {
		if p&(1<<i) != 0 {
			out = append(out, pinReasonNames[i])
		}
	}
	return out
}

// Statements pgryw sends to read and carry session state. Neither carries
// caller text: parameter names and values travel as bind parameters.
const (
	// sqlState reads the session state that pins, and every session-level
	// setting: pg_settings lists those set in the session (but for the
	// transaction_* ones, which last one transaction), and $1 names
	// more that it does not list (role, session_authorization and custom
	// parameters such as app.tenant, as SET and set_config named them).
	// Its functions, types and operators are pg_catalog's: it runs in the
	// application's session, whose search_path may put another schema
	// first.
	sqlState = `SELECT` +
		` (SELECT pg_catalog.count(*) FROM pg_catalog.pg_locks WHERE locktype OPERATOR(pg_catalog.=) 'advisory' AND pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()),` +
		` (SELECT pg_catalog.count(*) FROM pg_catalog.pg_listening_channels()),` +
		` (SELECT pg_catalog.count(*) FROM pg_catalog.pg_class WHERE relnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()),` +
		` (SELECT pg_catalog.count(*) FROM pg_catalog.pg_prepared_statements WHERE from_sql),` +
		` (SELECT pg_catalog.count(*) FROM pg_catalog.pg_cursors WHERE is_holdable),` +
		` (SELECT pg_catalog.json_agg(pg_catalog.json_build_array(n, v) ORDER BY n) FROM` +
		` (SELECT n, pg_catalog.current_setting(n, true) FROM` +
		` (SELECT pg_catalog.lower(name) FROM pg_catalog.pg_settings WHERE source OPERATOR(pg_catalog.=) 'session'` +
		` AND name OPERATOR(pg_catalog.<>) ALL ('{transaction_isolation,transaction_read_only,transaction_deferrable}'::pg_catalog.text[])` +
		` UNION SELECT pg_catalog.lower(t) FROM pg_catalog.unnest($1::pg_catalog.text[]) t) s(n)) x(n, v)` +
		` WHERE v IS NOT NULL)`
	// sqlApplySettings sets each parameter of $1 to the value at the same
	// place in $2 on a replica session, in order; a NULL value resets it.
	// The calls run in one implicit transaction: all take or none does.
	sqlApplySettings = `SELECT pg_catalog.count(pg_catalog.set_config(n, v, false)) FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.text[])) AS s(n, v)`

	stmtState    = "pgryw_state"
	stmtSettings = "pgryw_settings"
)

// settings are the session-level run-time parameters of a connection's
// primary session, as last read back; replicas get the same.
type settings struct {
	names, values []string // in the order they must be applied
	version       uint64   // bumped when they change; 0: none ever
	refused       uint64   // the version a replica would not take; 0: none
	tracked       []string // names SET, RESET or set_config named (sqlState's $1)
}

// settingsVersions numbers every change of any connection's settings: a
// replica connection lent from one Conn to another (lendPool) has the
// settings of a version of the first's, which no other Conn's equals, so
// armSettings gives it the second's, resetting the rest.
var settingsVersions atomic.Uint64

// applied is what a replica connection's session was given.
type applied struct {
	version uint64
	names   []string
	pending []string // names being applied by an injection in flight
}

// touchesState reports whether a statement changes session state the
// read-back can see (currval and DISCARD PLANS only read or drop caches).
func touchesState(cls *sqlclass.Result) bool {
	return cls.Pin && cls.State&^(sqlclass.StateSequence|sqlclass.StatePermanent|sqlclass.StateUntracked) != 0 ||
		cls.State&sqlclass.StateUntracked != 0
}

// needsReadBack reports whether the session state must be read back after
// a statement on the primary.
func (cn *Conn) needsReadBack(cls *sqlclass.Result) bool {
	return touchesState(cls) || cn.pins&pinUnread != 0 || cn.pins&readBack != 0 && !cn.c.readOnly(cls)
}

// track adds the parameters a statement names to those the read-back asks
// for. transaction_isolation, transaction_read_only and
// transaction_deferrable are left out: they last one transaction, and a
// standby refuses transaction_read_only = off.
func (cn *Conn) track(cls *sqlclass.Result) {
	for _, n := range cls.Settings {
		if !strings.HasPrefix(n, "transaction_") && !slices.Contains(cn.sess.set.tracked, n) {
			cn.sess.set.tracked = append(cn.sess.set.tracked, n)
		}
	}
}

// armReadBack readies the read-back of session state behind a statement
// about to run on the primary, when it needs one and the connection is sure
// to be outside a transaction block afterwards. It returns the injection,
// and whether a read-back was needed at all.
func (cn *Conn) armReadBack(cls *sqlclass.Result, idleBefore bool) (*wire.Injection, bool) {
	cn.track(cls)
	if !cn.needsReadBack(cls) {
		return nil, false
	}
	w := cn.primary
	if w.wire == nil || !endsIdle(cls, idleBefore) || w.peer.TxPooled {
		// Unread: the connection's reads stay on the primary. Behind a
		// transaction pooler that is where pgx would run them, with
		// whatever session state the server connection they reach has.
		return nil, true
	}
	inj := w.injectPrepared(&w.state, stmtState, sqlState, textArray(cn.sess.set.tracked, nil))
	w.wire.AppendAfterExec(inj)
	return inj, true
}

// settleReadBack takes in what a statement on the primary did to session
// state (err is its outcome), from the read-back riding behind it.
func (cn *Conn) settleReadBack(ctx context.Context, ws *primaryStmt, err error) {
	if inj := ws.state; inj != nil && !inj.Sent() {
		// It rides behind the first of pgx's writes that executes: none
		// did (pgx's Parse failed), so the state is as it was.
		cn.primary.wire.Disarm()
		return
	}
	cls := &ws.cls
	pins := cn.pins
	if cls.State&sqlclass.StateDiscardAll != 0 && err == nil {
		pins &^= pinUntracked
	}
	if cls.State&sqlclass.StateUntracked != 0 {
		pins |= pinUntracked // err or not: a string may have set it first
	}
	if cls.State&sqlclass.StatePermanent != 0 {
		pins |= pinPermanent
	}
	if ws.readBack {
		pins |= pinUnread
		if inj := ws.state; inj != nil && cn.await(ctx, cn.primary, inj) {
			if ierr := inj.Err(); ierr != nil {
				cn.primary.injectionFailed(stmtState, ierr)
			} else if got, ok := cn.readState(inj); ok {
				pins = pins&^readBack | got
			}
		}
	}
	cn.setPins(pins, cls.Reason)
}

// readState reads sqlState's row: the reasons to pin, and the settings,
// which it records.
func (cn *Conn) readState(inj *wire.Injection) (pinReason, bool) {
	row, null := inj.Row()
	if len(row) != 6 {
		return 0, false
	}
	var pins pinReason
	for i, r := range [...]pinReason{pinLock, pinListen, pinTemp, pinPrepared, pinCursor} {
		n, err := strconv.ParseInt(row[i], 10, 64)
		if err != nil {
			return 0, false
		}
		if n > 0 {
			pins |= r
		}
	}
	var pairs [][2]string
	if !null[5] {
		if err := json.Unmarshal([]byte(row[5]), &pairs); err != nil {
			return 0, false
		}
	}
	// SET SESSION AUTHORIZATION resets the role, so it goes first.
	slices.SortStableFunc(pairs, func(a, b [2]string) int { return applyRank(a[0]) - applyRank(b[0]) })
	set := &cn.sess.set
	names, values := make([]string, len(pairs)), make([]string, len(pairs))
	for i, p := range pairs {
		names[i], values[i] = p[0], p[1]
		if refusedByStandbys(p[0], p[1]) {
			pins |= pinSettings
		}
	}
	if !slices.Equal(names, set.names) || !slices.Equal(values, set.values) {
		set.names, set.values = names, values
		set.version = settingsVersions.Add(1)
	}
	if set.refused != 0 && set.refused == set.version {
		pins |= pinSettings
	}
	return pins, true
}

func applyRank(name string) int {
	switch name {
	case "session_authorization":
		return 0
	case "role":
		return 1
	}
	return 2
}

// refusedByStandbys reports a setting with which a standby refuses to run
// transactions: it is not carried to replicas, and pins while it is set.
func refusedByStandbys(name, value string) bool {
	return name == "default_transaction_isolation" && strings.EqualFold(value, "serializable")
}

// setPins records the connection's reasons to stay on the primary, keeps
// the connector's gauges, and logs when the connection becomes pinned or is
// released. why is the statement's kind (never its text).
func (cn *Conn) setPins(p pinReason, why string) {
	old := cn.pins
	if p == old {
		return
	}
	cn.pins = p
	s := &cn.c.stats
	for i := range numPinReasons {
		bit := pinReason(1) << i
		switch {
		case p&bit != 0 && old&bit == 0:
			s.pinnedBy[i].Add(1)
		case p&bit == 0 && old&bit != 0:
			s.pinnedBy[i].Add(-1)
		}
	}
	switch {
	case old == 0:
		s.pinned.Add(1)
		cn.c.logAt(slog.LevelInfo, "pgryw: connection pinned to the primary: its reads stay there while session state lives",
			slog.String("reasons", strings.Join(p.names(), ", ")), slog.String("statement", why))
	case p == 0:
		s.pinned.Add(-1)
		cn.c.logAt(slog.LevelInfo, "pgryw: connection released: its reads go to replicas again",
			slog.String("statement", why))
	}
}

// sqlReset is DISCARD ALL without DEALLOCATE ALL, which would drop pgx's
// own prepared statements behind its back (PREPAREd ones are dropped
// through pgx, see resetState). One simple query: it runs as one implicit
// transaction, in which each of these may run.
const sqlReset = "CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; UNLISTEN *; " +
	"SELECT pg_catalog.pg_advisory_unlock_all(); DISCARD PLANS; DISCARD TEMP; DISCARD SEQUENCES"

// resetState makes the connection's session clean for its next user
// (reset_session=on), when its last user left state behind: at once, with
// a round trip, when that state holds others up (advisory locks) or is
// not known; else riding in front of its next statement on the primary.
// Replica connections are given the clean settings with their next read.
func (cn *Conn) resetState(ctx context.Context) error {
	set := &cn.sess.set
	opaque := cn.opaqueCall
	if cn.pins&^pinPermanent == 0 && len(set.names) == 0 && len(set.tracked) == 0 && !opaque {
		return nil
	}
	cn.opaqueCall = false
	w := cn.primary
	if w.wire == nil {
		return nil
	}
	if w.peer.TxPooled {
		// Behind a transaction pooler the reset would run on whichever
		// server connection it reached, another client's: the session
		// state is the pooler's (its server_reset_query, if any).
		cn.dropSessionState(cn.pins&pinPermanent, "reset_session")
		return nil
	}
	if cn.pins&(pinLock|pinPrepared|pinUnread) != 0 || opaque {
		// (What a function's code did not show may be an advisory lock.)
		if err := cn.checkPrimary(ctx); err != nil {
			return err
		}
		if cn.primary != w {
			return nil // replaced: a new session has nothing to reset
		}
		if _, _, err := w.control(ctx, sqlReset+"; SELECT 1"); err != nil {
			return driver.ErrBadConn // database/sql closes it
		}
		if cn.pins&(pinLock|pinPrepared|pinUnread) != 0 { // (not for an opaque call alone: pgx's statements stay)
			if sc, ok := w.conn.(*stdlib.Conn); ok {
				if err := sc.Conn().DeallocateAll(ctx); err != nil {
					return driver.ErrBadConn
				}
			}
			w.forgetPrepared()
		}
	} else {
		cn.resetPending = true
	}
	cn.dropSessionState(cn.pins&pinPermanent, "reset_session")
	return nil
}

// readBackNow reads the session's state back with a round trip of its
// own (the read-back riding behind SELECT 1), for what pgryw did not route
// (a pool hook's statements). Where it cannot, the connection's reads stay
// on the primary until a read-back rides behind a statement there.
func (cn *Conn) readBackNow(ctx context.Context, why string) {
	w := cn.primary
	pins := cn.pins | pinUnread
	if w.wire != nil && !w.peer.TxPooled && w.idle() {
		inj := w.injectPrepared(&w.state, stmtState, sqlState, textArray(cn.sess.set.tracked, nil))
		w.wire.AppendAfterExec(inj)
		_, _, err := w.control(ctx, "SELECT 1")
		answered := err == nil && cn.await(ctx, w, inj)
		w.wire.Disarm()
		switch {
		case answered && inj.Err() != nil:
			w.injectionFailed(stmtState, inj.Err())
		case answered:
			if got, ok := cn.readState(inj); ok {
				pins = pins&^readBack | got
			}
		}
	}
	cn.setPins(pins, why)
}

// dropSessionState forgets the session's settings (replica connections are
// given the change with their next read) and leaves pins as its pins: the
// session was reset, or replaced by a new one. why is for the log.
func (cn *Conn) dropSessionState(pins pinReason, why string) {
	set := &cn.sess.set
	set.names, set.values, set.tracked = nil, nil, nil
	set.version = settingsVersions.Add(1)
	cn.setPins(pins, why)
}

// armReset puts a pending reset in front of the statement about to run on
// the primary.
func (cn *Conn) armReset() *wire.Injection {
	w := cn.primary
	if w.peer.TxPooled {
		cn.resetPending = false // (set before the connection turned out to be behind one: resetState)
		return nil
	}
	if !cn.resetPending || w.wire == nil || !w.idle() {
		return nil
	}
	cn.resetPending = false
	inj := &w.reset
	inj.Reset(sqlReset)
	w.wire.Prefix(inj)
	return inj
}

// settleReset reads the reset's answer. When it did not run (the
// statement behind it never went out), it is pending again; when it
// failed, the session state is read back after the next statement.
func (cn *Conn) settleReset(ctx context.Context, inj *wire.Injection) {
	if inj == nil {
		return
	}
	if !inj.Sent() {
		cn.resetPending = true
		return
	}
	if !cn.await(ctx, cn.primary, inj) || inj.Err() != nil {
		cn.setPins(cn.pins|pinUnread, "reset_session")
	}
}

// armSettings readies the connection's settings on replica connection b, in
// front of the read about to be sent, when b does not have them yet.
func (cn *Conn) armSettings(b *backend) *wire.Injection {
	set := &cn.sess.set
	if b.wire == nil || b.applied.version == set.version || b.peer.TxPooled {
		return nil
	}
	// The names the session had and will not keep are reset first
	// (session_authorization and role before the rest: resetting either
	// resets the role), then the connection's own are set, in their order:
	// a reset after them would undo a SET ROLE of theirs, and a lent
	// connection's last user may have had another role.
	var keep, keepValues []string
	for i, n := range set.names {
		if !refusedByStandbys(n, set.values[i]) {
			keep, keepValues = append(keep, n), append(keepValues, set.values[i])
		}
	}
	var names, values []string
	var null []bool
	for _, n := range b.applied.names {
		if !slices.Contains(keep, n) {
			names, values, null = append(names, n), append(values, ""), append(null, true)
		}
	}
	slices.SortStableFunc(names, func(a, b string) int { return applyRank(a) - applyRank(b) })
	resets := len(names)
	names, values = append(names, keep...), append(values, keepValues...)
	null = append(null, make([]bool, len(keep))...)
	if len(names) == 0 {
		b.applied = applied{version: set.version}
		return nil
	}
	b.applied.pending = names[resets:] // what the session has once they take
	for _, n := range names {
		// A custom parameter (app.tenant) stays defined in the session
		// once set, as '' after a reset where a new session has none:
		// the connection is not lent to another Conn (releaseReplicas).
		b.custom = b.custom || strings.Contains(n, ".")
	}
	inj := b.injectPrepared(&b.state, stmtSettings, sqlApplySettings, textArray(names, nil), textArray(values, null))
	b.wire.Prefix(inj)
	return inj
}

// settledSettings reads the answer to armSettings' injection once the read
// behind it has run, and reports whether the replica refused the settings
// (the read's answer must then be thrown away).
func (cn *Conn) settledSettings(b *backend, inj *wire.Injection) (refused bool) {
	if inj == nil || !inj.Sent() || !inj.Done() {
		return false // not sent, or the connection failed: the read did too
	}
	if err := inj.Err(); err != nil {
		if ended, _ := b.endedIdle(); ended {
			// The server ended the session for idleness as the read went
			// out: no refusal (the read is sent again elsewhere).
			return false
		}
		b.injectionFailed(stmtSettings, err)
		cn.c.logAt(slog.LevelWarn, "pgryw: a replica did not take the connection's settings; its reads stay on the primary",
			slog.String("replica", b.node.addr), slog.String("error", safeErr(err)))
		return true
	}
	b.applied = applied{version: cn.sess.set.version, names: b.applied.pending}
	return false
}

// safeErr describes an error for a log line by its SQLSTATE alone: the
// server's message about a setting quotes the value, which may be secret.
func safeErr(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return "SQLSTATE " + pgErr.Code
	}
	return "not a server error"
}

// textArray formats vals as a PostgreSQL text[] literal for a text-format
// bind parameter; null marks NULL elements (nil: none).
func textArray(vals []string, null []bool) []byte {
	b := []byte{'{'}
	for i, v := range vals {
		if i > 0 {
			b = append(b, ',')
		}
		if null != nil && null[i] {
			b = append(b, "NULL"...)
			continue
		}
		b = append(b, '"')
		for j := 0; j < len(v); j++ {
			if v[j] == '"' || v[j] == '\\' {
				b = append(b, '\\')
			}
			b = append(b, v[j])
		}
		b = append(b, '"')
	}
	return append(b, '}')
}
