package pgryw

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// OnTimeout says what a replica read does when the replica has not replayed
// the session's watermark within the wait budget.
type OnTimeout uint8

const (
	// OnTimeoutPrimary reads from the writer instead. Correct, at the cost of
	// writer load; the default.
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
)

var waitMethodNames = []string{"auto", "wait_for", "poll"}

// String returns the DSN spelling.
func (w WaitMethod) String() string { return enumName(waitMethodNames, int(w)) }

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

func enumName(names []string, i int) string {
	if i >= 0 && i < len(names) {
		return names[i]
	}
	return "invalid(" + strconv.Itoa(i) + ")"
}

// Config is a parsed pgryw DSN. Build one with NewConfig or ParseDSN; the
// zero value is not ready to use (ReadYourWrites would be off).
type Config struct {
	// Writer is the writer's connection string exactly as pgx reads it (URL
	// or keyword/value form), with pgryw's own keys removed.
	Writer string
	// Replicas are the streaming replicas, each "host[:port]". Each addresses
	// one standby (the wait and the read must run on the same node) and
	// inherits user, password, database, TLS and runtime settings from the
	// writer; a missing port means the writer's port.
	Replicas []string
	// ReadYourWrites makes replica reads wait for the session's watermark.
	// Off, pgryw is plain read/write splitting: reads may be stale.
	ReadYourWrites bool
	// WaitTimeout is the budget for a replica to reach the watermark.
	WaitTimeout time.Duration
	// OnTimeout is what a read does when WaitTimeout runs out.
	OnTimeout OnTimeout
	// WaitMethod selects WAIT FOR LSN or polling.
	WaitMethod WaitMethod
	// SessionScope selects where the watermark lives.
	SessionScope Scope
	// WriteFunctions are function names always treated as writes.
	WriteFunctions []string
	// ReadFunctions are function names always treated as read-only, without
	// asking the writer's catalog.
	ReadFunctions []string
}

// Defaults for the DSN keys.
const (
	DefaultWaitTimeout = 500 * time.Millisecond
)

// NewConfig returns a Config with every pgryw default set and no replicas.
func NewConfig() *Config {
	return &Config{ReadYourWrites: true, WaitTimeout: DefaultWaitTimeout}
}

// Clone returns a deep copy of c.
func (c *Config) Clone() *Config {
	cp := *c
	cp.Replicas = append([]string(nil), c.Replicas...)
	cp.WriteFunctions = append([]string(nil), c.WriteFunctions...)
	cp.ReadFunctions = append([]string(nil), c.ReadFunctions...)
	return &cp
}

// dsnKeys are pgryw's keys in the fixed order FormatDSN writes them.
var dsnKeys = []string{"replicas", "read_your_writes", "wait_timeout", "on_timeout", "wait_method", "session_scope", "write_functions", "read_functions"}

func isDSNKey(k string) bool {
	for _, d := range dsnKeys {
		if d == k {
			return true
		}
	}
	return false
}

// ParseDSN parses a pgx connection string for the writer that may carry
// pgryw's keys (see the README for each). pgryw's keys are removed before the
// rest is validated with pgx.ParseConfig. Errors name the offending key and
// the allowed values, and never include a password.
func ParseDSN(dsn string) (*Config, error) {
	cfg := NewConfig()
	var (
		writer string
		pairs  []dsnPair
		err    error
	)
	if isURL(dsn) {
		writer, pairs, err = splitURL(dsn)
	} else {
		writer, pairs, err = splitKeywordValue(dsn)
	}
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, p := range pairs {
		if seen[p.key] {
			return nil, fmt.Errorf("pgryw: DSN key %s given twice", p.key)
		}
		seen[p.key] = true
		if err := cfg.set(p.key, p.value); err != nil {
			return nil, err
		}
	}
	cfg.Writer = writer
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

type dsnPair struct{ key, value string }

func (c *Config) set(key, v string) error {
	switch key {
	case "replicas":
		list, err := parseReplicas(v)
		if err != nil {
			return err
		}
		c.Replicas = list
	case "read_your_writes":
		switch v {
		case "on", "true", "1":
			c.ReadYourWrites = true
		case "off", "false", "0":
			c.ReadYourWrites = false
		default:
			return badValue(key, v, "on, off")
		}
	case "wait_timeout":
		d, err := parseTimeout(v)
		if err != nil {
			return err
		}
		c.WaitTimeout = d
	case "on_timeout":
		i, err := parseEnum(key, v, onTimeoutNames)
		if err != nil {
			return err
		}
		c.OnTimeout = OnTimeout(i)
	case "wait_method":
		i, err := parseEnum(key, v, waitMethodNames)
		if err != nil {
			return err
		}
		c.WaitMethod = WaitMethod(i)
	case "session_scope":
		i, err := parseEnum(key, v, scopeNames)
		if err != nil {
			return err
		}
		c.SessionScope = Scope(i)
	case "write_functions", "read_functions":
		list, err := parseFuncList(key, v)
		if err != nil {
			return err
		}
		if key == "write_functions" {
			c.WriteFunctions = list
		} else {
			c.ReadFunctions = list
		}
	}
	return nil
}

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

// maxWaitTimeout bounds the budget: a waiting read holds a connection on the
// replica for the whole budget, and WAIT FOR's TIMEOUT is an int in ms.
const maxWaitTimeout = time.Hour

func parseTimeout(v string) (time.Duration, error) {
	const allowed = "a Go duration such as 500ms or 2s, or integer milliseconds, from 1ms to 1h"
	var d time.Duration
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 1 || n > int64(maxWaitTimeout/time.Millisecond) {
			return 0, badValue("wait_timeout", v, allowed)
		}
		d = time.Duration(n) * time.Millisecond
	} else {
		pd, err := time.ParseDuration(v)
		if err != nil {
			return 0, badValue("wait_timeout", v, allowed)
		}
		d = pd
	}
	if d < time.Millisecond || d > maxWaitTimeout {
		return 0, badValue("wait_timeout", v, allowed)
	}
	return d, nil
}

func parseReplicas(v string) ([]string, error) {
	const allowed = "host[:port][,host[:port]...], IPv6 as [addr]:port"
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	var out []string
	for _, e := range strings.Split(v, ",") {
		e = strings.TrimSpace(e)
		if _, _, err := splitHostPort(e, 0); err != nil {
			return nil, badValue("replicas", v, allowed+"; "+err.Error())
		}
		out = append(out, e)
	}
	return out, nil
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
	var out []string
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			return nil, badValue(key, v, "a comma-separated list of function names, optionally schema-qualified")
		}
		for _, r := range f {
			if !(r == '_' || r == '.' || r == '$' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r > 127) {
				return nil, badValue(key, v, "a comma-separated list of function names, optionally schema-qualified")
			}
		}
		out = append(out, strings.ToLower(f))
	}
	return out, nil
}

func (c *Config) validate() error {
	if c.WaitTimeout < time.Millisecond || c.WaitTimeout > maxWaitTimeout {
		return fmt.Errorf("pgryw: wait_timeout %v out of range (1ms to 1h)", c.WaitTimeout)
	}
	if int(c.OnTimeout) >= len(onTimeoutNames) {
		return badValue("on_timeout", c.OnTimeout.String(), strings.Join(onTimeoutNames, ", "))
	}
	if int(c.WaitMethod) >= len(waitMethodNames) {
		return badValue("wait_method", c.WaitMethod.String(), strings.Join(waitMethodNames, ", "))
	}
	if int(c.SessionScope) >= len(scopeNames) {
		return badValue("session_scope", c.SessionScope.String(), strings.Join(scopeNames, ", "))
	}
	for _, r := range c.Replicas {
		if _, _, err := splitHostPort(r, 0); err != nil {
			return badValue("replicas", strings.Join(c.Replicas, ","), err.Error())
		}
	}
	if _, err := c.writerConfig(); err != nil {
		return err
	}
	return nil
}

// writerConfig parses Writer with pgx. pgx redacts the password in its own
// parse errors; we add only which part failed.
func (c *Config) writerConfig() (*pgx.ConnConfig, error) {
	pc, err := pgx.ParseConfig(c.Writer)
	if err != nil {
		return nil, fmt.Errorf("pgryw: writer connection string: %w", err)
	}
	return pc, nil
}

// FormatDSN returns a DSN that ParseDSN turns back into an equal Config: the
// writer string followed by pgryw's keys that differ from their defaults, in
// a fixed order, in the writer string's own syntax.
func (c *Config) FormatDSN() string {
	var pairs []dsnPair
	def := NewConfig()
	if len(c.Replicas) > 0 {
		pairs = append(pairs, dsnPair{"replicas", strings.Join(c.Replicas, ",")})
	}
	if c.ReadYourWrites != def.ReadYourWrites {
		pairs = append(pairs, dsnPair{"read_your_writes", map[bool]string{true: "on", false: "off"}[c.ReadYourWrites]})
	}
	if c.WaitTimeout != def.WaitTimeout {
		pairs = append(pairs, dsnPair{"wait_timeout", c.WaitTimeout.String()})
	}
	if c.OnTimeout != def.OnTimeout {
		pairs = append(pairs, dsnPair{"on_timeout", c.OnTimeout.String()})
	}
	if c.WaitMethod != def.WaitMethod {
		pairs = append(pairs, dsnPair{"wait_method", c.WaitMethod.String()})
	}
	if c.SessionScope != def.SessionScope {
		pairs = append(pairs, dsnPair{"session_scope", c.SessionScope.String()})
	}
	if len(c.WriteFunctions) > 0 {
		pairs = append(pairs, dsnPair{"write_functions", strings.Join(c.WriteFunctions, ",")})
	}
	if len(c.ReadFunctions) > 0 {
		pairs = append(pairs, dsnPair{"read_functions", strings.Join(c.ReadFunctions, ",")})
	}
	var b strings.Builder
	if isURL(c.Writer) {
		// Keys go into the query string, ahead of any #fragment.
		base, frag, _ := strings.Cut(c.Writer, "#")
		b.WriteString(base)
		sep := "?"
		if strings.Contains(base, "?") {
			sep = "&"
		}
		for _, p := range pairs {
			b.WriteString(sep)
			b.WriteString(p.key)
			b.WriteByte('=')
			b.WriteString(url.QueryEscape(p.value))
			sep = "&"
		}
		if strings.Contains(c.Writer, "#") {
			b.WriteByte('#')
			b.WriteString(frag)
		}
		return b.String()
	}
	b.WriteString(c.Writer)
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

// String is FormatDSN with any password replaced, for logs and %v.
func (c *Config) String() string {
	return redactDSN(c.FormatDSN())
}

func isURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

// splitURL removes pgryw's keys from a URL's query string, keeping every
// other byte of the URL as it was so pgx sees exactly what the user wrote.
func splitURL(dsn string) (string, []dsnPair, error) {
	q := strings.IndexByte(dsn, '?')
	if q < 0 {
		return dsn, nil, nil
	}
	frag := ""
	rest := dsn[q+1:]
	if h := strings.IndexByte(rest, '#'); h >= 0 {
		rest, frag = rest[:h], rest[h:]
	}
	var kept []string
	var pairs []dsnPair
	for _, raw := range strings.Split(rest, "&") {
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
	return w + frag, pairs, nil
}

// splitKeywordValue removes pgryw's keys from a libpq keyword/value string.
// The writer part is rebuilt from the remaining pairs' original text joined
// by single spaces.
func splitKeywordValue(dsn string) (string, []dsnPair, error) {
	var kept []string
	var pairs []dsnPair
	i := 0
	for {
		for i < len(dsn) && isSpace(dsn[i]) {
			i++
		}
		if i >= len(dsn) {
			break
		}
		start := i
		for i < len(dsn) && dsn[i] != '=' && !isSpace(dsn[i]) {
			i++
		}
		key := dsn[start:i]
		for i < len(dsn) && isSpace(dsn[i]) {
			i++
		}
		if i >= len(dsn) || dsn[i] != '=' {
			// Leave malformed text for pgx to report; but never as pgryw's.
			if isDSNKey(key) {
				return "", nil, fmt.Errorf("pgryw: DSN key %s has no value (write %s=value)", key, key)
			}
			kept = append(kept, dsn[start:])
			break
		}
		i++
		for i < len(dsn) && isSpace(dsn[i]) {
			i++
		}
		var val strings.Builder
		if i < len(dsn) && dsn[i] == '\'' {
			i++
			closed := false
			for i < len(dsn) {
				ch := dsn[i]
				if ch == '\\' && i+1 < len(dsn) {
					val.WriteByte(dsn[i+1])
					i += 2
					continue
				}
				if ch == '\'' {
					closed = true
					i++
					break
				}
				val.WriteByte(ch)
				i++
			}
			if !closed {
				if isDSNKey(key) {
					return "", nil, fmt.Errorf("pgryw: DSN key %s: unterminated quoted value", key)
				}
				kept = append(kept, dsn[start:])
				break
			}
		} else {
			for i < len(dsn) && !isSpace(dsn[i]) {
				if dsn[i] == '\\' && i+1 < len(dsn) {
					val.WriteByte(dsn[i+1])
					i += 2
					continue
				}
				val.WriteByte(dsn[i])
				i++
			}
		}
		switch {
		case isDSNKey(key):
			pairs = append(pairs, dsnPair{key, val.String()})
		case val.Len() == 0 && dsn[i-1] != '\'':
			// An empty unquoted value ends the string; once pgryw's keys
			// follow it, it would swallow the next one. Quote it.
			kept = append(kept, key+"=''")
		default:
			kept = append(kept, dsn[start:i])
		}
	}
	return strings.Join(kept, " "), pairs, nil
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

// redactDSN hides the password in either DSN form.
func redactDSN(s string) string {
	if isURL(s) {
		scheme := s[:strings.Index(s, "://")+3]
		rest := s[len(scheme):]
		end := strings.IndexAny(rest, "/?#")
		if end < 0 {
			end = len(rest)
		}
		auth := rest[:end]
		if at := strings.LastIndexByte(auth, '@'); at >= 0 {
			if c := strings.IndexByte(auth[:at], ':'); c >= 0 {
				rest = auth[:c] + ":xxxxx" + rest[at:]
			}
		}
		s = scheme + rest
		// password may also be a query parameter.
		return redactKVLike(s, "password=", "&#")
	}
	return redactKVLike(s, "password", "")
}

// redactKVLike replaces the value after each occurrence of key with xxxxx.
// For keyword/value strings (stop == "") the value ends at unquoted space.
func redactKVLike(s, key, stop string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, key)
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		j := i + len(key)
		if stop == "" {
			// Keyword/value: key must stand alone, then optional spaces and '='.
			if i > 0 && !isSpace(s[i-1]) {
				b.WriteString(s[:j])
				s = s[j:]
				continue
			}
			for j < len(s) && isSpace(s[j]) {
				j++
			}
			if j >= len(s) || s[j] != '=' {
				b.WriteString(s[:j])
				s = s[j:]
				continue
			}
			j++
			for j < len(s) && isSpace(s[j]) {
				j++
			}
			b.WriteString(s[:j])
			k := j
			if k < len(s) && s[k] == '\'' {
				k++
				for k < len(s) && s[k] != '\'' {
					if s[k] == '\\' {
						k++
					}
					k++
				}
				k++
			} else {
				for k < len(s) && !isSpace(s[k]) {
					k++
				}
			}
			if k > len(s) {
				k = len(s)
			}
			b.WriteString("xxxxx")
			s = s[k:]
			continue
		}
		if i > 0 && s[i-1] != '?' && s[i-1] != '&' {
			b.WriteString(s[:j])
			s = s[j:]
			continue
		}
		b.WriteString(s[:j])
		k := j
		for k < len(s) && !strings.ContainsRune(stop, rune(s[k])) {
			k++
		}
		b.WriteString("xxxxx")
		s = s[k:]
	}
}
