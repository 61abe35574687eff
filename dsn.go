package pgryw

import (
	"errors"
	"fmt"
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
	// Before any value is judged (and quoted in an error): only a writer
	// string whose parts pgx reads one way only says for sure which text is
	// a password.
	if err := checkWriterSyntax(writer); err != nil {
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

// writerConfig parses Writer with pgx. Its error message is built here
// and names no secret: pgx's own messages quote the connection string,
// redacted on a best-effort basis only.
func (c *Config) writerConfig() (*pgx.ConnConfig, error) {
	if err := checkWriterSyntax(c.Writer); err != nil {
		return nil, err
	}
	pc, err := pgx.ParseConfig(c.Writer)
	if err != nil {
		return nil, errors.New("pgryw: writer connection string: " + scrubSecrets(c.Writer, pgxMessage(err)))
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
		// Keys go at the end of the query string, where pgx finds it (pgx
		// has no #fragment: '#' is data).
		b.WriteString(c.Writer)
		sep := "?"
		if u := parsePGURL(c.Writer); u.hasQuery {
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

// String is FormatDSN with every secret replaced by xxxxx, for logs and %v:
// the URL's password, and the value of every key whose name says password,
// passwd or secret (password, sslpassword, oauth_client_secret), in either
// form, however its key is spelled (pass%77ord). A writer string whose parts
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
// The writer part is rebuilt from the remaining pairs' original text joined
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
	return fmt.Errorf("pgryw: writer connection string: %s at byte %d", what, b.at)
}

// scanKeywordValue reads a libpq keyword/value string as pgx does: keyword,
// optional spaces, '=', optional spaces, then a value that is either quoted
// ('…', with \' and \\) or runs to the next space (with \ escaping the next
// byte). It returns the pairs up to where the text stops making sense.
func scanKeywordValue(s string) ([]kvPair, kvBad) {
	var out []kvPair
	i := 0
	for {
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		if i >= len(s) {
			return out, kvBad{at: -1}
		}
		p := kvPair{start: i}
		for i < len(s) && s[i] != '=' && !isSpace(s[i]) {
			i++
		}
		p.key = s[p.start:i]
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		if i >= len(s) || s[i] != '=' {
			return out, kvBad{at: p.start, key: p.key}
		}
		i++
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		p.valStart = i
		var val strings.Builder
		if i < len(s) && s[i] == '\'' {
			p.quoted = true
			i++
			closed := false
			for i < len(s) {
				ch := s[i]
				if ch == '\\' && i+1 < len(s) {
					val.WriteByte(s[i+1])
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
				return out, kvBad{at: p.start, key: p.key, unterminated: true}
			}
		} else {
			for i < len(s) && !isSpace(s[i]) {
				if s[i] == '\\' && i+1 < len(s) {
					val.WriteByte(s[i+1])
					i += 2
					continue
				}
				val.WriteByte(s[i])
				i++
			}
		}
		p.value, p.end = val.String(), i
		out = append(out, p)
	}
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
	// Hosts run to the first '/' or '?' outside an element's [brackets].
	i := 0
	for {
		if i < len(p) && p[i] == '[' {
			j := strings.IndexByte(p[i:], ']')
			if j < 0 {
				u.netloc = p
				u.problem = `a "[" without its "]" in the host`
				return u
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
		break
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

// check returns why pgx would refuse u, or may read it other than as
// meant; "" when neither. It follows pgx's parseURLSettings, and also
// refuses an '@' after the user information, which pgx would take as part
// of a host, port or database name but is far more likely the rest of a
// password with a literal '@' (write %40).
func (u *pgURL) check(s string) string {
	if strings.IndexByte(s, 0) >= 0 {
		return "a NUL byte"
	}
	if u.userinfo {
		if _, why := uriDecode(u.user); why != "" {
			return "user name: " + why
		}
		if u.hasPass && u.password != "" {
			if _, why := uriDecode(u.password); why != "" {
				return "password: " + why
			}
		}
	}
	var hosts, ports strings.Builder
	p := u.netloc
	for {
		if strings.HasPrefix(p, "[") {
			end := strings.IndexByte(p, ']')
			if end == 1 {
				return "an empty [IPv6] host"
			}
			hosts.WriteString(p[1:end])
			p = p[end+1:]
			if p != "" && p[0] != ':' && p[0] != ',' {
				return `a character other than ":" after an [IPv6] host`
			}
		} else {
			i := strings.IndexAny(p, ":,")
			if i < 0 {
				i = len(p)
			}
			hosts.WriteString(p[:i])
			p = p[i:]
		}
		if strings.HasPrefix(p, ":") {
			i := strings.IndexByte(p, ',')
			if i < 0 {
				i = len(p)
			}
			ports.WriteString(p[1:i])
			p = p[i:]
		}
		if !strings.HasPrefix(p, ",") {
			break
		}
		p = p[1:]
		hosts.WriteByte(',')
		ports.WriteByte(',')
	}
	if strings.ContainsRune(u.netloc, '@') {
		return `an "@" after the user information (write "@" in a password as %40)`
	}
	if _, why := uriDecode(hosts.String()); why != "" {
		return "host: " + why
	}
	pl, why := uriDecode(ports.String())
	if why != "" {
		return "port: " + why
	}
	for _, r := range pl {
		if r != ',' && (r < '0' || r > '9') {
			return "a port that is not a number"
		}
	}
	if u.hasPath && u.path != "" {
		if strings.ContainsRune(u.path, '@') {
			return `an "@" in the database name (write it as %40)`
		}
		if _, why := uriDecode(u.path); why != "" {
			return "database name: " + why
		}
	}
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

// checkWriterSyntax reports a writer string pgx would refuse, or whose
// parts it could read other than as meant, naming the problem and where
// but quoting none of the text.
func checkWriterSyntax(s string) error {
	if isURL(s) {
		if u := parsePGURL(s); u.problem != "" {
			return fmt.Errorf("pgryw: writer connection string: malformed URL: %s", u.problem)
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
