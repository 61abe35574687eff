package pgryw

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
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

// maxBound is the largest max_fallback or max_waits.
const maxBound = 10000

// Ranges of max_replica_lag.
const (
	maxLagBytes    = 1 << 40 // 1TB
	minLagDuration = 250 * time.Millisecond
	maxLagDuration = 24 * time.Hour
)

// maxWaitTimeout bounds the budget: a waiting read holds a connection on the
// replica for the whole budget, and WAIT FOR's TIMEOUT is an int in ms.
const maxWaitTimeout = time.Hour

// dsnOptions are pgryw's DSN keys, in the fixed order FormatDSN writes
// them. ParseDSN, FormatDSN, Config.validate and NewConfig take each key's
// parsing, spelling, range and default from here, and a test renders
// README.md's DSN table from it: a new key is one entry here (plus its
// Config field, whose doc names the key, default and range).
var dsnOptions = []dsnOption{
	listOption("replicas", "`host[:port][,host[:port]...]`, IPv6 as `[addr]:port`",
		func(c *Config) *[]string { return &c.Replicas }, parseReplicas, validateReplicas,
		"Replica nodes. Each must address **one** standby at a time (the wait and the read must land on the same node: no load-balanced endpoint; a pooler in front of one standby is fine, see [Poolers](#poolers)). A missing port means the primary's port. No replicas: every statement goes to the primary, untouched, at no added cost."),
	boolOption("read_your_writes", true, func(c *Config) *bool { return &c.ReadYourWrites },
		"`off` = plain read/write splitting with no waits: reads may be stale (eventual consistency)."),
	durationOption("wait_timeout", DefaultWaitTimeout, time.Millisecond, maxWaitTimeout,
		func(c *Config) *time.Duration { return &c.WaitTimeout },
		"Budget for a replica to reach the session's watermark."),
	enumOption("on_timeout", onTimeoutNames, OnTimeoutPrimary, func(c *Config) *OnTimeout { return &c.OnTimeout },
		"When the budget runs out: read the primary; return an error (`errors.Is(err, pgryw.ErrReplicaBehind)`, message names the watermark and the replica's position); or serve the replica's rows anyway and count them in `Stats.StaleReads`."),
	intOption("max_fallback", DefaultMaxFallback, 0, maxBound, "`0` (no bound) or a count up to 10000",
		func(c *Config) *int { return &c.MaxFallback },
		"Most reads running on the primary at once, per pool, because no replica was fresh enough (`on_timeout=primary`: behind after the budget, known too far behind, over `max_replica_lag`, at `max_waits`). A read-only transaction that falls back counts until it ends; writes, read-write transactions, pinned or hinted reads and reads with no replica reachable do not. Over it, `on_max_fallback` decides. See [Overload](#overload) for the default."),
	enumOption("on_max_fallback", onMaxFallbackNames, FallbackWait, func(c *Config) *OnMaxFallback { return &c.OnMaxFallback },
		"A read over `max_fallback`: wait for one of them to finish, at most `wait_timeout` (or the caller's deadline), then fail; fail at once; or serve the replica's rows anyway (`Stats.StaleReads`). The error matches `pgryw.ErrReplicaBehind`; its `Limit` names `max_fallback`."),
	intOption("max_waits", DefaultMaxWaits, 0, maxBound, "`0` (no bound) or a count up to 10000",
		func(c *Config) *int { return &c.MaxWaits },
		"Most reads waiting at once on one replica for their watermark (each holds a connection to it). Over it a read gets one check that does not wait; if the replica is not there, the next replica is tried, then `on_timeout` decides."),
	lagOption("max_replica_lag", func(c *Config) *ReplicaLag { return &c.MaxReplicaLag },
		"Bounded staleness for every replica read, with or without a watermark (also `read_your_writes=off`): a replica not *known* to be within this of the primary is passed over; when all are, `on_timeout` decides. See [Overload](#overload) for what is known and when."),
	enumOption("wait_method", waitMethodNames, WaitAuto, func(c *Config) *WaitMethod { return &c.WaitMethod },
		"`auto` = `WAIT FOR LSN … WITH (MODE 'standby_replay', TIMEOUT …, NO_THROW)` on servers ≥ 19, polling `pg_last_wal_replay_lsn()` on older ones. `wait_for` on an older server is reported as an error. `polar` = PolarDB's wait: `SET polar_consistency_mode`, `polar_proxy_wait_timeout_ms` and `polar_xact_split_wait_lsn` in front of the read (`on_timeout=stale` → `best_effort`, else `strict`); a replica that does not know them is reported as an error."),
	enumOption("pooler", poolerNames, PoolerAuto, func(c *Config) *Pooler { return &c.Pooler },
		"What sits in front of each node's server. `auto`: each new server connection is asked which backend it reached (one round trip at connect); another backend than the one named at startup means a pooler, taken to be in `transaction` mode. `none`: no pooler is looked for (replica connections still ask for the server's system identifier, one round trip at connect). `session`: a pooler in session mode (no named statements of pgryw's). `transaction`: a pooler that may change server connection at every transaction's end: nothing of pgryw's rides behind a statement that ends one, positions are read with round trips of their own, every replica read is checked, and session state keeps reads on the primary. See [Poolers](#poolers)."),
	enumOption("session_scope", scopeNames, ScopeDB, func(c *Config) *Scope { return &c.SessionScope },
		"`conn`: the watermark lives in each connection (`*sql.Conn`, `*sql.Tx`). `db`: additionally one watermark shared by the whole pool, so `db.Exec` followed by `db.Query` is covered even when the pool hands out different connections."),
	funcListOption("write_functions", func(c *Config) *[]string { return &c.WriteFunctions },
		"Treat these functions as writes whatever the catalog says: a name matches calls of it in any schema, qualified or not."),
	funcListOption("read_functions", func(c *Config) *[]string { return &c.ReadFunctions },
		"Treat these functions as read-only without asking the catalog: a qualified name matches calls that qualify it so, an unqualified one calls in any schema."),
	boolOption("reset_session", false, func(c *Config) *bool { return &c.ResetSession },
		"`on`: a connection the pool hands out again starts clean, as after `DISCARD ALL`: settings, `LISTEN`, temporary tables, cursors and advisory locks left by its last user are gone, on the primary and its replica connections. The reset rides in front of the connection's next statement on the primary (no round trip), except that advisory locks and `PREPARE`d statements are released at once (one round trip), and so is whatever a call of a volatile function of the database's, a `CALL` or a `DO` block may have left, which pgryw cannot see. Costs nothing for a connection left clean. See [Session state](#session-state)."),
}

// dsnOption describes one of pgryw's DSN keys: how to read it, write it
// back and check it, and its row in README.md's table.
type dsnOption struct {
	key    string // the DSN key
	typ    string // README type column: list, bool, duration, enum
	values string // README values column (Markdown)
	def    string // the default in DSN syntax; "" for none (the zero value)
	doc    string // README meaning column (Markdown)
	// parse sets c's field from the DSN value v. Its error names the key
	// and the allowed values.
	parse func(c *Config, v string) error
	// format returns c's field in DSN syntax that parse reads back, and
	// whether it is the default (FormatDSN leaves the key out then).
	format func(c *Config) (v string, isDefault bool)
	// validate checks c's field in a Config built by hand; nil when every
	// value the field can hold is valid.
	validate func(c *Config) error
}

// dsnOptionFor returns the option for key, or nil when key is not pgryw's.
func dsnOptionFor(key string) *dsnOption {
	for i := range dsnOptions {
		if dsnOptions[i].key == key {
			return &dsnOptions[i]
		}
	}
	return nil
}

func isDSNKey(k string) bool { return dsnOptionFor(k) != nil }

// listOption is a comma-separated list, empty by default. check, when not
// nil, validates a list set by hand.
func listOption(key, values string, field func(*Config) *[]string, parse func(key, v string) ([]string, error), check func(key string, list []string) error, doc string) dsnOption {
	o := dsnOption{key: key, typ: "list", values: values, doc: doc,
		parse: func(c *Config, v string) error {
			list, err := parse(key, v)
			if err != nil {
				return err
			}
			*field(c) = list
			return nil
		},
		format: func(c *Config) (string, bool) {
			list := *field(c)
			return strings.Join(list, ","), len(list) == 0
		},
	}
	if check != nil {
		o.validate = func(c *Config) error { return check(key, *field(c)) }
	}
	return o
}

// funcListOption is a list of function names (parseFuncList), written back
// with the quotes their parts need.
func funcListOption(key string, field func(*Config) *[]string, doc string) dsnOption {
	o := listOption(key, "function names, optionally schema-qualified; double-quote a part to keep its case", field, parseFuncList, nil, doc)
	o.format = func(c *Config) (string, bool) {
		list := *field(c)
		names := make([]string, len(list))
		for i, f := range list {
			names[i] = formatFuncName(f)
		}
		return strings.Join(names, ","), len(list) == 0
	}
	return o
}

// boolOption is on or off (also true/false, 1/0).
func boolOption(key string, def bool, field func(*Config) *bool, doc string) dsnOption {
	word := func(b bool) string {
		if b {
			return "on"
		}
		return "off"
	}
	return dsnOption{key: key, typ: "bool", values: "`on`, `off`", def: word(def), doc: doc,
		parse: func(c *Config, v string) error {
			switch v {
			case "on", "true", "1":
				*field(c) = true
			case "off", "false", "0":
				*field(c) = false
			default:
				return badValue(key, v, "on, off")
			}
			return nil
		},
		format: func(c *Config) (string, bool) {
			b := *field(c)
			return word(b), b == def
		},
	}
}

// durationOption is a Go duration or integer milliseconds, from min to max.
func durationOption(key string, def, min, max time.Duration, field func(*Config) *time.Duration, doc string) dsnOption {
	span := shortDuration(min) + " to " + shortDuration(max)
	return dsnOption{key: key, typ: "duration",
		values: "Go duration (`500ms`, `2s`) or integer milliseconds; " + span,
		def:    shortDuration(def), doc: doc,
		parse: func(c *Config, v string) error {
			d, err := parseDuration(key, v, min, max)
			if err != nil {
				return err
			}
			*field(c) = d
			return nil
		},
		format: func(c *Config) (string, bool) {
			d := *field(c)
			return d.String(), d == def
		},
		validate: func(c *Config) error {
			if d := *field(c); d < min || d > max {
				return fmt.Errorf("pgryw: %s %v out of range (%s)", key, d, span)
			}
			return nil
		},
	}
}

// enumOption is one of names, spelled as the type's String method does;
// the value is the name's index.
func enumOption[T ~uint8](key string, names []string, def T, field func(*Config) *T, doc string) dsnOption {
	allowed := strings.Join(names, ", ")
	return dsnOption{key: key, typ: "enum", values: "`" + strings.Join(names, "`, `") + "`", def: names[def], doc: doc,
		parse: func(c *Config, v string) error {
			i, err := parseEnum(key, v, names)
			if err != nil {
				return err
			}
			*field(c) = T(i)
			return nil
		},
		format: func(c *Config) (string, bool) {
			x := *field(c)
			return enumName(names, int(x)), x == def
		},
		validate: func(c *Config) error {
			if x := *field(c); int(x) >= len(names) {
				return badValue(key, enumName(names, int(x)), allowed)
			}
			return nil
		},
	}
}

// intOption is a decimal integer from min to max.
func intOption(key string, def, min, max int, values string, field func(*Config) *int, doc string) dsnOption {
	allowed := fmt.Sprintf("an integer from %d to %d", min, max)
	return dsnOption{key: key, typ: "int", values: values, def: strconv.Itoa(def), doc: doc,
		parse: func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < min || n > max {
				return badValue(key, v, allowed)
			}
			*field(c) = n
			return nil
		},
		format: func(c *Config) (string, bool) {
			n := *field(c)
			return strconv.Itoa(n), n == def
		},
		validate: func(c *Config) error {
			if n := *field(c); n < min || n > max {
				return fmt.Errorf("pgryw: %s %d out of range (%d to %d)", key, n, min, max)
			}
			return nil
		},
	}
}

// lagOption is off, a size in WAL bytes or a duration.
func lagOption(key string, field func(*Config) *ReplicaLag, doc string) dsnOption {
	return dsnOption{key: key, typ: "size or duration",
		values: "`off`; WAL bytes with a unit (`B`, `kB`, `MB`, `GB`, `TB`, 1024-based as in PostgreSQL: `16MB`), 1B to 1TB; or a Go duration (`2s`), " +
			shortDuration(minLagDuration) + " to " + shortDuration(maxLagDuration),
		def: "off", doc: doc,
		parse: func(c *Config, v string) error {
			l, err := parseReplicaLag(key, v)
			if err != nil {
				return err
			}
			*field(c) = l
			return nil
		},
		format: func(c *Config) (string, bool) {
			l := *field(c)
			return l.String(), l.IsZero()
		},
		validate: func(c *Config) error { return field(c).validate(key) },
	}
}

// byteUnits are PostgreSQL's memory units, 1024-based, largest first.
var byteUnits = []struct {
	name string
	size uint64
}{{"TB", 1 << 40}, {"GB", 1 << 30}, {"MB", 1 << 20}, {"kB", 1 << 10}, {"B", 1}}

// formatBytes writes n in the largest unit that divides it.
func formatBytes(n uint64) string {
	for _, u := range byteUnits {
		if n%u.size == 0 {
			return strconv.FormatUint(n/u.size, 10) + u.name
		}
	}
	return strconv.FormatUint(n, 10) + "B"
}

// parseReplicaLag reads off, a size (a digit string and a unit ending in
// B, in any case: no Go duration unit ends so) or a Go duration. A bare
// number is refused: bytes or milliseconds would both be guesses.
func parseReplicaLag(key, v string) (ReplicaLag, error) {
	allowed := "off; a size with a unit (B, kB, MB, GB, TB) from 1B to 1TB, such as 16MB; or a Go duration from " +
		shortDuration(minLagDuration) + " to " + shortDuration(maxLagDuration) + ", such as 2s"
	if v == "off" {
		return ReplicaLag{}, nil
	}
	var l ReplicaLag
	if strings.HasSuffix(v, "B") || strings.HasSuffix(v, "b") {
		i := 0
		for i < len(v) && v[i] >= '0' && v[i] <= '9' {
			i++
		}
		n, err := strconv.ParseUint(v[:i], 10, 64)
		if err != nil {
			return l, badValue(key, v, allowed)
		}
		unit := uint64(0)
		for _, u := range byteUnits {
			if strings.EqualFold(v[i:], u.name) {
				unit = u.size
			}
		}
		if unit == 0 || n > maxLagBytes/unit {
			return l, badValue(key, v, allowed)
		}
		l.Bytes = n * unit
	} else {
		d, err := time.ParseDuration(v)
		if err != nil {
			return l, badValue(key, v, allowed)
		}
		l.Duration = d
	}
	if l.IsZero() || l.validate(key) != nil {
		return ReplicaLag{}, badValue(key, v, allowed)
	}
	return l, nil
}

// validate checks a bound set by hand.
func (l ReplicaLag) validate(key string) error {
	switch {
	case l.Bytes != 0 && l.Duration != 0:
		return fmt.Errorf("pgryw: %s sets both Bytes and Duration; set one", key)
	case l.Bytes > maxLagBytes:
		return fmt.Errorf("pgryw: %s %s out of range (1B to 1TB)", key, formatBytes(l.Bytes))
	case l.Duration != 0 && (l.Duration < minLagDuration || l.Duration > maxLagDuration):
		return fmt.Errorf("pgryw: %s %v out of range (%s to %s)", key, l.Duration, shortDuration(minLagDuration), shortDuration(maxLagDuration))
	}
	return nil
}

// shortDuration is d.String() without trailing zero units: 1h, not 1h0m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

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

// ParseDSN parses a pgx connection string for the primary that may carry
// pgryw's keys (see the README for each). pgryw's keys are removed before the
// rest is validated with pgx.ParseConfig. Errors name the offending key and
// the allowed values, and never include a password.
func ParseDSN(dsn string) (*Config, error) {
	cfg := NewConfig()
	var (
		primary string
		pairs   []dsnPair
		err     error
	)
	if isURL(dsn) {
		primary, pairs, err = splitURL(dsn)
	} else {
		primary, pairs, err = splitKeywordValue(dsn)
	}
	if err != nil {
		return nil, err
	}
	// Before any value is judged (and quoted in an error): only a primary
	// string whose parts pgx reads one way only says for sure which text is
	// a password.
	if err := checkPrimarySyntax(primary); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, p := range pairs {
		if seen[p.key] {
			return nil, fmt.Errorf("pgryw: DSN key %s given twice", p.key)
		}
		seen[p.key] = true
		if err := dsnOptionFor(p.key).parse(cfg, p.value); err != nil {
			return nil, err
		}
	}
	cfg.Primary = primary
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

type dsnPair struct{ key, value string }

func badValue(key, v, allowed string) error {
	return fmt.Errorf("pgryw: DSN key %s: invalid value %q (allowed: %s)", key, clip(v), allowed)
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

func parseEnum(key, v string, names []string) (int, error) {
	for i, n := range names {
		if v == n {
			return i, nil
		}
	}
	return 0, badValue(key, v, strings.Join(names, ", "))
}

// parseDuration reads a Go duration or integer milliseconds from min to max.
func parseDuration(key, v string, min, max time.Duration) (time.Duration, error) {
	allowed := "a Go duration such as 500ms or 2s, or integer milliseconds, from " + shortDuration(min) + " to " + shortDuration(max)
	var d time.Duration
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 || n > int64(max/time.Millisecond) {
			return 0, badValue(key, v, allowed)
		}
		d = time.Duration(n) * time.Millisecond
	} else {
		pd, err := time.ParseDuration(v)
		if err != nil {
			return 0, badValue(key, v, allowed)
		}
		d = pd
	}
	if d < min || d > max {
		return 0, badValue(key, v, allowed)
	}
	return d, nil
}

func parseReplicas(key, v string) ([]string, error) {
	const allowed = "host[:port][,host[:port]...], IPv6 as [addr]:port"
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	var out []string
	for _, e := range strings.Split(v, ",") {
		e = strings.TrimSpace(e)
		if _, _, err := splitHostPort(e, 0); err != nil {
			return nil, badValue(key, v, allowed+"; "+err.Error())
		}
		out = append(out, e)
	}
	return out, nil
}

// validateReplicas checks replicas entries set by hand.
func validateReplicas(key string, list []string) error {
	for _, r := range list {
		if _, _, err := splitHostPort(r, 0); err != nil {
			return badValue(key, strings.Join(list, ","), err.Error())
		}
	}
	return nil
}

// splitHostPort splits one replicas entry; defPort stands in for a missing port.
func splitHostPort(e string, defPort uint16) (string, uint16, error) {
	if e == "" {
		return "", 0, fmt.Errorf("empty entry")
	}
	if strings.HasPrefix(e, "/") { // Unix socket directory: no port suffix.
		return e, defPort, nil
	}
	host, portStr := e, ""
	if strings.HasPrefix(e, "[") || strings.Count(e, ":") == 1 {
		h, p, err := net.SplitHostPort(e)
		if err != nil {
			if strings.HasPrefix(e, "[") && strings.HasSuffix(e, "]") {
				h, p = e[1:len(e)-1], ""
			} else {
				return "", 0, fmt.Errorf("entry %q: %v", e, err)
			}
		}
		host, portStr = h, p
	} else if strings.Contains(e, ":") {
		return "", 0, fmt.Errorf("entry %q: write IPv6 addresses as [addr] or [addr]:port", e)
	}
	if host == "" || strings.ContainsAny(host, " \t'\"\\/?#@") {
		return "", 0, fmt.Errorf("entry %q: bad host", e)
	}
	port := defPort
	if portStr != "" {
		n, err := strconv.ParseUint(portStr, 10, 16)
		if err != nil || n == 0 {
			return "", 0, fmt.Errorf("entry %q: port must be 1-65535", e)
		}
		port = uint16(n)
	}
	return host, port, nil
}

func parseFuncList(key, v string) ([]string, error) {
	bad := badValue(key, v, "a comma-separated list of function names, optionally schema-qualified, double-quoted where their case or characters need it")
	v = strings.TrimSpace(v)
	var l funcListLexer
	for i := 0; i < len(v); i++ {
		var ok bool
		if i, ok = l.step(v, i); !ok {
			return nil, bad
		}
	}
	if l.inQuote || v == "" || !l.endName() {
		return nil, bad
	}
	return l.out, nil
}

// funcListLexer is parseFuncList's state: the names so far, the parts of
// the one being read, and the part being read.
type funcListLexer struct {
	out, parts      []string
	cur             strings.Builder
	quoted, inQuote bool // the part is double-quoted; inside its quotes
}

// step takes v[i] (and, for a doubled quote, v[i+1]), returning where it
// stopped, or false when v is not a function list.
func (l *funcListLexer) step(v string, i int) (int, bool) {
	c := v[i]
	switch {
	case l.inQuote:
		if c != '"' {
			l.cur.WriteByte(c)
		} else if i+1 < len(v) && v[i+1] == '"' {
			l.cur.WriteByte('"')
			i++
		} else {
			l.inQuote = false
		}
	case c == '"' && l.cur.Len() == 0 && !l.quoted:
		l.inQuote, l.quoted = true, true
	case c == '.':
		return i, l.flushPart()
	case c == ',':
		return i, l.endName()
	case c == ' ' || c == '\t':
		// around a name: skip; inside one, refused by flushPart
		return i, l.cur.Len() == 0 || l.quoted || onlyBlanksToComma(v[i:])
	case l.quoted:
		return i, false // text after a closing quote
	default:
		l.cur.WriteByte(c)
	}
	return i, true
}

// onlyBlanksToComma reports that s holds blanks up to its end or a comma.
func onlyBlanksToComma(s string) bool {
	j := 0
	for j < len(s) && (s[j] == ' ' || s[j] == '\t') {
		j++
	}
	return j == len(s) || s[j] == ','
}

// flushPart ends a part of a name (a schema or the name itself).
func (l *funcListLexer) flushPart() bool {
	p := l.cur.String()
	l.cur.Reset()
	switch {
	case p == "" || !l.quoted && strings.TrimSpace(p) != p:
		return false
	case !l.quoted && !unquotedName(p):
		return false
	case !l.quoted:
		p = asciiLower(p)
	case strings.IndexByte(p, '.') >= 0:
		return false // the classifier cannot tell it from a qualified name
	}
	l.parts = append(l.parts, p)
	l.quoted = false
	return true
}

// endName ends a function's name: one part, or a schema and a name.
func (l *funcListLexer) endName() bool {
	if !l.flushPart() || len(l.parts) > 2 {
		return false
	}
	l.out = append(l.out, strings.Join(l.parts, "."))
	l.parts = l.parts[:0]
	return true
}

// unquotedName reports that p is made of the characters an unquoted name
// may hold.
func unquotedName(p string) bool {
	for _, r := range p {
		if !(r == '_' || r == '$' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r > 127) {
			return false
		}
	}
	return true
}

// asciiLower folds ASCII letters only, as the server folds unquoted names.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// formatFuncName writes a name of parseFuncList's back, quoting each part
// that unquoted would read otherwise.
func formatFuncName(f string) string {
	parts := strings.Split(f, ".")
	for i, p := range parts {
		plain := p != ""
		for j := 0; j < len(p); j++ {
			c := p[j]
			if !(c == '_' || c == '$' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c > 127) {
				plain = false
			}
		}
		if !plain {
			parts[i] = `"` + strings.ReplaceAll(p, `"`, `""`) + `"`
		}
	}
	return strings.Join(parts, ".")
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

func isURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

// splitURL removes pgryw's keys from a URL's query string, keeping every
// other byte of the URL as it was so pgx sees exactly what the user wrote.
// The query string starts where pgx finds it: a '?' in the user information
// (a password) or in an [IPv6] host does not start it.
func splitURL(dsn string) (string, []dsnPair, error) {
	u := parsePGURL(dsn)
	if !u.hasQuery {
		return dsn, nil, nil
	}
	q := len(dsn) - len(u.query) - 1 // the '?'
	var kept []string
	var pairs []dsnPair
	for _, raw := range strings.Split(u.query, "&") {
		if raw == "" {
			continue
		}
		k, v, _ := strings.Cut(raw, "=")
		key, err := url.QueryUnescape(k)
		if err != nil || !isDSNKey(key) {
			kept = append(kept, raw)
			continue
		}
		val, err := url.QueryUnescape(v)
		if err != nil {
			return "", nil, fmt.Errorf("pgryw: DSN key %s: bad URL escape in value", key)
		}
		pairs = append(pairs, dsnPair{key, val})
	}
	w := dsn[:q]
	if len(kept) > 0 {
		w += "?" + strings.Join(kept, "&")
	}
	return w, pairs, nil
}

// splitKeywordValue removes pgryw's keys from a libpq keyword/value string.
// The primary part is rebuilt from the remaining pairs' original text joined
// by single spaces.
func splitKeywordValue(dsn string) (string, []dsnPair, error) {
	var kept []string
	var pairs []dsnPair
	kvs, bad := scanKeywordValue(dsn)
	if bad.at >= 0 {
		switch {
		case isDSNKey(bad.key) && bad.unterminated:
			return "", nil, fmt.Errorf("pgryw: DSN key %s: unterminated quoted value", bad.key)
		case isDSNKey(bad.key):
			return "", nil, fmt.Errorf("pgryw: DSN key %s has no value (write %s=value)", bad.key, bad.key)
		}
		return "", nil, bad.err()
	}
	for _, p := range kvs {
		switch {
		case isDSNKey(p.key):
			pairs = append(pairs, dsnPair{p.key, p.value})
		case p.value == "" && !p.quoted:
			// An empty unquoted value ends the string; once pgryw's keys
			// follow it, it would swallow the next one. Quote it.
			kept = append(kept, p.key+"=''")
		default:
			kept = append(kept, dsn[p.start:p.end])
		}
	}
	return strings.Join(kept, " "), pairs, nil
}

// kvPair is one keyword=value pair of a keyword/value string.
type kvPair struct {
	key        string
	value      string // with quotes and backslash escapes removed
	start, end int    // the pair's text
	valStart   int    // the value's text, from its opening quote if quoted
	quoted     bool
}

// kvBad says where a keyword/value string stops making sense.
type kvBad struct {
	at           int    // byte offset of the offending pair; -1 when none
	key          string // its keyword as far as it goes
	unterminated bool   // a quoted value without its closing quote; else a keyword without '='
}

// err describes the problem without quoting any of the text, which may be
// a password the user meant to write.
func (b kvBad) err() error {
	what := `a keyword without "=" (quote values with spaces: key='a b')`
	if b.unterminated {
		what = "a quoted value without its closing quote"
	}
	return fmt.Errorf("pgryw: primary connection string: %s at byte %d", what, b.at)
}

// scanKeywordValue reads a libpq keyword/value string as pgx does: keyword,
// optional spaces, '=', optional spaces, then a value that is either quoted
// ('…', with \' and \\) or runs to the next space (with \ escaping the next
// byte). It returns the pairs up to where the text stops making sense.
func scanKeywordValue(s string) ([]kvPair, kvBad) {
	var out []kvPair
	i := 0
	for {
		i = skipSpace(s, i)
		if i >= len(s) {
			return out, kvBad{at: -1}
		}
		p := kvPair{start: i}
		for i < len(s) && s[i] != '=' && !isSpace(s[i]) {
			i++
		}
		p.key = s[p.start:i]
		i = skipSpace(s, i)
		if i >= len(s) || s[i] != '=' {
			return out, kvBad{at: p.start, key: p.key}
		}
		i = skipSpace(s, i+1)
		p.valStart = i
		var closed bool
		if i < len(s) && s[i] == '\'' {
			p.quoted = true
			p.value, i, closed = scanKVValue(s, i+1, true)
			if !closed {
				return out, kvBad{at: p.start, key: p.key, unterminated: true}
			}
		} else {
			p.value, i, _ = scanKVValue(s, i, false)
		}
		p.end = i
		out = append(out, p)
	}
}

// skipSpace returns the first index from i of s that is not a blank.
func skipSpace(s string, i int) int {
	for i < len(s) && isSpace(s[i]) {
		i++
	}
	return i
}

// scanKVValue reads a value from s[i:], with backslash escapes: up to the
// closing quote (quoted; closed reports that there was one, and end is
// past it) or to the next blank.
func scanKVValue(s string, i int, quoted bool) (val string, end int, closed bool) {
	var b strings.Builder
	for i < len(s) {
		ch := s[i]
		switch {
		case ch == '\\' && i+1 < len(s):
			b.WriteByte(s[i+1])
			i += 2
			continue
		case quoted && ch == '\'':
			return b.String(), i + 1, true
		case !quoted && isSpace(ch):
			return b.String(), i, false
		}
		b.WriteByte(ch)
		i++
	}
	return b.String(), i, false
}

func isSpace(b byte) bool {
	return b == ' ' || b == '\t' || b == '\n' || b == '\r' || b == '\f' || b == '\v'
}

// quoteKV quotes a keyword/value value when it needs it.
func quoteKV(v string) string {
	if v != "" && !strings.ContainsAny(v, " \t\n\r\f\v'\\") {
		return v
	}
	r := strings.NewReplacer(`\`, `\\`, `'`, `\'`)
	return "'" + r.Replace(v) + "'"
}

// pgURL is a postgres:// URL cut where pgx cuts it, each part as written.
// pgx has its own URL parser (libpq's rules), not net/url's: the user
// information ends at the first '@' if one comes before any '/', and the
// password follows the first ':' in it; hosts are a comma-separated list of
// host[:port], IPv6 in brackets; the query string starts at the next '?';
// '#' is data, not a fragment; '+' is a plus.
type pgURL struct {
	scheme   string // "postgres://" or "postgresql://"
	userinfo bool   // user information ends at an '@'
	user     string
	password string
	hasPass  bool
	netloc   string // hosts and ports
	path     string // after '/', when hasPath
	hasPath  bool
	query    string // after '?', when hasQuery
	hasQuery bool
	// problem says why pgx would refuse the URL, or could be reading it
	// other than as meant (a stray '@' is most likely a password's);
	// "" when neither.
	problem string
}

func parsePGURL(s string) pgURL {
	var u pgURL
	p := s
	for _, pre := range []string{"postgresql://", "postgres://"} {
		if rest, ok := strings.CutPrefix(s, pre); ok {
			u.scheme, p = pre, rest
			break
		}
	}
	if u.scheme == "" {
		u.problem = "not a postgres:// or postgresql:// URL"
		return u
	}
	if i := strings.IndexAny(p, "@/"); i >= 0 && p[i] == '@' {
		u.userinfo = true
		u.user, u.password, u.hasPass = strings.Cut(p[:i], ":")
		p = p[i+1:]
	}
	i, ok := netlocEnd(p)
	if !ok {
		u.netloc = p
		u.problem = `a "[" without its "]" in the host`
		return u
	}
	u.netloc, p = p[:i], p[i:]
	if strings.HasPrefix(p, "/") {
		u.hasPath = true
		u.path, u.query, u.hasQuery = strings.Cut(p[1:], "?")
	} else if strings.HasPrefix(p, "?") {
		u.query, u.hasQuery = p[1:], true
	}
	u.problem = u.check(s)
	return u
}

// netlocEnd is where a URL's hosts end: at the first '/' or '?' outside an
// element's [brackets]; false for a '[' without its ']'.
func netlocEnd(p string) (int, bool) {
	i := 0
	for {
		if i < len(p) && p[i] == '[' {
			j := strings.IndexByte(p[i:], ']')
			if j < 0 {
				return 0, false
			}
			i += j + 1
		}
		for i < len(p) && p[i] != '/' && p[i] != '?' && p[i] != ',' {
			i++
		}
		if i < len(p) && p[i] == ',' {
			i++
			continue
		}
		return i, true
	}
}

// check returns why pgx would refuse u, or may read it other than as
// meant; "" when neither. It follows pgx's parseURLSettings, and also
// refuses an '@' after the user information, which pgx would take as part
// of a host, port or database name but is far more likely the rest of a
// password with a literal '@' (write %40).
func (u *pgURL) check(s string) string {
	if strings.IndexByte(s, 0) >= 0 {
		return "a NUL byte"
	}
	for _, c := range []func() string{u.checkUser, u.checkNetloc, u.checkPath, u.checkQuery} {
		if why := c(); why != "" {
			return why
		}
	}
	return ""
}

// checkUser is check's part for the user information.
func (u *pgURL) checkUser() string {
	if !u.userinfo {
		return ""
	}
	if _, why := uriDecode(u.user); why != "" {
		return "user name: " + why
	}
	if u.hasPass && u.password != "" {
		if _, why := uriDecode(u.password); why != "" {
			return "password: " + why
		}
	}
	return ""
}

// checkNetloc is check's part for the hosts and ports.
func (u *pgURL) checkNetloc() string {
	hosts, ports, why := splitNetloc(u.netloc)
	if why != "" {
		return why
	}
	if strings.ContainsRune(u.netloc, '@') {
		return `an "@" after the user information (write "@" in a password as %40)`
	}
	if _, why := uriDecode(hosts); why != "" {
		return "host: " + why
	}
	pl, why := uriDecode(ports)
	if why != "" {
		return "port: " + why
	}
	for _, r := range pl {
		if r != ',' && (r < '0' || r > '9') {
			return "a port that is not a number"
		}
	}
	return ""
}

// splitNetloc splits a URL's comma-separated host[:port] list into its
// hosts and its ports, each comma-separated, as pgx does.
func splitNetloc(p string) (string, string, string) {
	var hosts, ports strings.Builder
	for {
		var host string
		var why string
		if host, p, why = cutHost(p); why != "" {
			return "", "", why
		}
		hosts.WriteString(host)
		if strings.HasPrefix(p, ":") {
			i := strings.IndexByte(p, ',')
			if i < 0 {
				i = len(p)
			}
			ports.WriteString(p[1:i])
			p = p[i:]
		}
		if !strings.HasPrefix(p, ",") {
			return hosts.String(), ports.String(), ""
		}
		p = p[1:]
		hosts.WriteByte(',')
		ports.WriteByte(',')
	}
}

// cutHost cuts the host (a name, an address, or an [IPv6] address) from
// the front of p.
func cutHost(p string) (host, rest, why string) {
	if !strings.HasPrefix(p, "[") {
		i := strings.IndexAny(p, ":,")
		if i < 0 {
			i = len(p)
		}
		return p[:i], p[i:], ""
	}
	end := strings.IndexByte(p, ']')
	if end == 1 {
		return "", "", "an empty [IPv6] host"
	}
	host, rest = p[1:end], p[end+1:]
	if rest != "" && rest[0] != ':' && rest[0] != ',' {
		return "", "", `a character other than ":" after an [IPv6] host`
	}
	return host, rest, ""
}

// checkPath is check's part for the database name.
func (u *pgURL) checkPath() string {
	if !u.hasPath || u.path == "" {
		return ""
	}
	if strings.ContainsRune(u.path, '@') {
		return `an "@" in the database name (write it as %40)`
	}
	if _, why := uriDecode(u.path); why != "" {
		return "database name: " + why
	}
	return ""
}

// checkQuery is check's part for the query parameters.
func (u *pgURL) checkQuery() string {
	params, n := u.query, 0
	for params != "" {
		n++
		pair, rest, _ := strings.Cut(params, "&")
		params = rest
		k, v, ok := strings.Cut(pair, "=")
		if !ok {
			return fmt.Sprintf(`query parameter %d has no "="`, n)
		}
		if strings.ContainsRune(v, '=') {
			return fmt.Sprintf(`query parameter %d has a second "=" (write it as %%3D)`, n)
		}
		if _, why := uriDecode(k); why != "" {
			return fmt.Sprintf("query parameter %d: key: %s", n, why)
		}
		if _, why := uriDecode(v); why != "" {
			return fmt.Sprintf("query parameter %d: value: %s", n, why)
		}
	}
	return ""
}

// uriDecode percent-decodes one URL part as pgx does: '%' and two hex
// digits, %00 refused, leading and trailing spaces dropped, inner spaces
// refused, '+' left alone. why says what is wrong, quoting nothing.
func uriDecode(raw string) (string, string) {
	raw = strings.Trim(raw, " ")
	if strings.IndexByte(raw, ' ') >= 0 {
		return "", "a space (write it as %20)"
	}
	if !strings.Contains(raw, "%") {
		return raw, ""
	}
	var b strings.Builder
	for i := 0; i < len(raw); i++ {
		if raw[i] != '%' {
			b.WriteByte(raw[i])
			continue
		}
		if i+2 >= len(raw) || !isHex(raw[i+1]) || !isHex(raw[i+2]) {
			return "", `a "%" not followed by two hex digits`
		}
		c := unhex(raw[i+1])<<4 | unhex(raw[i+2])
		if c == 0 {
			return "", "%00"
		}
		b.WriteByte(c)
		i += 2
	}
	return b.String(), ""
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= 'a':
		return c - 'a' + 10
	case c >= 'A':
		return c - 'A' + 10
	}
	return c - '0'
}

// uriDecodeLenient decodes what it can and keeps the rest, for finding
// secret keys and values in text that did not decode.
func uriDecodeLenient(raw string) string {
	if v, why := uriDecode(raw); why == "" {
		return v
	}
	if v, err := url.PathUnescape(raw); err == nil {
		return v
	}
	return raw
}

// isSecretKey reports whether a connection string key holds a secret: pgx's
// password and sslpassword, libpq's oauth_client_secret, and to be safe any
// key whose name says so in any case.
func isSecretKey(k string) bool {
	k = strings.ToLower(k)
	return strings.Contains(k, "password") || strings.Contains(k, "passwd") || strings.Contains(k, "secret")
}

// checkPrimarySyntax reports a primary string pgx would refuse, or whose
// parts it could read other than as meant, naming the problem and where
// but quoting none of the text.
func checkPrimarySyntax(s string) error {
	if isURL(s) {
		if u := parsePGURL(s); u.problem != "" {
			return fmt.Errorf("pgryw: primary connection string: malformed URL: %s", u.problem)
		}
		return nil
	}
	if _, bad := scanKeywordValue(s); bad.at >= 0 {
		return bad.err()
	}
	return nil
}

const (
	redacted           = "xxxxx"
	redactedURL        = "<unparseable URL: redacted>"
	redactedKVTail     = "<unparseable rest: redacted>"
	redactedMaxSecrets = 64
)

// redactDSN replaces every secret in either DSN form with xxxxx. Text it
// cannot take apart the way pgx does is not shown: a whole URL, or a
// keyword/value string from the first pair that does not parse.
func redactDSN(s string) string {
	if isURL(s) {
		u := parsePGURL(s)
		if u.problem != "" {
			return redactedURL
		}
		var b strings.Builder
		b.WriteString(u.scheme)
		if u.userinfo {
			b.WriteString(u.user)
			if u.hasPass {
				b.WriteString(":" + redacted)
			}
			b.WriteByte('@')
		}
		b.WriteString(u.netloc)
		if u.hasPath {
			b.WriteString("/" + u.path)
		}
		if u.hasQuery {
			b.WriteByte('?')
			for i, pair := range strings.Split(u.query, "&") {
				if i > 0 {
					b.WriteByte('&')
				}
				k, _, hasValue := strings.Cut(pair, "=")
				if hasValue && isSecretKey(uriDecodeLenient(k)) {
					b.WriteString(k + "=" + redacted)
				} else {
					b.WriteString(pair)
				}
			}
		}
		return b.String()
	}
	kvs, bad := scanKeywordValue(s)
	var b strings.Builder
	last := 0
	for _, p := range kvs {
		if isSecretKey(p.key) {
			b.WriteString(s[last:p.valStart])
			b.WriteString(redacted)
			last = p.end
		}
	}
	if bad.at >= 0 {
		b.WriteString(s[last:bad.at])
		b.WriteString(redactedKVTail)
		return b.String()
	}
	b.WriteString(s[last:])
	return b.String()
}

// scrubSecrets replaces in msg every secret dsn holds, as written and
// decoded, for messages from pgx.
func scrubSecrets(dsn, msg string) string {
	var secrets []string
	add := func(v string) {
		if v != "" && len(secrets) < redactedMaxSecrets {
			secrets = append(secrets, v)
			if q := strconv.Quote(v); q[1:len(q)-1] != v {
				secrets = append(secrets, q[1:len(q)-1])
			}
		}
	}
	if isURL(dsn) {
		u := parsePGURL(dsn)
		if u.hasPass {
			add(u.password)
			add(uriDecodeLenient(u.password))
		}
		for _, pair := range strings.Split(u.query, "&") {
			if k, v, ok := strings.Cut(pair, "="); ok && isSecretKey(uriDecodeLenient(k)) {
				add(v)
				add(uriDecodeLenient(v))
			}
		}
	} else {
		kvs, _ := scanKeywordValue(dsn)
		for _, p := range kvs {
			if isSecretKey(p.key) {
				add(dsn[p.valStart:p.end])
				add(p.value)
			}
		}
	}
	// Longest first, so that a secret containing another is replaced whole.
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	for _, v := range secrets {
		msg = strings.ReplaceAll(msg, v, redacted)
	}
	return msg
}
