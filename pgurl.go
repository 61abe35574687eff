package pgryw

import (
	"fmt"
	"strings"
)

// The URL form of a connection string, read as pgx reads it, to say why pgx
// would refuse one (or read it other than as meant) without showing it: a
// URL carries its password.

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
