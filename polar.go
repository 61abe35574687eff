package pgryw

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgryw/pgryw/internal/lsn"
)

// PolarDB's wait (wait_method=polar), as its proxy does it (seed 000): three
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
