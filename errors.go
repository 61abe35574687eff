package pgryw

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Every error a caller can get from pgryw itself is here; everything else
// is the server's own (*pgconn.PgError, unwrapped so that both errors.As and
// a plain type assertion work) or pgx's.

// ErrReplicaHint is returned for a statement carrying a /* pgryw:replica */
// hint that the classifier says writes or changes the session: obeying the
// hint would fail on the replica or change the wrong session.
var ErrReplicaHint = errors.New("pgryw: /* pgryw:replica */ hint on a statement that must run on the primary")

// ErrReplicaBehind is matched (errors.Is) by the error a read returns under
// on_timeout=error when no replica replayed the session's watermark in time.
var ErrReplicaBehind = errors.New("pgryw: replica behind the session's watermark")

// ReplicaBehindError is the error a read returns under on_timeout=error, or
// over max_fallback under on_max_fallback=wait or error. It matches
// ErrReplicaBehind.
type ReplicaBehindError struct {
	Replica   string        // host:port of the replica that was waited on
	Watermark string        // the session's watermark, an LSN (0/0: none)
	Replayed  string        // the replica's last known replay LSN ("unknown" if none)
	Waited    time.Duration // the budget that ran out; 0 when nothing was waited for
	// Limit names the overload bound that made the read give up, as a DSN
	// setting: "max_replica_lag=2s" (the replica was not known to be within
	// it), "max_waits=32" (that many reads were already waiting on the
	// replica), "max_fallback=8" (that many reads were already running on
	// the primary for lack of a fresh replica; Waited is how long this one
	// waited for one of them to finish). "" when the replica did not, or by
	// its measured lag would not, replay the watermark within the budget.
	Limit string
}

// Error reports both positions so the lag can be judged from the message,
// and the bound that applied.
func (e *ReplicaBehindError) Error() string {
	switch key, _, _ := strings.Cut(e.Limit, "="); key {
	case "max_replica_lag":
		return fmt.Sprintf("pgryw: replica %s is not known to be within %s of the primary (replayed %s)",
			e.Replica, e.Limit, e.Replayed)
	case "max_waits":
		return fmt.Sprintf("pgryw: replica %s had not replayed the session's watermark %s (replayed %s) and %s reads were already waiting on it",
			e.Replica, e.Watermark, e.Replayed, e.Limit)
	case "max_fallback":
		return fmt.Sprintf("pgryw: replica %s is behind (session's watermark %s, replayed %s) and %s reads were already running on the primary for lack of a fresh replica (waited %v)",
			e.Replica, e.Watermark, e.Replayed, e.Limit, e.Waited)
	}
	return fmt.Sprintf("pgryw: replica %s did not replay the session's watermark %s within %v (replayed %s)",
		e.Replica, e.Watermark, e.Waited, e.Replayed)
}

// Is makes errors.Is(err, ErrReplicaBehind) true.
func (e *ReplicaBehindError) Is(target error) bool { return target == ErrReplicaBehind }

// ErrConnLost is returned when a server connection failed after a
// statement's bytes had gone out: the statement may or may not have run.
// pgx v5.12 calls some of these failures safe to retry (a read that fails
// after a no-argument statement was sent), and database/sql would then run
// the statement again on another connection; pgryw reports them as this
// instead. driver.ErrBadConn reaches database/sql only when no byte of the
// statement left.
var ErrConnLost = errors.New("pgryw: connection lost after the statement was sent; it may or may not have run")

// SQLSTATEs pgryw acts on.
const (
	// sqlstateReadOnly: a standby refused a statement as a write
	// (read_only_sql_transaction).
	sqlstateReadOnly = "25006"
	// sqlstateFeatureNotSupported: raised for SERIALIZABLE on a standby and
	// for a prepared statement whose result type changed.
	sqlstateFeatureNotSupported = "0A000"
	// sqlstateNoSuchStatement: a prepared statement is gone
	// (invalid_sql_statement_name), e.g. after DEALLOCATE ALL.
	sqlstateNoSuchStatement = "26000"
	// sqlstateDuplicateStatement: a prepared statement of that name exists.
	sqlstateDuplicateStatement = "42P05"
	// Operator intervention: shutdown, crash shutdown, starting up.
	sqlstateAdminShutdown = "57P01"
	sqlstateCrashShutdown = "57P02"
	sqlstateCannotConnect = "57P03"
	// A standby cancels a read that holds what replay needs (a recovery
	// conflict) with one of these.
	sqlstateSerialization = "40001"
	sqlstateDeadlock      = "40P01"
	// sqlstateQueryCanceled: a statement cancelled (a cancel request,
	// statement_timeout) or, without NO_THROW, WAIT FOR's timeout.
	sqlstateQueryCanceled = "57014"
	// sqlstateObjectState (object_not_in_prerequisite_state): PostgreSQL
	// 19's WAIT FOR refusing to wait here (locks held, a snapshot held,
	// not in recovery).
	sqlstateObjectState = "55000"
	// sqlstateClassConnection is the connection-exception class prefix.
	sqlstateClassConnection = "08"
)

// refusedByStandby reports a standby's refusal to start a transaction at
// all, before the statement ran: "cannot use serializable mode in a hot
// standby" (0A000), whatever the statement.
func refusedByStandby(e *pgconn.PgError) bool {
	return e.Code == sqlstateFeatureNotSupported && strings.Contains(e.Message, "hot standby")
}

// refusedAsStandby reports an error a standby raises, before anything ran,
// for a read the primary serves: 0A000 "cannot access temporary or
// unlogged relations during recovery", 55000 "recovery is in progress"
// (pg_walfile_name and the like). Matched by SQLSTATE: whatever the text,
// the primary's answer to the same read is pgx's. A refusal to start the
// transaction at all (refusedByStandby) and an outdated statement
// description (isStaleDescription) are told apart first.
func refusedAsStandby(e *pgconn.PgError) bool {
	return e.Code == sqlstateFeatureNotSupported || e.Code == sqlstateObjectState
}

// isRefusal is refusedByStandby for any error.
func isRefusal(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && refusedByStandby(pgErr)
}

// isStaleDescription reports PostgreSQL's refusal to run a prepared
// statement whose result columns changed since it was prepared (0A000
// "cached plan must not change result type"): it is raised before the
// statement runs.
func isStaleDescription(err error) bool {
	var e *pgconn.PgError
	return errors.As(err, &e) && e.Code == sqlstateFeatureNotSupported && strings.Contains(e.Message, "cached plan must not change result type")
}

// connFault reports a server error that ends the session rather than the
// statement: connection exceptions (08) and shutdown, crash and startup
// (57P01-57P03).
func connFault(e *pgconn.PgError) bool {
	switch e.Code {
	case sqlstateAdminShutdown, sqlstateCrashShutdown, sqlstateCannotConnect:
		return true
	}
	return strings.HasPrefix(e.Code, sqlstateClassConnection)
}

// replicaFault reports a server error that says the replica, not the
// statement, failed: connection exceptions (08), shutdown and startup
// (57P01-57P03), and recovery conflicts, which a standby reports as
// serialization failures or deadlocks (40001, 40P01) when replay needs what
// the read holds.
func replicaFault(e *pgconn.PgError) bool {
	switch e.Code {
	case sqlstateAdminShutdown, sqlstateCrashShutdown, sqlstateCannotConnect, sqlstateSerialization, sqlstateDeadlock:
		return true
	}
	return strings.HasPrefix(e.Code, sqlstateClassConnection)
}

// errPositionLost: the watermark a read needs could not be read (see
// pipelined); the read goes to the primary, as when watermark fails.
var errPositionLost = errors.New("pgryw: the session's position could not be read")

// errUsePrimary tells callers that a read belongs on the primary after all; it
// never reaches the application.
var errUsePrimary = errors.New("pgryw: use the primary")

// ErrNotPgryw is returned by ConnectorOf, StatsOf, NodeStatsOf and SetLogger
// for a *sql.DB whose connections are not pgryw's.
var ErrNotPgryw = errors.New("pgryw: the pool's driver is not pgryw")

// errForeign: a replica connection reached a standby of another cluster.
var errForeign = errors.New("pgryw: a standby of another cluster")

// errCheckLost: the connection failed before the check's answer arrived.
var errCheckLost = errors.New("pgryw: replica connection failed during the catch-up check")

// errPrimaryLost: pgx's front end's connection found its primary session
// ended while idle, and no new one could be made (database/sql gets
// driver.ErrBadConn, and tries another connection).
var errPrimaryLost = errors.New("pgryw: the primary connection was lost and could not be replaced")

// errBatchBeginInTx is pgx's refusal of a pgx.Batch.BeginTx batch sent in
// a transaction, in pgx's words.
var errBatchBeginInTx = errors.New("Batch.BeginTx cannot be used within a transaction")
