// Package pgryw is a database/sql driver for PostgreSQL that sends reads to
// streaming replicas and still lets every session read its own writes.
//
// # Usage
//
//	import _ "github.com/pgryw/pgryw"
//
//	db, err := sql.Open("pgryw", "postgres://app@primary/app?replicas=replica1,replica2:5433")
//
// The DSN is a pgx connection string for the primary plus pgryw's keys
// (replicas, read_your_writes, wait_timeout, on_timeout, max_fallback,
// on_max_fallback, max_waits, max_replica_lag, wait_method, pooler,
// session_scope, write_functions, read_functions, reset_session), which are
// removed before pgx sees the rest. ParseDSN and NewConnector build the same
// from code.
//
// # pgx, pgxpool and sqlc
//
// Code written against pgx uses a Pool instead, with pgxpool.Pool's
// methods and the same routing:
//
//	pool, err := pgryw.NewPool(ctx, "postgres://app@primary/app?replicas=replica1&pool_max_conns=20")
//	rows, err := pool.Query(ctx, "SELECT …") // pgx.Rows, on a replica that replayed the session's writes
//
// Its Query returns pgx.Rows, its Begin a pgx.Tx, and errors are pgx's own;
// *Pool, *PoolConn and *Tx satisfy sqlc's pgx/v5 DBTX. A pgx.Batch that
// only reads is one replica read; CopyFrom and any batch that writes run on
// the primary and move the watermark. ParsePoolConfig also reads pgxpool's
// pool_* keys; PoolConfig.ConnConfig takes pgx's options.
//
// # Routing
//
// Each statement is classified by its SQL text (cached): provably read-only
// statements go to a replica, everything else to the primary. Statements that
// change session state run on the primary. Settings (SET, set_config, SET
// ROLE) then follow the connection's reads to replicas; other state
// (advisory locks, LISTEN, temporary tables, SQL PREPARE, cursors WITH HOLD)
// keeps the connection's reads on the primary while it lives, so later
// statements keep seeing it. Read-write
// transactions run wholly on the primary; a read-only transaction
// (sql.TxOptions{ReadOnly: true}) runs wholly on a replica. A comment
// /* pgryw:primary */ or the context from WithPrimary forces the primary.
//
// # Read your writes
//
// After a write commits, pgryw reads the primary's WAL insert position and
// raises the session's watermark to it. Before a replica read, the replica
// must have replayed past the watermark: pgryw waits with WAIT FOR LSN on
// PostgreSQL 19 and later ([WAIT]), and polls pg_last_wal_replay_lsn() on
// older servers, for at most wait_timeout, and never on a replica
// connection that holds a lock (inside a transaction after its first
// statement); then on_timeout decides (read the primary,
// return ErrReplicaBehind, or serve stale rows). What pgryw learns about each
// replica's position (from every check and from a background monitor) is
// shared by all connections of a pool: a replica known to be caught up is
// read without a check, and one known to be too far behind for the budget is
// not waited on.
//
// When replicas lag, max_fallback bounds the reads that fall back to the
// primary at once (on_max_fallback decides for the rest), max_waits the
// reads waiting on one replica, and max_replica_lag passes over replicas
// not known to be within a bound of the primary, for every read.
//
// Mostly, none of this costs a round trip of its own: the position query
// rides in the same network flush as the write (after its Sync, so after
// the commit), and a replica's check rides in front of the read (or of a
// read-only transaction's BEGIN), whose answer is used only if the check
// passed. In
// a run of writes that nothing reads in between (capture=auto, the
// default), a connection's writes after the first go without the query,
// and the first read that needs their position reads it, one capture for
// the whole run: a round trip to the primary, which on the writing
// connection, before PostgreSQL 19, overlaps the replica's poll.
//
// A write that may have committed although it returned an error (a
// multi-statement string that committed and then failed, a broken
// connection, an ended context) moves the watermark too, or marks its
// position lost so the next replica read captures one first. A read raises
// its connection's watermark to an upper bound of what it saw (a replay
// position polled right behind it on a replica, the primary's position on the
// primary), so reads on one connection never go back in time.
//
// With session_scope=db (the default) the pool shares one watermark, so
// db.Exec followed by db.Query is covered even on different connections; with
// session_scope=conn each connection has its own.
//
// # Observability
//
// WithServedBy (per context) and Connector.SetServedBy (per pool) report
// where each statement ran and why: the node, its role, the route, a
// fallback's reason and the time spent waiting for replicas. NodeStats
// counts per node (reads, writes, waits and their histogram, fallbacks by
// reason, stale reads, state, lag); StatsOf, NodeStatsOf and ConnectorOf
// reach a pool opened with sql.Open. Config.Logger (SetLogger) receives
// node state changes at Info and Warn and routing decisions at Debug. The
// separate modules github.com/pgryw/pgryw/otel and
// github.com/pgryw/pgryw/prometheus export them to OpenTelemetry spans and
// to Prometheus.
//
// Package github.com/pgryw/pgryw/rywhttp carries a Session's position across
// HTTP requests (a header, a cookie, a shared token store).
//
// # Writer failover
//
// The primary's connection string may name several hosts (pgx's multi-host
// form, with target_session_attrs=read-write): pgx connects to the one that
// accepts writes, and with replicas set each of them serves reads while it
// is a standby. Positions carry the writer's timeline, so when a promoted
// standby takes over, watermarks of the old history move to the new
// writer's position: reads see every write of their session that the new
// writer has, and wait for nothing the new history may never reach. A
// failed replica is out of reads until the background monitor's probe,
// sent after an exponential backoff, gets an answer.
//
// [WAIT]: https://www.postgresql.org/docs/19/sql-wait.html
package pgryw
