package pgryw

import (
	"fmt"
	"strconv"
	"strings"
	"time"
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
		"What sits in front of each node's server. `auto`: each new server connection is asked which backend it reached (one round trip at connect); another backend than the one named at startup means a pooler, taken to be in `transaction` mode. `none`: no pooler is looked for (replica connections still ask which server instance, of which cluster, they reached: one round trip at connect). `session`: a pooler in session mode (no named statements of pgryw's). `transaction`: a pooler that may change server connection at every transaction's end: nothing of pgryw's rides behind a statement that ends one, positions are read with round trips of their own, every replica read is checked, and session state keeps reads on the primary. See [Poolers](#poolers)."),
	enumOption("session_scope", scopeNames, ScopeDB, func(c *Config) *Scope { return &c.SessionScope },
		"`conn`: the watermark lives in each connection (`*sql.Conn`, `*sql.Tx`). `db`: additionally one watermark shared by the whole pool, so `db.Exec` followed by `db.Query` is covered even when the pool hands out different connections."),
	enumOption("capture", captureNames, CaptureAuto, func(c *Config) *Capture { return &c.Capture },
		"When a write's position is read on the primary. `auto`: in the same flush as the write (no extra round trip), except in a run of writes with no read (nor token) asking for a watermark in between: there the position is read by the first read that needs it, one round trip covering the whole run (but for a second after a read had to do so for another connection's write: concurrent readers would pay for each such run). `always`: with every write, one capture each. `on_read`: never with a write; every position is read by the first read (or token) that needs it, a round trip to the primary before it (on the writing connection, before PostgreSQL 19, overlapping the replica's poll; for a `Session`'s token, on a connection of its own): the least work for the primary."),
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
