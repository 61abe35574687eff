package pgryw

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgryw/pgryw/internal/wire"

	"github.com/pgryw/pgryw/internal/lsn"
)

// The check statements, pgryw's own: none carries caller text (LSNs and
// timeouts are formatted from parsed numbers).
const (
	// pg_is_in_recovery in the same query: a promoted standby keeps reporting
	// its last replay position, so the position alone cannot tell promotion
	// from lag.
	sqlPoll = "SELECT pg_catalog.pg_last_wal_replay_lsn(), pg_catalog.pg_is_in_recovery()"
	// sqlRecovery is the monitor's probe on PostgreSQL 19 and later: the
	// pg_stat_recovery view has the replay position, its timeline and
	// whether a promotion is pending in one row, read at once. It has no
	// row when the node is not in recovery, nor for a role without
	// pg_read_all_stats: then the functions answer (position only).
	sqlRecovery = "SELECT pg_catalog.pg_is_in_recovery(), COALESCE(r.last_replayed_end_lsn, pg_catalog.pg_last_wal_replay_lsn())," +
		" r.last_replayed_tli, r.promote_triggered FROM (SELECT) AS one LEFT JOIN pg_catalog.pg_stat_recovery AS r ON true"
	// sqlCheck is sqlPoll as a check chained in front of a read, in the
	// read's implicit transaction, with that transaction's isolation
	// level. Under READ COMMITTED each statement takes a snapshot of its
	// own, so the read's is taken after the poll read the replay position,
	// and has everything replayed by then. Under REPEATABLE READ or
	// SERIALIZABLE (a default of the session's, role's or server's) the
	// poll's own Bind (its Parse, unprepared) took the transaction's
	// snapshot before it read the position: a position that reached the
	// watermark then says nothing of the snapshot, and the check is not
	// used (checked).
	sqlCheck = "SELECT pg_catalog.pg_last_wal_replay_lsn(), pg_catalog.pg_is_in_recovery(), pg_catalog.current_setting('transaction_isolation')"
)

// stmtPoll and stmtCheck name sqlPoll and sqlCheck, prepared on replica
// connections.
const (
	stmtPoll  = "pgryw_poll"
	stmtCheck = "pgryw_check"
)

// snapshotPerStatement reports whether a transaction at isolation level
// iso (transaction_isolation's text) takes a snapshot per statement: READ
// COMMITTED, and READ UNCOMMITTED, which PostgreSQL runs as READ
// COMMITTED.
func snapshotPerStatement(iso string) bool {
	return iso == "read committed" || iso == "read uncommitted"
}

// waitForSQL builds the PostgreSQL 19 wait
// (https://www.postgresql.org/docs/19/sql-wait.html). WAIT FOR is a utility
// statement and takes no parameters, so both operands are interpolated,
// from an LSN integer and a duration we hold.
//
// TIMEOUT is an integer number of milliseconds, 0 to 2147483647, fractions
// rounded: 0 (and so 0.5 ms or less) means no timeout at all, and 2^31 ms
// or more is refused. The budget is sent in whole milliseconds, at least 1
// and at most maxWaitForTimeout.
func waitForSQL(target lsn.LSN, budget time.Duration) string {
	return fmt.Sprintf("WAIT FOR LSN '%s' WITH (MODE 'standby_replay', TIMEOUT '%dms', NO_THROW)", target, waitForMillis(budget))
}

// maxWaitForTimeout is the largest TIMEOUT PostgreSQL 19 takes, in ms.
const maxWaitForTimeout = 1<<31 - 1

// waitForMillis is WAIT FOR's TIMEOUT for a budget: whole milliseconds,
// never 0 (which would wait for ever), never beyond maxWaitForTimeout.
func waitForMillis(budget time.Duration) int64 {
	return min(max(budget.Milliseconds(), 1), maxWaitForTimeout)
}

// waitResult is what a wait learned about a replica.
type waitResult uint8

const (
	waitOK         waitResult = iota // replayed past the target
	waitTimeout                      // budget ran out
	waitNotStandby                   // the node is not (or no longer) in recovery
	waitBehind                       // a one-off check found it behind (polling may still catch up)
	waitBusy                         // max_waits reads already wait on the replica, and a check that did not wait found it behind
	// waitCannot: the replica refused to wait here and now (PostgreSQL 19,
	// SQLSTATE 55000: the session holds a lock or a snapshot); nothing is
	// wrong with the node.
	waitCannot
	// waitUnchecked: behind a transaction pooler the check could not run
	// in the read's own transaction (a simple-protocol read): the read is
	// not served by this replica.
	waitUnchecked
	// waitRecheck: a check chained in the read's transaction ran under
	// REPEATABLE READ or SERIALIZABLE, whose snapshot it took before it
	// read the replay position: the read's answer is not used, and the
	// check goes again in a transaction of its own (waiting.checkRead).
	waitRecheck
)

// methodFor resolves wait_method for one replica connection: auto is
// WaitFor on servers ≥ 19 and WaitPoll on older ones.
func (c *Connector) methodFor(b *backend) WaitMethod {
	if c.cfg.WaitMethod != WaitAuto {
		return c.cfg.WaitMethod
	}
	if b.major >= 19 {
		return WaitFor
	}
	return WaitPoll
}

// waitForAnswer reads WAIT FOR's status row, sent with its own round trip or
// riding in front of a read.
func (c *Connector) waitForAnswer(b *backend, row []string, target lsn.LSN) (waitResult, error) {
	if len(row) != 1 {
		return waitTimeout, errCheckLost
	}
	switch row[0] {
	case "success":
		c.topo.reached(b.node, b.peer.Instance, target, time.Now().UnixNano())
		return waitOK, nil
	case "timeout":
		return waitTimeout, nil
	case "not in recovery":
		b.node.record(eventPromoted)
		return waitNotStandby, nil
	}
	return waitTimeout, fmt.Errorf("pgryw: WAIT FOR returned unknown status %q", clip(row[0]))
}

// Polling backoff (before PostgreSQL 19): start short, because on a healthy
// replica the position arrives within a millisecond, and stay short, because
// every millisecond of overshoot is added to the read. When the replica's lag
// has been measured, the first poll waits until the replica is expected to be
// there; the estimate is a lower bound, so the answer is near: a read's
// own retries ask at pollSoonest, and the monitor's poll loop, which takes
// over from lagSteady into the wait, backs off from there. (Sleeps this
// short are taken with nanosleep, late by ~55 µs, not a Go timer, late by
// ~1 ms: see ctxsleep.) Measured on loopback
// (BENCHMARKS.md), a first retry after 100 µs put the read after a write at
// 1.15–1.25× the spin floor, against 1.30× after 200 µs; retrying at once
// costs twice the replica statements.
const (
	pollFirst   = 100 * time.Microsecond
	pollSoonest = 20 * time.Microsecond
	pollMax     = 5 * time.Millisecond
)

// pollDelay is how long a read waits before asking replica n again, after
// attempt earlier tries, whether it has replayed wm. With a measured lag it
// sleeps until the replica is expected there (pollAt), and once that is
// past asks at pollSoonest; without one it backs off exponentially from
// pollFirst, up to pollMax. (From lagSteady into its wait, or for a pause
// of followAfter, the monitor's poll loop polls for it instead:
// followDelay.)
func (c *Connector) pollDelay(n *node, wm lsn.LSN, attempt int) time.Duration {
	return c.nextPoll(n, wm, attempt, attempt)
}

// followDelay is pollDelay for the monitor's poll loop (waitList), after
// polls of its own for the reads waiting: past the eta it backs off from
// pollSoonest, since the reads' own retries came first (a replica paused or
// slowed down would otherwise be asked every few microseconds for as long
// as a read's budget lasts).
func (c *Connector) followDelay(n *node, wm lsn.LSN, polls int) time.Duration {
	return c.nextPoll(n, wm, polls, 0)
}

// nextPoll is the delay before poll k: until pollAt while that is ahead,
// then backing off, past the eta after flat polls at pollSoonest.
func (c *Connector) nextPoll(n *node, wm lsn.LSN, k, flat int) time.Duration {
	first := pollFirst
	if at, ok := c.topo.pollAt(n, wm); ok {
		if d := time.Duration(at - time.Now().UnixNano()); d > pollSoonest {
			return d
		}
		first, k = pollSoonest, max(k-flat, 0)
	}
	if k >= 16 {
		return pollMax
	}
	return min(first<<k, pollMax)
}

// pollOnce asks replica b once whether it has replayed target.
func (c *Connector) pollOnce(ctx context.Context, b *backend, target lsn.LSN) (waitResult, error) {
	sent := time.Now().UnixNano()
	row, null, err := b.control(ctx, sqlPoll)
	if err != nil {
		return waitTimeout, err
	}
	return c.pollAnswer(b, row, null, target, sent)
}

// parsePoll reads sqlPoll's row: whether the node is in recovery, and its
// replay position when it has one (known is false before a standby has
// replayed anything).
func parsePoll(row []string, null []bool) (replay lsn.LSN, known, inRecovery bool, err error) {
	if len(row) != 2 || len(null) != 2 {
		return 0, false, false, errCheckLost
	}
	if row[1] != "t" {
		return 0, false, false, nil
	}
	if null[0] {
		return 0, false, true, nil
	}
	l, err := lsn.Parse(row[0])
	if err != nil {
		return 0, false, true, fmt.Errorf("pgryw: replica returned an unreadable replay position: %w", err)
	}
	return l, true, true, nil
}

// recovery is what the monitor learns of a node in one probe.
type recovery struct {
	replay     lsn.LSN
	known      bool   // replay is known (a standby that has replayed something)
	inRecovery bool   // a standby, with no promotion pending
	timeline   uint32 // of the last record replayed; 0 when unknown
}

// parseRecovery reads sqlRecovery's row (or, with two columns, sqlPoll's).
// A standby whose promotion is pending counts as not in recovery: it is
// about to start a history of its own.
func parseRecovery(row []string, null []bool) (recovery, error) {
	if len(row) == 2 {
		l, known, in, err := parsePoll(row, null)
		return recovery{replay: l, known: known, inRecovery: in}, err
	}
	if len(row) != 4 || len(null) != 4 {
		return recovery{}, errCheckLost
	}
	l, known, in, err := parsePoll([]string{row[1], row[0]}, []bool{null[1], null[0]})
	r := recovery{replay: l, known: known, inRecovery: in && row[3] != "t"}
	if err != nil || !in {
		return r, err
	}
	if !null[2] {
		tli, perr := strconv.ParseUint(row[2], 10, 32)
		if perr != nil {
			return r, fmt.Errorf("pgryw: replica returned an unreadable timeline %q", clip(row[2]))
		}
		r.timeline = uint32(tli)
	}
	return r, nil
}

// pollAnswer reads sqlPoll's row, sent with its own round trip or riding in
// front of a read, and records what it says about b's node.
func (c *Connector) pollAnswer(b *backend, row []string, null []bool, target lsn.LSN, sent int64) (waitResult, error) {
	l, known, inRecovery, err := parsePoll(row, null)
	switch {
	case err != nil:
		return waitTimeout, err
	case !inRecovery:
		b.node.record(eventPromoted)
		return waitNotStandby, nil
	case !known:
		return waitBehind, nil
	}
	c.topo.observe(b.node, b.peer.Instance, l, sent, time.Now().UnixNano())
	if l >= target {
		return waitOK, nil
	}
	return waitBehind, nil
}

// armCheck puts a replica's catch-up check in front of the read about to be
// sent on b, by method (methodFor's, or WaitPoll for a check that must not
// wait): WAIT FOR LSN on PostgreSQL 19 and later (a utility statement with
// literals: a simple Query, or chained without a Sync of its own in front
// of an extended-protocol read), else a replay position poll (chained the
// same way, as sqlCheck, unless chain is false, which it is for a
// transaction's BEGIN and where the read's transaction holds its snapshot
// from its first statement, or the connection is a session pooler's).
// Both are answered before the read runs, in the same round trip.
func (c *Connector) armCheck(b *backend, method WaitMethod, wm lsn.LSN, budget time.Duration, chain bool) *wire.Injection {
	b.reuse(&b.pre)
	inj := &b.pre.inj
	switch method {
	case WaitPolar:
		c.stats.waits.Add(1)
		inj.Reset(polarSQL(c.cfg.OnTimeout, wm, budget))
	case WaitFor:
		c.stats.waits.Add(1)
		c.stats.waitFors.Add(1)
		inj.Reset(waitForSQL(wm, budget))
		// In front of pgx's extended-protocol read, without a Sync of
		// its own: both answers come in one server flush.
		inj.Chain = true
		inj.MustChain = b.peer.TxPooled
	default:
		switch {
		case b.peer.TxPooled:
			// In the read's own transaction (see Conn.pipelined).
			inj.Reset(sqlCheck)
			inj.Chain, inj.MustChain = true, true
		case !chain || b.peer.Unnamed:
			// With a Sync of its own: the caller said so (a BEGIN, a
			// simple Query; reads that hold their snapshot from their
			// first statement), or a session pooler's connection,
			// which prepares nothing by name: an unnamed Parse in the
			// read's transaction could take the place of pgx's own
			// unnamed statement.
			inj = b.injectPrepared(&b.pre, stmtPoll, sqlPoll)
		default:
			// In the read's own transaction where the read is an
			// extended-protocol one: one ReadyForQuery, and one server
			// flush, fewer.
			inj = b.injectPrepared(&b.pre, stmtCheck, sqlCheck)
			inj.Chain = true
		}
	}
	b.wire.Prefix(inj)
	return inj
}

// checked reads the answer to armCheck's statement, armed by method.
func (c *Connector) checked(b *backend, method WaitMethod, inj *wire.Injection, wm lsn.LSN) (waitResult, error) {
	if !inj.Sent() {
		return waitBehind, nil // nothing was checked: check the slow way
	}
	if !inj.Done() {
		return waitTimeout, errCheckLost
	}
	if err := inj.Err(); err != nil {
		if inj.Msgs != nil {
			// Our prepared poll is gone or clashed: nothing is wrong with
			// the replica; check the slow way this time.
			b.injectionFailed(b.pre.name, err)
			return waitBehind, nil
		}
		if method == WaitFor {
			if res, ok := c.waitForRefused(err); ok {
				return res, nil
			}
		}
		return waitTimeout, err
	}
	row, null := inj.Row()
	switch method {
	case WaitPolar:
		// The settings took; the replica waits when the read takes its
		// snapshot (see polarOutcome).
		return waitOK, nil
	case WaitFor:
		res, err := c.waitForAnswer(b, row, wm)
		if res == waitTimeout && err == nil {
			c.stats.waitTimeouts.Add(1)
		}
		return res, err
	}
	if len(row) == 3 && len(null) == 3 { // sqlCheck
		if inj.SharesTx() && !snapshotPerStatement(row[2]) {
			// The read's snapshot was taken before the position was
			// read: the check is no check (the caller records it:
			// backend.holdSnapshot).
			return waitRecheck, nil
		}
		row, null = row[:2], null[:2]
	}
	return c.pollAnswer(b, row, null, wm, inj.SentAt())
}

// waitForRefused reads an error WAIT FOR raised instead of answering with
// a status, by SQLSTATE alone (its texts changed between releases):
//   - 57014: the statement was cancelled, by a cancel request or the
//     session's statement_timeout (on PostgreSQL 19.0 a pending cancel wins
//     over an expired TIMEOUT): a timeout, as the status row would say, and
//     routed alike;
//   - 55000: the node cannot wait here now (19.0 refuses a wait for a
//     position not yet replayed while the session holds a heavyweight lock,
//     and one inside a transaction that holds a snapshot): the read goes
//     elsewhere, and nothing is wrong with the node.
//
// Anything else is the caller's to handle as a failed check.
func (c *Connector) waitForRefused(err error) (waitResult, bool) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return 0, false
	}
	switch pgErr.Code {
	case sqlstateQueryCanceled:
		c.stats.waitTimeouts.Add(1)
		return waitTimeout, true
	case sqlstateObjectState:
		c.stats.waitRefusals.Add(1)
		return waitCannot, true
	}
	return 0, false
}

// configError returns err when a failed wait points at a configuration
// mistake the caller must hear about (wait_method=wait_for on a server older
// than PostgreSQL 19, wait_method=polar on one that is not PolarDB), and nil
// when the replica should just be skipped.
func (c *Connector) configError(b *backend, err error) error {
	var pgErr *pgconn.PgError
	if c.cfg.WaitMethod == WaitPolar && errors.As(err, &pgErr) && pgErr.Code == "42704" {
		return fmt.Errorf("pgryw: wait_method=polar needs PolarDB replicas; replica %s does not know its settings: %w", b.node.addr, err)
	}
	if c.cfg.WaitMethod == WaitFor && errors.As(err, &pgErr) && b.major > 0 && b.major < 19 {
		return fmt.Errorf("pgryw: wait_method=wait_for needs PostgreSQL 19 or later; replica %s runs %d: %w", b.node.addr, b.major, err)
	}
	return nil
}

// PolarDB's wait (wait_method=polar), as its proxy does it: three
// settings in front of the read,
//
//	SET polar_consistency_mode = 'strict';   -- or 'best_effort'
//	SET polar_proxy_wait_timeout_ms = 500;
//	SET polar_xact_split_wait_lsn = '97500059720';  -- the LSN in decimal
//
// after which the replica, when the read takes its snapshot, waits until it
// has replayed the LSN or the time runs out. In strict mode a timeout fails
// the read; in best_effort mode the read runs anyway and the replica says so
// with a warning. pgryw sends the settings as one simple query riding in
// the same flush as the read (PolarDB's proxy splices them into the read's
// own query message; the settings are session-level, so the effect is the
// same), and maps on_timeout onto the modes: stale is best_effort, primary
// and error are strict, after which the read goes to the primary or fails
// with ErrReplicaBehind. Both operands are formatted from numbers pgryw
// holds.
//
// The error and warning a PolarDB replica sends on a timeout are recognised
// by their text: an error (SQLSTATE 57014, query_canceled) or a warning
// whose message names polar_xact_split_wait_lsn. This follows the seed's
// description and pgtest's stand-in (internal/pgtest/polar.go); it has not
// been checked against a PolarDB server.

// polarSQL builds the settings for a read that needs target within budget.
func polarSQL(onTimeout OnTimeout, target lsn.LSN, budget time.Duration) string {
	mode := "strict"
	if onTimeout == OnTimeoutStale {
		mode = "best_effort"
	}
	ms := max(budget.Milliseconds(), 1)
	return fmt.Sprintf("SET polar_consistency_mode = '%s'; SET polar_proxy_wait_timeout_ms = %d; SET polar_xact_split_wait_lsn = '%s'",
		mode, ms, target.Decimal())
}

// isPolarTimeout reports the strict-mode timeout of a PolarDB wait.
func isPolarTimeout(err error) bool {
	var e *pgconn.PgError
	return errors.As(err, &e) && e.Code == "57014" && strings.Contains(e.Message, "polar_xact_split_wait_lsn")
}

// polarOutcome reads what a PolarDB-waited read says about the wait: a
// strict timeout failed the read; a best_effort timeout came as a warning
// (counted from the notices pgx was passed since notices). Otherwise the
// replica reached target before the read's snapshot.
func (c *Connector) polarOutcome(b *backend, a *attempt, target lsn.LSN, notices uint64) waitResult {
	switch {
	case isPolarTimeout(a.err):
		c.stats.waitTimeouts.Add(1)
		return waitTimeout
	case c.cfg.OnTimeout == OnTimeoutStale && b.wire.Notices() != notices:
		// best_effort: the rows may predate target.
		c.stats.waitTimeouts.Add(1)
		return waitTimeout
	case a.err == nil:
		c.topo.reached(b.node, b.peer.Instance, target, time.Now().UnixNano())
	}
	return waitOK
}
