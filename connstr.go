package pgryw

import (
	"fmt"
	"maps"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

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

// replicaConfig derives a replica's connection settings from the primary's:
// same credentials, database, TLS and runtime parameters, another address,
// and no fallback hosts (a replica entry is one node; the wait and the read
// must land on the same one).
func replicaConfig(wc *pgx.ConnConfig, host string, port uint16) *pgx.ConnConfig {
	rc := wc.Copy()
	rc.Host, rc.Port = host, port
	// target_session_attrs (read-write, primary: common in HA DSNs) checks
	// the primary; on a standby it would refuse every connection.
	rc.ValidateConnect = nil
	// transaction_read_only=off as a startup setting makes a standby refuse
	// the connection (FATAL 25001), which would quietly send every read to
	// the primary. Replica reads are read-only anyway.
	if len(rc.RuntimeParams) > 0 {
		rc.RuntimeParams = maps.Clone(rc.RuntimeParams)
		delete(rc.RuntimeParams, "transaction_read_only")
		if o, ok := rc.RuntimeParams["options"]; ok {
			rc.RuntimeParams["options"] = dropOption(o, "transaction_read_only")
		}
	}
	if rc.TLSConfig != nil && rc.TLSConfig.ServerName != "" {
		rc.TLSConfig.ServerName = host
	}
	// Keep the primary's sslmode=prefer/allow behaviour: its fallbacks for its
	// own first address differ only in TLS.
	var fbs = rc.Fallbacks[:0:0]
	for _, fb := range wc.Fallbacks {
		if fb.Host != wc.Host || fb.Port != wc.Port {
			continue
		}
		nf := *fb
		nf.Host, nf.Port = host, port
		if nf.TLSConfig != nil {
			nf.TLSConfig = nf.TLSConfig.Clone()
			if nf.TLSConfig.ServerName != "" {
				nf.TLSConfig.ServerName = host
			}
		}
		fbs = append(fbs, &nf)
	}
	rc.Fallbacks = fbs
	return rc
}

// dropOption removes every setting of guc from a libpq options string
// ("-c name=value", "-cname=value" or "--name=value", with backslash-escaped
// spaces), keeping the rest as written.
func dropOption(opts, guc string) string {
	words := optionWords(opts)
	sets := func(w string) bool {
		name, _, _ := strings.Cut(w, "=")
		return strings.ReplaceAll(strings.ToLower(name), "-", "_") == guc
	}
	var kept []string
	for i := 0; i < len(words); i++ {
		w := words[i]
		switch {
		case w == "-c" && i+1 < len(words) && sets(words[i+1]):
			i++
			continue
		case strings.HasPrefix(w, "-c") && len(w) > 2 && sets(w[2:]):
			continue
		case strings.HasPrefix(w, "--") && sets(w[2:]):
			continue
		}
		kept = append(kept, w)
	}
	return strings.Join(kept, " ")
}

// optionWords splits the options parameter into its words as the server
// does: at blanks, a backslash keeping the next byte in the word (and
// itself, so the words join back unchanged).
func optionWords(opts string) []string {
	var words []string
	var cur strings.Builder
	for i := 0; i < len(opts); i++ {
		switch ch := opts[i]; {
		case ch == '\\' && i+1 < len(opts):
			cur.WriteByte(ch)
			cur.WriteByte(opts[i+1])
			i++
		case ch == ' ' || ch == '\t' || ch == '\n':
			if cur.Len() > 0 {
				words = append(words, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteByte(ch)
		}
	}
	if cur.Len() > 0 {
		words = append(words, cur.String())
	}
	return words
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
