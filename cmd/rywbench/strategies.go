package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/ctxsleep"
)

// Strategy names, in the order the table lists them.
const (
	stickyPrimary = "sticky-primary"
	naiveReplica  = "naive-replica"
	sleepReplica  = "sleep-replica"
	twoRoundTrip  = "two-round-trip"
	pgrywName     = "pgryw"
)

var allStrategies = []string{stickyPrimary, naiveReplica, sleepReplica, twoRoundTrip, pgrywName}

// strategy is one way of running the workload's two calls. insert writes row
// id with value v; read returns row id's value (NULL when the row is missing)
// and the port of the server that answered. The caller times each call.
type strategy interface {
	name() string
	insert(ctx context.Context, id, v int64) error
	read(ctx context.Context, id int64) (v sql.NullInt64, port int64, err error)
}

func tableName(strategy string) string {
	return "rywbench_" + strings.ReplaceAll(strategy, "-", "_")
}

// statements returns the workload's insert and read for a table. The read
// always returns one row, so the answering server's port is known even when
// the row is missing.
func statements(table string) (insert, read string) {
	return "INSERT INTO " + table + " (id, v) VALUES ($1, $2)",
		"SELECT (SELECT v FROM " + table + " WHERE id = $1), inet_server_port()"
}

// pools are the plain pgx (database/sql driver "pgx") pools the baseline
// strategies share; only one strategy runs at a time.
type pools struct {
	primary  *sql.DB
	replicas []*sql.DB
	budget   time.Duration // two-round-trip's wait budget
	sleep    time.Duration // sleep-replica's pause
	waitFor  bool          // replicas run PostgreSQL ≥ 19: use WAIT FOR LSN
}

// baseline is one of the strategies built on plain pgx pools.
type baseline struct {
	kind              string
	p                 *pools
	insertSQL, getSQL string
}

func newBaseline(kind string, p *pools) *baseline {
	ins, get := statements(tableName(kind))
	return &baseline{kind: kind, p: p, insertSQL: ins, getSQL: get}
}

func (b *baseline) name() string { return b.kind }

func (b *baseline) insert(ctx context.Context, id, v int64) error {
	_, err := b.p.primary.ExecContext(ctx, b.insertSQL, id, v)
	return err
}

func (b *baseline) read(ctx context.Context, id int64) (sql.NullInt64, int64, error) {
	// Spread reads over the replicas by id; with one replica it is always 0.
	// In uint64: int(id) wraps negative on 32-bit platforms.
	replica := b.p.replicas[uint64(id)%uint64(len(b.p.replicas))]
	switch b.kind {
	case stickyPrimary:
		return b.get(ctx, b.p.primary, id)
	case naiveReplica:
		return b.get(ctx, replica, id)
	case sleepReplica:
		if err := ctxsleep.Sleep(ctx, b.p.sleep); err != nil {
			return sql.NullInt64{}, 0, err
		}
		return b.get(ctx, replica, id)
	case twoRoundTrip:
		// The pattern of seed 003: one more round trip to the primary for
		// its WAL position, a wait on the replica, then the read, or the
		// primary's read if the replica did not catch up within the budget.
		var lsn string
		if err := b.p.primary.QueryRowContext(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
			return sql.NullInt64{}, 0, fmt.Errorf("fetch LSN: %w", err)
		}
		ok, err := b.p.waitReplay(ctx, replica, lsn)
		if err != nil {
			return sql.NullInt64{}, 0, fmt.Errorf("wait for LSN %s: %w", lsn, err)
		}
		if !ok {
			return b.get(ctx, b.p.primary, id)
		}
		return b.get(ctx, replica, id)
	}
	return sql.NullInt64{}, 0, fmt.Errorf("unknown strategy %q", b.kind)
}

func (b *baseline) get(ctx context.Context, db *sql.DB, id int64) (v sql.NullInt64, port int64, err error) {
	var p sql.NullInt64 // NULL over a Unix socket
	err = db.QueryRowContext(ctx, b.getSQL, id).Scan(&v, &p)
	return v, p.Int64, err
}

var lsnRE = regexp.MustCompile(`^[0-9A-F]{1,8}/[0-9A-F]{1,8}$`)

// waitReplay waits until replica has replayed lsn, for at most p.budget. It
// reports whether it has; a budget that ran out is not an error.
func (p *pools) waitReplay(ctx context.Context, replica *sql.DB, lsn string) (bool, error) {
	if !lsnRE.MatchString(lsn) {
		return false, fmt.Errorf("malformed LSN %q", lsn)
	}
	if p.waitFor {
		// WAIT FOR takes no bind parameters; lsn is validated above and the
		// timeout is an integer. The simple protocol keeps one-off texts
		// out of pgx's statement cache.
		q := fmt.Sprintf("WAIT FOR LSN '%s' WITH (TIMEOUT '%dms', NO_THROW)", lsn, p.budget.Milliseconds())
		var status string
		if err := replica.QueryRowContext(ctx, q, pgx.QueryExecModeSimpleProtocol).Scan(&status); err != nil {
			return false, err
		}
		return status == "success", nil
	}
	deadline := time.Now().Add(p.budget)
	backoff := 500 * time.Microsecond
	for {
		var replayed sql.NullBool // NULL if the server is not a standby
		if err := replica.QueryRowContext(ctx, "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn).Scan(&replayed); err != nil {
			return false, err
		}
		if replayed.Bool {
			return true, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false, nil
		}
		if err := ctxsleep.Sleep(ctx, min(backoff, left)); err != nil {
			return false, err
		}
		backoff = min(2*backoff, 20*time.Millisecond)
	}
}

// pgrywStrategy sends both calls through one pgryw pool.
type pgrywStrategy struct {
	db                *sql.DB
	conn              *pgryw.Connector
	insertSQL, getSQL string
}

// newPgryw opens the pgryw pool: the primary's DSN plus pgryw's replicas and
// wait_timeout keys, as an application would write it.
func newPgryw(primaryDSN string, replicaAddrs []string, budget time.Duration) (*pgrywStrategy, error) {
	dsn := withParams(primaryDSN, [][2]string{
		{"replicas", strings.Join(replicaAddrs, ",")},
		{"wait_timeout", budget.String()},
	})
	cfg, err := pgryw.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	c, err := pgryw.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	ins, get := statements(tableName(pgrywName))
	return &pgrywStrategy{db: sql.OpenDB(c), conn: c, insertSQL: ins, getSQL: get}, nil
}

// withParams appends key=value pairs to a URL or keyword/value DSN.
func withParams(dsn string, kv [][2]string) string {
	isURL := strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
	for _, p := range kv {
		switch {
		case !isURL:
			dsn += " " + p[0] + "=" + p[1]
		case strings.Contains(dsn, "?"):
			dsn += "&" + p[0] + "=" + p[1]
		default:
			dsn += "?" + p[0] + "=" + p[1]
		}
	}
	return dsn
}

func (s *pgrywStrategy) name() string { return pgrywName }

func (s *pgrywStrategy) insert(ctx context.Context, id, v int64) error {
	_, err := s.db.ExecContext(ctx, s.insertSQL, id, v)
	return err
}

func (s *pgrywStrategy) read(ctx context.Context, id int64) (v sql.NullInt64, port int64, err error) {
	var p sql.NullInt64
	err = s.db.QueryRowContext(ctx, s.getSQL, id).Scan(&v, &p)
	return v, p.Int64, err
}

// errInterrupted ends a run on Ctrl-C or SIGTERM.
var errInterrupted = errors.New("interrupted")
