package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/ctxsleep"
)

// Strategy names, in the order the table lists them.
const (
	stickyPrimary  = "sticky-primary"
	naiveReplica   = "naive-replica"
	spinFloor      = "spin-floor"
	sleepReplica   = "sleep-replica"
	twoRoundTrip   = "two-round-trip"
	pgrywName      = "pgryw"
	pgrywSession   = "pgryw-session"
	plainWrite     = "plain-write"
	pgrywWrite     = "pgryw-write"
	replicaRead    = "replica-read"
	pgrywRead      = "pgryw-read"
	pgrywNoReplica = "pgryw-no-replica"

	// pgx's front end: pgxpool baselines, and pgryw's Pool.
	pgxStickyPrimary = "pgx-sticky-primary"
	pgxNaiveReplica  = "pgx-naive-replica"
	pgxSpinFloor     = "pgx-spin-floor"
	pgxSleepReplica  = "pgx-sleep-replica"
	pgxPlainWrite    = "pgx-plain-write"
	pgxReplicaRead   = "pgx-replica-read"
	poolName         = "pgryw-pool"
	poolWrite        = "pgryw-pool-write"
	poolRead         = "pgryw-pool-read"
	poolNoReplica    = "pgryw-pool-no-replica"
)

// defaultStrategies run unless -strategies says otherwise; allStrategies
// adds the wire-level models (models.go), which run only when named.
var (
	defaultStrategies = []string{stickyPrimary, naiveReplica, spinFloor, sleepReplica, twoRoundTrip, pgrywName, pgrywSession,
		plainWrite, pgrywWrite, replicaRead, pgrywRead, pgrywNoReplica}
	// pgxStrategies ("-strategies pgx") are pgx's front end's: pgxpool
	// baselines and pgryw's Pool, each the counterpart of a
	// database/sql strategy above.
	pgxStrategies = []string{pgxStickyPrimary, pgxNaiveReplica, pgxSpinFloor, pgxSleepReplica, poolName,
		pgxPlainWrite, poolWrite, pgxReplicaRead, poolRead, poolNoReplica}
	// pgrywKinds are the strategies that run through a pgryw pool.
	pgrywKinds    = []string{pgrywName, pgrywSession, pgrywWrite, pgrywRead, pgrywNoReplica, poolName, poolWrite, poolRead, poolNoReplica}
	allStrategies = append(append(slices.Clone(defaultStrategies), pgxStrategies...), modelStrategies...)
)

// sqlKind is the database/sql strategy a pgx one is the counterpart of.
func sqlKind(kind string) string {
	switch kind {
	case poolName:
		return pgrywName
	case poolWrite:
		return pgrywWrite
	case poolRead:
		return pgrywRead
	case poolNoReplica:
		return pgrywNoReplica
	}
	return strings.TrimPrefix(kind, "pgx-")
}

// pgxKind is the pgx strategy that is database/sql strategy kind's
// counterpart.
func pgxKind(kind string) string {
	for _, k := range pgxStrategies {
		if sqlKind(k) == kind {
			return k
		}
	}
	return "pgx-" + kind
}

// isPgx reports whether kind is a pgxpool baseline.
func isPgx(kind string) bool { return strings.HasPrefix(kind, "pgx-") }

// shape is what one iteration of a strategy does.
type shape uint8

const (
	insertRead shape = iota // insert a fresh row, then read it back
	insertOnly              // insert a fresh row; no read
	readOnly                // read a row written before the run; no write
)

// shapeOf returns what one iteration of strategy kind does.
func shapeOf(kind string) shape {
	switch sqlKind(kind) {
	case plainWrite, pgrywWrite, wireInsert, wireCapture, wireFastCap, wireOneSync:
		return insertOnly
	case replicaRead, pgrywRead, wireRead, wireReadTrail:
		return readOnly
	}
	return insertRead
}

// readOut is what a read returns: row id's value (NULL when the row is
// missing), the port of the server that answered, and how many reads it
// took (spin-floor and the polling models; 1 otherwise).
type readOut struct {
	v     sql.NullInt64
	port  int64
	tries int
}

// strategy is one way of running the workload's calls. insert writes row id
// with value v; read returns row id. The caller times each call. early, when
// not zero, is the time the insert took until its own answer arrived, before
// what rode behind it (wire-capture only).
type strategy interface {
	name() string
	shape() shape
	insert(ctx context.Context, id, v int64) (early time.Duration, err error)
	read(ctx context.Context, id int64) (readOut, error)
}

func tableName(strategy string) string {
	return "rywbench_" + strings.ReplaceAll(strategy, "-", "_")
}

// statements returns the workload's insert and read for a table. The read
// always returns one row, so the answering server's port is known even when
// the row is missing: through portFunction, since pgryw answers
// inet_server_port() itself from the primary, as pgx on the primary would.
func statements(table string) (insert, read string) {
	return "INSERT INTO " + table + " (id, v) VALUES ($1, $2)",
		"SELECT (SELECT v FROM " + table + " WHERE id = $1), " + portFunction + "()"
}

// portFunction is a STABLE SQL wrapper of inet_server_port(): what the
// node that runs the read answers, whatever pgryw routes node identity by.
const portFunction = "rywbench_port"

const createPortFunction = "CREATE OR REPLACE FUNCTION " + portFunction + "() RETURNS int STABLE LANGUAGE sql AS 'SELECT inet_server_port()'"

// pools are plain pgx (database/sql driver "pgx") pools: one to the primary
// and one to each replica.
type pools struct {
	primary  *sql.DB
	replicas []*sql.DB
	// pgxpool's, for the pgx- strategies (primary and replicas stay nil).
	xprimary  *pgxpool.Pool
	xreplicas []*pgxpool.Pool
	budget    time.Duration // two-round-trip's wait budget
	sleep     time.Duration // sleep-replica's pause
	waitFor   bool          // replicas run PostgreSQL ≥ 19: use WAIT FOR LSN
}

func (p *pools) close() {
	if p.primary != nil {
		p.primary.Close()
	}
	for _, r := range p.replicas {
		r.Close()
	}
	if p.xprimary != nil {
		p.xprimary.Close()
	}
	for _, r := range p.xreplicas {
		r.Close()
	}
}

// baseline is one of the strategies built on plain pgx pools.
type baseline struct {
	kind              string
	p                 *pools
	insertSQL, getSQL string
}

func newBaseline(kind string, p *pools) *baseline {
	ins, get := statements(tableName(kind))
	if sqlKind(kind) == replicaRead {
		_, get = statements(preloadTable)
	}
	return &baseline{kind: kind, p: p, insertSQL: ins, getSQL: get}
}

// preloadTable holds preloadRows rows, written before the run, which the
// read-only strategies read: row id has value 2*id+1 like every other.
const (
	preloadTable = "rywbench_preload"
	preloadRows  = 1000
)

// preloadID maps an iteration's id to a preloaded row.
func preloadID(id int64) int64 { return 1 + int64(uint64(id)%preloadRows) }

func (b *baseline) name() string { return b.kind }

func (b *baseline) shape() shape { return shapeOf(b.kind) }

func (b *baseline) insert(ctx context.Context, id, v int64) (time.Duration, error) {
	if b.p.xprimary != nil {
		_, err := b.p.xprimary.Exec(ctx, b.insertSQL, id, v)
		return 0, err
	}
	_, err := b.p.primary.ExecContext(ctx, b.insertSQL, id, v)
	return 0, err
}

// node is one of a baseline's pools: database/sql's or pgxpool's.
type node struct {
	db *sql.DB
	x  *pgxpool.Pool
}

func (b *baseline) primaryNode() node { return node{b.p.primary, b.p.xprimary} }

// replicaNode spreads reads over the replicas by id; with one replica it
// is always 0. In uint64: int(id) wraps negative on 32-bit platforms.
func (b *baseline) replicaNode(id int64) node {
	if b.p.xprimary != nil {
		return node{x: b.p.xreplicas[uint64(id)%uint64(len(b.p.xreplicas))]}
	}
	return node{db: b.p.replicas[uint64(id)%uint64(len(b.p.replicas))]}
}

func (b *baseline) read(ctx context.Context, id int64) (readOut, error) {
	replica := b.replicaNode(id)
	switch sqlKind(b.kind) {
	case stickyPrimary:
		return b.get(ctx, b.primaryNode(), id)
	case naiveReplica, replicaRead:
		return b.get(ctx, replica, id)
	case spinFloor:
		// The earliest moment the replica can answer with the row, as seen
		// from here: read it again at once until it is there (at most the
		// budget; then the last, stale answer counts).
		deadline := time.Now().Add(b.p.budget)
		for tries := 1; ; tries++ {
			out, err := b.get(ctx, replica, id)
			out.tries = tries
			if err != nil || out.v.Valid || time.Now().After(deadline) {
				return out, err
			}
		}
	case sleepReplica:
		if err := ctxsleep.Sleep(ctx, b.p.sleep); err != nil {
			return readOut{}, err
		}
		return b.get(ctx, replica, id)
	case twoRoundTrip:
		// The two-round-trip pattern (read the position, then wait): one more round trip to the primary for
		// its WAL position, a wait on the replica, then the read, or the
		// primary's read if the replica did not catch up within the budget.
		var lsn string
		if err := b.p.primary.QueryRowContext(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
			return readOut{}, fmt.Errorf("fetch LSN: %w", err)
		}
		ok, err := b.p.waitReplay(ctx, replica.db, lsn)
		if err != nil {
			return readOut{}, fmt.Errorf("wait for LSN %s: %w", lsn, err)
		}
		if !ok {
			return b.get(ctx, b.primaryNode(), id)
		}
		return b.get(ctx, replica, id)
	}
	return readOut{}, fmt.Errorf("unknown strategy %q", b.kind)
}

func (b *baseline) get(ctx context.Context, n node, id int64) (readOut, error) {
	var (
		out readOut
		p   sql.NullInt64 // NULL over a Unix socket
		err error
	)
	if n.x != nil {
		err = n.x.QueryRow(ctx, b.getSQL, id).Scan(&out.v, &p)
	} else {
		err = n.db.QueryRowContext(ctx, b.getSQL, id).Scan(&out.v, &p)
	}
	out.port, out.tries = p.Int64, 1
	return out, err
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

// pgrywStrategy sends its calls through a pgryw pool of its own, so that
// each one's Stats and watermark are its own: pgryw-read's pool never
// writes, so its reads never have a watermark to wait for.
type pgrywStrategy struct {
	kind              string
	db                *sql.DB
	pool              *pgryw.Pool // pgx's front end (the pgryw-pool strategies), instead of db
	conn              *pgryw.Connector
	insertSQL, getSQL string
	sessions          sync.Map // pgryw-session: id → *pgryw.Session, from the insert to the read
}

// pgrywKeys are the -pgryw flags: key=value pairs every pgryw strategy's
// DSN gets after rywbench's own.
var pgrywKeys stringList

// newPgryw opens a pgryw pool: the primary's DSN plus pgryw's replicas and
// wait_timeout keys, as an application would write it; pgryw-no-replica
// gets no replicas key (pgryw's no-replica mode), pgryw-session
// session_scope=conn (each iteration's insert and read share a
// pgryw.Session of their own instead of the pool's watermark).
func newPgryw(kind, primaryDSN string, replicaAddrs []string, budget time.Duration, poolSize int) (*pgrywStrategy, error) {
	var kv [][2]string
	if sqlKind(kind) != pgrywNoReplica {
		kv = append(kv, [2]string{"replicas", strings.Join(replicaAddrs, ",")})
	}
	if kind == pgrywSession {
		kv = append(kv, [2]string{"session_scope", "conn"})
	}
	kv = append(kv, [2]string{"wait_timeout", budget.String()})
	for _, k := range pgrywKeys {
		key, value, _ := strings.Cut(k, "=")
		kv = append(kv, [2]string{key, value})
	}
	if kind != sqlKind(kind) {
		kv = append(kv, [2]string{"pool_max_conns", strconv.Itoa(poolSize)}, [2]string{"pool_min_idle_conns", strconv.Itoa(poolSize)})
		return newPgrywPool(kind, withParams(primaryDSN, kv))
	}
	cfg, err := pgryw.ParseDSN(withParams(primaryDSN, kv))
	if err != nil {
		return nil, err
	}
	cfg.ReadFunctions = append(cfg.ReadFunctions, portFunction)
	c, err := pgryw.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	ins, get := statements(tableName(kind))
	if sqlKind(kind) == pgrywRead {
		_, get = statements(preloadTable)
	}
	db := sql.OpenDB(c)
	db.SetMaxOpenConns(poolSize)
	db.SetMaxIdleConns(poolSize)
	return &pgrywStrategy{kind: kind, db: db, conn: c, insertSQL: ins, getSQL: get}, nil
}

// newPgrywPool opens pgx's front end, a pgryw Pool, on dsn.
func newPgrywPool(kind, dsn string) (*pgrywStrategy, error) {
	pc, err := pgryw.ParsePoolConfig(dsn)
	if err != nil {
		return nil, err
	}
	pc.Config.ReadFunctions = append(pc.Config.ReadFunctions, portFunction)
	p, err := pgryw.NewPoolWithConfig(context.Background(), pc)
	if err != nil {
		return nil, err
	}
	ins, get := statements(tableName(kind))
	if kind == poolRead {
		_, get = statements(preloadTable)
	}
	return &pgrywStrategy{kind: kind, pool: p, conn: p.Connector(), insertSQL: ins, getSQL: get}, nil
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

func (s *pgrywStrategy) name() string { return s.kind }

func (s *pgrywStrategy) shape() shape { return shapeOf(s.kind) }

func (s *pgrywStrategy) insert(ctx context.Context, id, v int64) (time.Duration, error) {
	if s.kind == pgrywSession {
		sess := pgryw.NewSession()
		s.sessions.Store(id, sess)
		ctx = pgryw.WithSession(ctx, sess)
	}
	if s.pool != nil {
		_, err := s.pool.Exec(ctx, s.insertSQL, id, v)
		return 0, err
	}
	_, err := s.db.ExecContext(ctx, s.insertSQL, id, v)
	return 0, err
}

func (s *pgrywStrategy) read(ctx context.Context, id int64) (readOut, error) {
	if s.kind == pgrywSession {
		sess, ok := s.sessions.LoadAndDelete(id)
		if !ok {
			return readOut{}, errors.New("no session for the row")
		}
		ctx = pgryw.WithSession(ctx, sess.(*pgryw.Session))
	}
	var (
		out readOut
		p   sql.NullInt64
		err error
	)
	if s.pool != nil {
		err = s.pool.QueryRow(ctx, s.getSQL, id).Scan(&out.v, &p)
	} else {
		err = s.db.QueryRowContext(ctx, s.getSQL, id).Scan(&out.v, &p)
	}
	out.port, out.tries = p.Int64, 1
	return out, err
}

// errInterrupted ends a run on Ctrl-C or SIGTERM.
var errInterrupted = errors.New("interrupted")
