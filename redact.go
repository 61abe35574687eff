package pgryw

import (
	"net/url"
	"slices"
	"strconv"
	"strings"
)

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
