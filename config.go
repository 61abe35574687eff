package pgryw

import (
	"errors"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// OnTimeout says what a replica read does when the replica has not replayed
// the session's watermark within the wait budget.
type OnTimeout uint8

const (
	// OnTimeoutPrimary reads from the primary instead. Correct, at the cost of
	// primary load; the default.
	OnTimeoutPrimary OnTimeout = iota
	// OnTimeoutError returns an error matching ErrReplicaBehind.
	OnTimeoutError
	// OnTimeoutStale serves the replica's possibly stale rows and counts them
	// in Stats.StaleReads. This gives up read-your-writes for that read.
	OnTimeoutStale
)

var onTimeoutNames = []string{"primary", "error", "stale"}

// String returns the DSN spelling.
func (o OnTimeout) String() string { return enumName(onTimeoutNames, int(o)) }

// WaitMethod says how pgryw makes a replica catch up with the watermark.
type WaitMethod uint8

const (
	// WaitAuto uses WAIT FOR LSN on servers ≥ 19 and polling on older ones.
	WaitAuto WaitMethod = iota
	// WaitFor always uses WAIT FOR LSN (PostgreSQL 19 and later).
	WaitFor
	// WaitPoll polls pg_last_wal_replay_lsn() with a short backoff.
	WaitPoll
	// WaitPolar uses PolarDB's wait: SET polar_consistency_mode,
	// polar_proxy_wait_timeout_ms and polar_xact_split_wait_lsn in front of
	// the read, which then waits on the replica before taking its snapshot.
	//
	// Experimental: it follows PolarDB's published description and a
	// stand-in server, and has not been run against a PolarDB replica.
	WaitPolar
)

var waitMethodNames = []string{"auto", "wait_for", "poll", "polar"}

// String returns the DSN spelling.
func (w WaitMethod) String() string { return enumName(waitMethodNames, int(w)) }

// Pooler says what may sit between pgryw and each node's server: a
// connection pooler (PgBouncer and the like) changes which server
// connection a client connection's statements reach, in transaction mode
// at the end of every transaction, and that shapes what may ride along.
type Pooler uint8

const (
	// PoolerAuto asks each new server connection which backend it reached
	// (one round trip at connect): a backend process ID other than the one
	// the connection was given at startup means a pooler in between, which
	// is then taken to be in transaction mode (PoolerTransaction); else
	// nothing is (PoolerNone, with what is known of a node bound to the
	// server instance that answered).
	PoolerAuto Pooler = iota
	// PoolerNone: every address leads straight to a server; no round trip
	// at connect, and what is known of a node belongs to its address.
	PoolerNone
	// PoolerSession: a pooler in session mode (a client keeps one server
	// connection while it is connected): pgryw's statements ride along as
	// usual, without named prepared statements.
	PoolerSession
	// PoolerTransaction: a pooler in transaction mode. Nothing of pgryw's
	// rides behind a statement that ends a transaction, or in front of one
	// unless chained into its own extended-protocol messages; positions
	// are read with round trips of their own, every replica read is
	// checked, and session state keeps a connection's reads on the primary.
	PoolerTransaction
)

var poolerNames = []string{"auto", "none", "session", "transaction"}

// String returns the DSN spelling.
func (p Pooler) String() string { return enumName(poolerNames, int(p)) }

// Scope says where the read-your-writes watermark lives.
type Scope uint8

const (
	// ScopeDB keeps, besides each connection's own watermark, one watermark
	// shared by the whole pool, so db.Exec followed by db.Query is covered
	// even when database/sql hands out different connections. The default.
	ScopeDB Scope = iota
	// ScopeConn keeps the watermark per connection only (*sql.Conn, *sql.Tx):
	// one session's writes never make another session's reads wait.
	ScopeConn
)

var scopeNames = []string{"db", "conn"}

// String returns the DSN spelling.
func (s Scope) String() string { return enumName(scopeNames, int(s)) }

// Capture says when a write's position is read on the primary.
type Capture uint8

const (
	// CaptureAuto sends a possible commit's capture in the same flush as
	// the statement, unless nothing has asked for a watermark since the
	// connection's last possible commit (a run of writes, a write-only
	// worker): then its position is read by the first read (or token) that
	// needs it, one capture covering the whole run. The default.
	CaptureAuto Capture = iota
	// CaptureAlways sends every possible commit's capture in the same
	// flush as the statement: no read ever waits for a round trip to the
	// primary to learn a position, at the cost of one capture per write
	// (server time on the primary).
	CaptureAlways
	// CaptureOnRead sends no capture with a write: every write's position
	// is read by the first read (or token) that needs it, with a round
	// trip to the primary before it (on the writing connection, before
	// PostgreSQL 19, one that overlaps the replica's poll; a Session's
	// token, on a connection of its own). The least work for the primary.
	CaptureOnRead
)

var captureNames = []string{"auto", "always", "on_read"}

// String returns the DSN spelling.
func (c Capture) String() string { return enumName(captureNames, int(c)) }

// OnMaxFallback says what a read does when it would go to the primary for
// lack of a fresh replica (on_timeout=primary) but max_fallback such reads
// are already running there.
type OnMaxFallback uint8

const (
	// FallbackWait waits for one of them to finish, at most the read's
	// budget (wait_timeout, or less if the caller's deadline is sooner), and
	// then fails the read with a *ReplicaBehindError whose Limit names
	// max_fallback. The default.
	FallbackWait OnMaxFallback = iota
	// FallbackError fails the read at once, with the same error.
	FallbackError
	// FallbackStale serves the replica's possibly stale rows and counts them
	// in Stats.StaleReads. This gives up read-your-writes for that read.
	FallbackStale
)

var onMaxFallbackNames = []string{"wait", "error", "stale"}

// String returns the DSN spelling.
func (o OnMaxFallback) String() string { return enumName(onMaxFallbackNames, int(o)) }

// ReplicaLag bounds how far behind the primary a replica may be and still
// serve a read (DSN key max_replica_lag): a distance in WAL bytes or a time,
// at most one of the two. The zero value is no bound.
type ReplicaLag struct {
	// Bytes: the replica's last known replay position may trail the
	// primary's latest sampled WAL position by at most this many bytes.
	Bytes uint64
	// Duration: the replica must be known to have replayed everything the
	// primary had written this long ago.
	Duration time.Duration
}

// IsZero reports whether l is no bound.
func (l ReplicaLag) IsZero() bool { return l.Bytes == 0 && l.Duration == 0 }

// String returns the DSN spelling: off, a size such as 16MB, or a duration
// such as 2s.
func (l ReplicaLag) String() string {
	switch {
	case l.Bytes != 0 && l.Duration != 0:
		return "invalid(" + formatBytes(l.Bytes) + "," + shortDuration(l.Duration) + ")"
	case l.Bytes != 0:
		return formatBytes(l.Bytes)
	case l.Duration != 0:
		return shortDuration(l.Duration)
	}
	return "off"
}

func enumName(names []string, i int) string {
	if i >= 0 && i < len(names) {
		return names[i]
	}
	return "invalid(" + strconv.Itoa(i) + ")"
}

// Config is a parsed pgryw DSN. Build one with NewConfig or ParseDSN; the
// zero value is not ready to use (ReadYourWrites would be off).
type Config struct {
	// Primary is the primary's connection string exactly as pgx reads it (URL
	// or keyword/value form), with pgryw's own keys removed.
	Primary string
	// Replicas are the streaming replicas, each "host[:port]", IPv6 as
	// "[addr]:port". Each addresses one standby (the wait and the read must
	// run on the same node) and inherits user, password, database, TLS and
	// runtime settings from the primary; a missing port means the primary's
	// port. DSN key replicas, a comma-separated list; default none: every
	// statement goes to the primary.
	Replicas []string
	// ReadYourWrites makes replica reads wait for the session's watermark.
	// Off, pgryw is plain read/write splitting: reads may be stale.
	// DSN key read_your_writes, on or off; default on.
	ReadYourWrites bool
	// WaitTimeout is the budget for a replica to reach the watermark.
	// DSN key wait_timeout, a Go duration or integer milliseconds from 1ms
	// to 1h; default 500ms (DefaultWaitTimeout).
	WaitTimeout time.Duration
	// OnTimeout is what a read does when WaitTimeout runs out.
	// DSN key on_timeout: primary, error or stale; default primary
	// (OnTimeoutPrimary).
	OnTimeout OnTimeout
	// MaxFallback bounds the reads running on the primary at once because
	// no replica was fresh enough for them under on_timeout=primary: behind
	// the watermark after the budget, known to be too far behind for it,
	// not known to be within MaxReplicaLag, or at MaxWaits (a read-only
	// transaction that falls back counts until it ends). Reads on the
	// primary for any other reason (writes, read-write transactions, pinned
	// connections, hints, no replica reachable) are not counted. Over the
	// bound, OnMaxFallback decides. 0 means no bound. The bound is per
	// connector: P processes send at most P×MaxFallback such reads.
	// DSN key max_fallback, 0 to 10000; default 8 (DefaultMaxFallback).
	MaxFallback int
	// OnMaxFallback is what a read over MaxFallback does.
	// DSN key on_max_fallback: wait, error or stale; default wait
	// (FallbackWait).
	OnMaxFallback OnMaxFallback
	// MaxWaits bounds, per replica, the reads waiting at once for that
	// replica to replay their watermark: a WAIT FOR LSN sent with the
	// budget as its timeout, or polling after a check found the replica
	// behind. Each holds a connection to the replica (and one of the
	// pool's) meanwhile. A read over the bound gets one check that does
	// not wait; if the replica is not there yet it is treated as behind:
	// the next replica is tried, and when none is left on_timeout decides.
	// 0 means no bound. DSN key max_waits, 0 to 10000; default 32
	// (DefaultMaxWaits).
	MaxWaits int
	// MaxReplicaLag is bounded staleness for every replica read, with or
	// without a watermark (read_your_writes=off too): a replica not known to
	// be within it of the primary is passed over; when every replica is,
	// on_timeout decides. What is known comes from a background sampler of
	// the primary's WAL position and the replicas' replay positions (see
	// README, "Overload"). DSN key max_replica_lag: a size (16MB) or a
	// duration (2s); default off.
	MaxReplicaLag ReplicaLag
	// WaitMethod selects WAIT FOR LSN or polling.
	// DSN key wait_method: auto, wait_for or poll; default auto (WaitAuto).
	WaitMethod WaitMethod
	// Pooler says what sits in front of the nodes' servers.
	// DSN key pooler: auto, none, session or transaction; default auto
	// (PoolerAuto).
	Pooler Pooler
	// SessionScope selects where the watermark lives.
	// DSN key session_scope: db or conn; default db (ScopeDB).
	SessionScope Scope
	// Capture says when a write's position is read: in the same flush as
	// the write, or, in a run of writes, by the first read that needs it.
	// DSN key capture: auto, always or on_read; default auto
	// (CaptureAuto).
	Capture Capture
	// WriteFunctions are function names, optionally schema-qualified and
	// lower-cased, always treated as writes. DSN key write_functions, a
	// comma-separated list; default none.
	WriteFunctions []string
	// ReadFunctions are function names, optionally schema-qualified and
	// lower-cased, always treated as read-only, without asking the primary's
	// catalog. DSN key read_functions, a comma-separated list; default none.
	ReadFunctions []string
	// ResetSession makes a connection that the pool hands out again start
	// with a clean session (see README, Session state). DSN key
	// reset_session, on or off; default off.
	ResetSession bool
	// Logger receives pgryw's log lines: node state changes at Info and
	// Warn, connections pinned to the primary and released at Info,
	// routing decisions at Debug. Lines never carry a password, a bind
	// argument or a statement's text. nil (the default) logs nothing. It
	// has no DSN key; sql.Open users set it with SetLogger.
	Logger *slog.Logger
}

// Defaults for the DSN keys.
const (
	DefaultWaitTimeout = 500 * time.Millisecond
	// DefaultMaxFallback: one ordinary pool's worth of queries (pgxpool's
	// default size on an 8-core host). A lag event then adds at most 8
	// reads per process to the primary's active queries instead of the
	// whole read load; a fleet of a dozen processes stays under
	// PostgreSQL's default max_connections (100) with room for its writes.
	DefaultMaxFallback = 8
	// DefaultMaxWaits: a healthy replica makes about half the reads that
	// follow a write wait for a fraction of a millisecond, so a pool of up
	// to ~64 busy connections never meets the bound; in a lag event it
	// parks at most 32 connections per replica and process, a third of
	// PostgreSQL's default max_connections.
	DefaultMaxWaits = 32
)

// NewConfig returns a Config with every pgryw default set and no replicas.
func NewConfig() *Config {
	c := &Config{}
	for _, o := range dsnOptions {
		if o.def == "" {
			continue
		}
		if err := o.parse(c, o.def); err != nil {
			panic("pgryw: default of DSN key " + o.key + ": " + err.Error())
		}
	}
	return c
}

// Clone returns a deep copy of c.
func (c *Config) Clone() *Config {
	cp := *c
	cp.Replicas = append([]string(nil), c.Replicas...)
	cp.WriteFunctions = append([]string(nil), c.WriteFunctions...)
	cp.ReadFunctions = append([]string(nil), c.ReadFunctions...)
	return &cp
}

func (c *Config) validate() error {
	for _, o := range dsnOptions {
		if o.validate == nil {
			continue
		}
		if err := o.validate(c); err != nil {
			return err
		}
	}
	if _, err := c.primaryConfig(); err != nil {
		return err
	}
	return nil
}

// primaryConfig parses Primary with pgx. Its error message is built here
// and names no secret: pgx's own messages quote the connection string,
// redacted on a best-effort basis only.
func (c *Config) primaryConfig() (*pgx.ConnConfig, error) {
	if err := checkPrimarySyntax(c.Primary); err != nil {
		return nil, err
	}
	pc, err := pgx.ParseConfig(c.Primary)
	if err != nil {
		return nil, errors.New("pgryw: primary connection string: " + scrubSecrets(c.Primary, pgxMessage(err)))
	}
	return pc, nil
}

// pgxMessage returns err's message without the connection string pgx
// quotes in a *pgconn.ParseConfigError.
func pgxMessage(err error) string {
	pce, ok := err.(*pgconn.ParseConfigError)
	if !ok {
		return err.Error()
	}
	cp := *pce
	cp.ConnString = ""
	return strings.TrimPrefix(cp.Error(), "cannot parse ``: ")
}

// FormatDSN returns a DSN that ParseDSN turns back into an equal Config: the
// primary string followed by pgryw's keys that differ from their defaults, in
// a fixed order, in the primary string's own syntax.
func (c *Config) FormatDSN() string {
	var pairs []dsnPair
	for _, o := range dsnOptions {
		if v, isDefault := o.format(c); !isDefault {
			pairs = append(pairs, dsnPair{o.key, v})
		}
	}
	var b strings.Builder
	if isURL(c.Primary) {
		// Keys go at the end of the query string, where pgx finds it (pgx
		// has no #fragment: '#' is data).
		b.WriteString(c.Primary)
		sep := "?"
		if u := parsePGURL(c.Primary); u.hasQuery {
			sep = "&"
			if u.query == "" || strings.HasSuffix(u.query, "&") {
				sep = ""
			}
		}
		for _, p := range pairs {
			b.WriteString(sep)
			b.WriteString(p.key)
			b.WriteByte('=')
			b.WriteString(url.QueryEscape(p.value))
			sep = "&"
		}
		return b.String()
	}
	b.WriteString(c.Primary)
	for _, p := range pairs {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(p.key)
		b.WriteByte('=')
		b.WriteString(quoteKV(p.value))
	}
	return b.String()
}

// String is FormatDSN with every secret replaced by xxxxx, for logs and %v:
// the URL's password, and the value of every key whose name says password,
// passwd or secret (password, sslpassword, oauth_client_secret), in either
// form, however its key is spelled (pass%77ord). A primary string whose parts
// pgx could read two ways is not shown at all.
func (c *Config) String() string {
	return redactDSN(c.FormatDSN())
}
