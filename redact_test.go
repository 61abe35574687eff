package pgryw

import (
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// redactCases: what Config.String() shows for a primary string. want "" means
// only that "hunter2" must not appear.
var redactCases = []struct{ dsn, want string }{
	{"postgres://u:hunter2@h/db", "postgres://u:xxxxx@h/db"},
	{"postgres://u:hun%40ter2@h/db?sslmode=disable", "postgres://u:xxxxx@h/db?sslmode=disable"},
	{"postgres://u@h/db?password=hunter2&sslmode=disable", "postgres://u@h/db?password=xxxxx&sslmode=disable"},
	{"postgres://u@h/db?sslpassword=hunter2", "postgres://u@h/db?sslpassword=xxxxx"},
	{"postgres://u@h/db?pass%77ord=hunter2", "postgres://u@h/db?pass%77ord=xxxxx"},
	{"postgres://u@h/db?ssl%70assword=hunter2&x=1", "postgres://u@h/db?ssl%70assword=xxxxx&x=1"},
	{"postgres://u@h/db?%50ASSWORD=hunter2", "postgres://u@h/db?%50ASSWORD=xxxxx"},
	{"postgres://u@h/db?oauth_client_secret=hunter2", "postgres://u@h/db?oauth_client_secret=xxxxx"},
	{"postgres://u@h/db?password=a&password=hunter2", "postgres://u@h/db?password=xxxxx&password=xxxxx"},
	// pgx reads these passwords whole: the user information ends at the
	// first '@', whatever '?' or '#' comes before it.
	{"postgres://u:hun?ter2@h/db", "postgres://u:xxxxx@h/db"},
	{"postgres://u:hun#ter2@h/db", "postgres://u:xxxxx@h/db"},
	{"postgres://u:hun:ter2@h/db", "postgres://u:xxxxx@h/db"},
	{"postgresql://u:hunter2@[::1]:5432,h2:5433/db?application_name=me@x", "postgresql://u:xxxxx@[::1]:5432,h2:5433/db?application_name=me@x"},
	// pgx could read these other than as meant: not shown at all.
	{"postgres://u:hun/ter2@h/db", redactedURL},
	{"postgres://u:hun@ter2@h/db", redactedURL},
	{"postgres://u:pw@h:hunter2/db", redactedURL},
	{"postgres://u:hun ter2@h/db", redactedURL},
	{"postgres://u@h/db?password=hun=ter2", redactedURL},
	{"postgres://u@[::1/db?password=hunter2", redactedURL},

	{"host=h password=hunter2", "host=h password=xxxxx"},
	{"host=h password='hun ter2' user=u", "host=h password=xxxxx user=u"},
	{`host=h password='hun\'ter2 x\\' user=u`, "host=h password=xxxxx user=u"},
	{`host=h password=hun\ ter2 user=u`, "host=h password=xxxxx user=u"},
	{"host=h password = hunter2", "host=h password = xxxxx"},
	{"host=h\tpassword=\thunter2", "host=h\tpassword=\txxxxx"},
	{"host=h sslpassword=hunter2 PASSWORD=hunter2", "host=h sslpassword=xxxxx PASSWORD=xxxxx"},
	{"password= hunter2", "password= xxxxx"},
	{"host=h password='hunter2", "host=h " + redactedKVTail},
	{"host=h hunter2", "host=h " + redactedKVTail},
	{"host=h password='x' hunter2 y", "host=h password=xxxxx " + redactedKVTail},
	{"", ""},
}

func TestRedactDSN(t *testing.T) {
	for _, c := range redactCases {
		cfg := NewConfig()
		cfg.Primary = c.dsn
		got := cfg.String()
		if got != c.want {
			t.Errorf("String() of %q\n got %q\nwant %q", c.dsn, got, c.want)
		}
		if strings.Contains(got, "hunter2") || strings.Contains(got, "ter2") {
			t.Errorf("String() of %q leaks: %q", c.dsn, got)
		}
	}
}

// With pgryw's keys added by FormatDSN, and after a ParseDSN round trip.
func TestRedactParsedDSN(t *testing.T) {
	for _, dsn := range []string{
		"postgres://u:hunter2@h/db?replicas=r1&password=hunter2",
		"postgres://u:hun?ter2@h/db?replicas=r1",
		"postgres://u@h/db?ssl%70assword=hunter2&wait_timeout=2s",
		"host=h password='hun\\'ter2 x' replicas=r1 on_timeout=error",
		"host=h sslpassword = hunter2 replicas=r1",
	} {
		cfg, err := ParseDSN(dsn)
		if err != nil {
			t.Fatalf("ParseDSN(%q): %v", dsn, err)
		}
		s := cfg.String()
		if strings.Contains(s, "ter2") || !strings.Contains(s, "xxxxx") {
			t.Errorf("String() of %q = %q", dsn, s)
		}
		if !strings.Contains(s, "replicas=r1") && !strings.Contains(s, "2s") && !strings.Contains(s, "r1") {
			t.Errorf("String() of %q lost pgryw's keys: %q", dsn, s)
		}
	}
}

// ParseDSN's errors never quote a secret, whichever part of the string is
// wrong, and still say what is wrong.
func TestParseDSNErrorsHideSecrets(t *testing.T) {
	for _, c := range []struct{ dsn, has string }{
		{"user=u password=hunter2 port=notaport", "port"},
		{"host=h password = hunter2 port=notaport", "port"},
		{`host=h password='a\'hunter2 b' port=notaport`, "port"},
		{"host=h sslpassword=hunter2 sslmode=bogus", "sslmode"},
		{"postgres://u@h/db?password=hunter2&port=notaport", "port"},
		{"postgres://u@h/db?pass%77ord=hunter2&port=notaport", "port"},
		{"postgres://u:hunter2@h/db?sslmode=bogus", "sslmode"},
		{"postgres://u:hunter2@h:badport/db", "port"},
		{"postgres://u:hun/ter2@h/db", "malformed URL"},
		{"postgres://u:p/wait_timeout?wait_timeout=hunter2@h", "malformed URL"},
		{"postgres://u:pw@h/db?password=hunter2&on_timeout=nope", "on_timeout"},
		{"host=h password=hun ter2", "byte 20"},
		{"host=h password='hunter2", "closing quote"},
		{"host=h password=x wait_timeout=soon", "wait_timeout"},
	} {
		_, err := ParseDSN(c.dsn)
		if err == nil {
			t.Errorf("ParseDSN(%q): no error", c.dsn)
			continue
		}
		if strings.Contains(err.Error(), "ter2") {
			t.Errorf("ParseDSN(%q) error leaks the password: %v", c.dsn, err)
		}
		if !strings.Contains(err.Error(), c.has) {
			t.Errorf("ParseDSN(%q) error %q does not mention %q", c.dsn, err, c.has)
		}
	}
	// A '?' in a password is not the query string: no pgryw key is read
	// from it (and so none of it is quoted in an error).
	cfg, err := ParseDSN("postgres://u:p?wait_timeout=hunter2@h/db")
	if err != nil {
		t.Fatalf("password with '?': %v", err)
	}
	if cfg.WaitTimeout != DefaultWaitTimeout {
		t.Errorf("wait_timeout read from the password: %v", cfg.WaitTimeout)
	}
}

// FormatDSN puts pgryw's keys where pgx finds the query string, so a '?'
// or '#' in a password survives a round trip.
func TestFormatDSNPasswordWithQueryChars(t *testing.T) {
	for _, w := range []string{"postgres://u:p?x@h/db", "postgres://u:p#x@h/db?sslmode=disable", "postgres://u@h/db?password=a%23b#c"} {
		cfg := NewConfig()
		cfg.Primary = w
		cfg.Replicas = []string{"r1"}
		back, err := ParseDSN(cfg.FormatDSN())
		if err != nil {
			t.Fatalf("%q: %v", cfg.FormatDSN(), err)
		}
		want, _ := pgx.ParseConfig(w)
		got, _ := pgx.ParseConfig(back.Primary)
		if back.Primary != w || len(back.Replicas) != 1 || want == nil || got == nil || got.Password != want.Password {
			t.Errorf("round trip of %q via %q: primary %q replicas %v", w, cfg.FormatDSN(), back.Primary, back.Replicas)
		}
	}
}

var oracleKeys = []string{"host", "port", "user", "password", "dbname", "database", "sslpassword", "sslmode",
	"application_name", "connect_timeout", "PASSWORD", "Password", "oauth_client_secret", "passwd", "secret", "x"}

const secretMarker = "SeCrEtMaRkEr"

func noMarker(s string) string {
	for strings.Contains(s, secretMarker) {
		s = strings.ReplaceAll(s, secretMarker, "")
	}
	return s
}

// FuzzRedact builds DSNs in both forms, every part written correctly but
// otherwise from fuzz input, with a secret around a marker in one of the
// places secrets go, and checks that neither String() nor ParseDSN's error
// shows the marker. It also feeds the raw input as a primary string: String()
// must not panic, and whatever pgx reads from its output has no password
// but xxxxx.
func FuzzRedact(f *testing.F) {
	f.Setenv("PGPASSFILE", os.DevNull)
	f.Setenv("PGPASSWORD", "")
	f.Setenv("PGSSLPASSWORD", "")
	f.Setenv("PGSERVICE", "")
	for _, c := range redactCases {
		f.Add(c.dsn, "h", "db", "application_name", "x", "pw", uint8(0))
	}
	f.Add("u", "[::1]:5432,h2", "d b", "options", "-c x=y", `a'b\ c`, uint8(1))
	f.Add("u@x", "h?x", "db#x", "k=&v", "v&w=", "p@ss/w?rd#x", uint8(2))
	f.Add("", "", "", "", "", "", uint8(3))
	f.Add("u", "h", "db", "password", "'", `\`, uint8(12))
	f.Fuzz(func(t *testing.T, user, host, db, key, val, secret string, form uint8) {
		raw := user
		user, host, db, key, val = noMarker(user), noMarker(host), noMarker(db), noMarker(key), noMarker(val)
		secret = noMarker(secret)
		pw := secret + secretMarker + secret
		qe := url.QueryEscape
		urlKeys := []string{"password", "sslpassword", "pass%77ord", "ssl%70assword", "PASSWORD", "oauth_client_secret"}
		kvKeys := []string{"password", "sslpassword", "PASSWORD", "oauth_client_secret"}
		var dsn string
		switch form % 4 {
		case 0: // URL user information
			dsn = "postgres://" + qe(user) + ":" + qe(pw) + "@" + qe(host) + "/" + qe(db) + "?" + qe(key) + "=" + qe(val)
		case 1: // URL query parameter
			dsn = "postgres://" + qe(user) + "@" + qe(host) + "/" + qe(db) + "?" + qe(key) + "=" + qe(val) +
				"&" + urlKeys[int(form/4)%len(urlKeys)] + "=" + qe(pw)
		default: // keyword/value, value quoted when needed or always
			k := strings.Map(func(r rune) rune {
				if r == '=' || r < 128 && isSpace(byte(r)) {
					return '_'
				}
				return r
			}, key)
			if k == "" {
				k = "k"
			}
			q := quoteKV(pw)
			if form%4 == 3 {
				q = "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pw) + "'"
			}
			sep := []string{"=", " = ", "=\t", "\t=  "}[int(form/4)%4]
			dsn = "host=" + quoteKV(host) + " " + k + "=" + quoteKV(val) + " " + kvKeys[int(form/16)%len(kvKeys)] + sep + q + " dbname=" + quoteKV(db)
		}
		cfg := NewConfig()
		cfg.Primary = dsn
		if s := cfg.String(); strings.Contains(s, secretMarker) {
			t.Fatalf("String() of %q shows the secret: %q", dsn, s)
		}
		parsed, err := ParseDSN(dsn)
		if err != nil {
			if strings.Contains(err.Error(), secretMarker) {
				t.Fatalf("ParseDSN(%q) error shows the secret: %v", dsn, err)
			}
		} else if s := parsed.String(); strings.Contains(s, secretMarker) {
			t.Fatalf("String() of ParseDSN(%q) shows the secret: %q", dsn, s)
		}

		// Raw: any text at all.
		red := redactDSN(raw)
		// Only keys that make pgx read no file (a fuzzed sslrootcert=/dev/zero
		// would never return).
		if pc, err := pgconn.ParseConfigWithOptions(red, pgconn.ParseConfigOptions{ConnStringAllowedKeys: oracleKeys}); err == nil {
			if pc.Password != "" && pc.Password != "xxxxx" {
				t.Fatalf("pgx reads password %q from String() of %q: %q", pc.Password, raw, red)
			}
			for k, v := range pc.RuntimeParams {
				if isSecretKey(k) && v != "xxxxx" {
					t.Fatalf("pgx reads %s=%q from String() of %q: %q", k, v, raw, red)
				}
			}
		}
	})
}
