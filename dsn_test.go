package pgryw

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// dsnCases drives the parse, round-trip, invalid-input and fuzz tests.
var dsnCases = []struct {
	dsn     string
	want    *Config // nil: expect an error
	errHas  []string
	primary string
	noMatch []string // must not appear in the error (passwords)
}{
	{dsn: "postgres://u:secret@h:5432/db", primary: "postgres://u:secret@h:5432/db", want: &Config{ReadYourWrites: true, WaitTimeout: 500 * time.Millisecond, MaxFallback: DefaultMaxFallback, MaxWaits: DefaultMaxWaits}},
	{dsn: "postgres://u@h/db?sslmode=disable&replicas=r1:5433,r2&wait_timeout=2s&on_timeout=error&application_name=x",
		primary: "postgres://u@h/db?sslmode=disable&application_name=x",
		want:    &Config{Replicas: []string{"r1:5433", "r2"}, ReadYourWrites: true, WaitTimeout: 2 * time.Second, OnTimeout: OnTimeoutError, MaxFallback: DefaultMaxFallback, MaxWaits: DefaultMaxWaits}},
	{dsn: "postgresql://h/db?replicas=%5B%3A%3A1%5D%3A5433&read_your_writes=off&wait_method=poll&session_scope=conn",
		primary: "postgresql://h/db",
		want:    &Config{Replicas: []string{"[::1]:5433"}, ReadYourWrites: false, WaitTimeout: 500 * time.Millisecond, MaxFallback: DefaultMaxFallback, MaxWaits: DefaultMaxWaits, WaitMethod: WaitPoll, SessionScope: ScopeConn}},
	{dsn: "host=h user=u password='se cret' dbname=db replicas=10.0.0.2:5433 wait_timeout=250 on_timeout=stale wait_method=wait_for",
		primary: "host=h user=u password='se cret' dbname=db",
		want:    &Config{Replicas: []string{"10.0.0.2:5433"}, ReadYourWrites: true, WaitTimeout: 250 * time.Millisecond, OnTimeout: OnTimeoutStale, WaitMethod: WaitFor, MaxFallback: DefaultMaxFallback, MaxWaits: DefaultMaxWaits}},
	{dsn: "replicas = 'a, b:6000'  host=h", primary: "host=h",
		want: &Config{Replicas: []string{"a", "b:6000"}, ReadYourWrites: true, WaitTimeout: 500 * time.Millisecond, MaxFallback: DefaultMaxFallback, MaxWaits: DefaultMaxWaits}},
	{dsn: "host=h read_functions=f,public.g write_functions=Audit", primary: "host=h",
		want: &Config{ReadYourWrites: true, WaitTimeout: 500 * time.Millisecond, MaxFallback: DefaultMaxFallback, MaxWaits: DefaultMaxWaits, ReadFunctions: []string{"f", "public.g"}, WriteFunctions: []string{"audit"}}},
	// Quoted names keep their case (and may hold what an unquoted one
	// cannot), as the server reads them.
	{dsn: `host=h write_functions='"Audit",s."Mixed Case",x.y' read_functions='"a""b"'`, primary: "host=h",
		want: &Config{ReadYourWrites: true, WaitTimeout: 500 * time.Millisecond, MaxFallback: DefaultMaxFallback, MaxWaits: DefaultMaxWaits, WriteFunctions: []string{"Audit", "s.Mixed Case", "x.y"}, ReadFunctions: []string{`a"b`}}},
	{dsn: `host=h write_functions='"a.b"'`, errHas: []string{"write_functions"}},
	{dsn: `host=h write_functions='a.b.c.d'`, errHas: []string{"write_functions"}},
	{dsn: `host=h write_functions='"unterminated'`, errHas: []string{"write_functions"}},
	{dsn: "", primary: "", want: &Config{ReadYourWrites: true, WaitTimeout: 500 * time.Millisecond, MaxFallback: DefaultMaxFallback, MaxWaits: DefaultMaxWaits}},
	// Overload bounds.
	{dsn: "postgres://h/db?max_fallback=0&on_max_fallback=stale&max_waits=4&max_replica_lag=16MB", primary: "postgres://h/db",
		want: &Config{ReadYourWrites: true, WaitTimeout: 500 * time.Millisecond, MaxFallback: 0, OnMaxFallback: FallbackStale, MaxWaits: 4, MaxReplicaLag: ReplicaLag{Bytes: 16 << 20}}},
	{dsn: "host=h max_fallback=10000 on_max_fallback=error max_waits=0 max_replica_lag=2s", primary: "host=h",
		want: &Config{ReadYourWrites: true, WaitTimeout: 500 * time.Millisecond, MaxFallback: 10000, OnMaxFallback: FallbackError, MaxWaits: 0, MaxReplicaLag: ReplicaLag{Duration: 2 * time.Second}}},
	{dsn: "host=h read_your_writes=off max_replica_lag=1536kb", primary: "host=h",
		want: &Config{ReadYourWrites: false, WaitTimeout: 500 * time.Millisecond, MaxFallback: DefaultMaxFallback, MaxWaits: DefaultMaxWaits, MaxReplicaLag: ReplicaLag{Bytes: 1536 << 10}}},
	{dsn: "host=h max_replica_lag=1TB max_waits=32 max_fallback=8 on_max_fallback=wait", primary: "host=h",
		want: &Config{ReadYourWrites: true, WaitTimeout: 500 * time.Millisecond, MaxFallback: DefaultMaxFallback, MaxWaits: DefaultMaxWaits, MaxReplicaLag: ReplicaLag{Bytes: 1 << 40}}},
	{dsn: "host=h max_replica_lag=off max_replica_lag_x=1", primary: "host=h max_replica_lag_x=1",
		want: &Config{ReadYourWrites: true, WaitTimeout: 500 * time.Millisecond, MaxFallback: DefaultMaxFallback, MaxWaits: DefaultMaxWaits}},
	// Found by FuzzParseDSN: an empty value must not swallow the keys FormatDSN appends.
	{dsn: "on_timeout=stale 0=", primary: "0=''", want: &Config{ReadYourWrites: true, WaitTimeout: 500 * time.Millisecond, MaxFallback: DefaultMaxFallback, MaxWaits: DefaultMaxWaits, OnTimeout: OnTimeoutStale}},

	{dsn: "host=h on_timeout=later", errHas: []string{"on_timeout", "later", "primary, error, stale"}},
	{dsn: "host=h read_your_writes=maybe", errHas: []string{"read_your_writes", "on, off"}},
	{dsn: "host=h wait_method=sleep", errHas: []string{"wait_method", "auto, wait_for, poll"}},
	{dsn: "host=h session_scope=request", errHas: []string{"session_scope", "db, conn"}},
	{dsn: "host=h wait_timeout=soon", errHas: []string{"wait_timeout", "Go duration"}},
	{dsn: "host=h wait_timeout=0", errHas: []string{"wait_timeout"}},
	{dsn: "host=h wait_timeout=-5ms", errHas: []string{"wait_timeout"}},
	{dsn: "host=h wait_timeout=2h", errHas: []string{"wait_timeout"}},
	{dsn: "host=h replicas=a,,b", errHas: []string{"replicas", "empty entry"}},
	{dsn: "host=h replicas=a:99999", errHas: []string{"replicas", "port"}},
	{dsn: "host=h replicas=a:b:c", errHas: []string{"replicas", "IPv6"}},
	{dsn: "host=h replicas=a:x", errHas: []string{"replicas", "port"}},
	{dsn: "host=h replicas", errHas: []string{"replicas", "no value"}},
	{dsn: "host=h replicas='a", errHas: []string{"replicas", "unterminated"}},
	{dsn: "host=h wait_timeout=1s wait_timeout=2s", errHas: []string{"wait_timeout", "twice"}},
	{dsn: "host=h read_functions=f;drop", errHas: []string{"read_functions"}},
	{dsn: "host=h max_fallback=-1", errHas: []string{"max_fallback", "-1", "0 to 10000"}},
	{dsn: "host=h max_fallback=10001", errHas: []string{"max_fallback", "0 to 10000"}},
	{dsn: "host=h max_fallback=lots", errHas: []string{"max_fallback", "lots"}},
	{dsn: "host=h max_fallback=", errHas: []string{"max_fallback"}},
	{dsn: "host=h max_waits=2.5", errHas: []string{"max_waits", "0 to 10000"}},
	{dsn: "host=h on_max_fallback=primary", errHas: []string{"on_max_fallback", "wait, error, stale"}},
	{dsn: "host=h max_replica_lag=16", errHas: []string{"max_replica_lag", `"16"`, "MB", "2s"}},
	{dsn: "host=h max_replica_lag=0", errHas: []string{"max_replica_lag", "off"}},
	{dsn: "host=h max_replica_lag=0MB", errHas: []string{"max_replica_lag"}},
	{dsn: "host=h max_replica_lag=0s", errHas: []string{"max_replica_lag"}},
	{dsn: "host=h max_replica_lag=16XB", errHas: []string{"max_replica_lag", "kB"}},
	{dsn: "host=h max_replica_lag=MB", errHas: []string{"max_replica_lag"}},
	{dsn: "host=h max_replica_lag=2TB", errHas: []string{"max_replica_lag", "1TB"}},
	{dsn: "host=h max_replica_lag=99999999999999999999B", errHas: []string{"max_replica_lag"}},
	{dsn: "host=h max_replica_lag=100ms", errHas: []string{"max_replica_lag", "250ms to 24h"}},
	{dsn: "host=h max_replica_lag=25h", errHas: []string{"max_replica_lag", "250ms to 24h"}},
	{dsn: "host=h max_replica_lag=-2s", errHas: []string{"max_replica_lag"}},
	{dsn: "host=h max_replica_lag=1.5MB", errHas: []string{"max_replica_lag"}},
	{dsn: "postgres://u:hunter2@h/db?on_timeout=nope", errHas: []string{"on_timeout"}, noMatch: []string{"hunter2"}},
	{dsn: "user=u password=hunter2 port=notaport", errHas: []string{"primary connection string"}, noMatch: []string{"hunter2"}},
	{dsn: "postgres://u:hunter2@h:badport/db", errHas: []string{"primary connection string"}, noMatch: []string{"hunter2"}},
}

func TestParseDSN(t *testing.T) {
	for _, c := range dsnCases {
		got, err := ParseDSN(c.dsn)
		if c.want == nil {
			if err == nil {
				t.Errorf("ParseDSN(%q): no error, want one", c.dsn)
				continue
			}
			for _, s := range c.errHas {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("ParseDSN(%q) error %q does not mention %q", c.dsn, err, s)
				}
			}
			for _, s := range c.noMatch {
				if strings.Contains(err.Error(), s) {
					t.Errorf("ParseDSN(%q) error %q leaks %q", c.dsn, err, s)
				}
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseDSN(%q): %v", c.dsn, err)
			continue
		}
		want := c.want.Clone()
		want.Primary = c.primary
		if !configEqual(got, want) {
			t.Errorf("ParseDSN(%q)\n got %#v\nwant %#v", c.dsn, got, want)
		}
	}
}

func configEqual(a, b *Config) bool {
	norm := func(c *Config) Config {
		x := *c.Clone()
		if len(x.Replicas) == 0 {
			x.Replicas = nil
		}
		if len(x.ReadFunctions) == 0 {
			x.ReadFunctions = nil
		}
		if len(x.WriteFunctions) == 0 {
			x.WriteFunctions = nil
		}
		return x
	}
	return reflect.DeepEqual(norm(a), norm(b))
}

func TestFormatDSNRoundTrip(t *testing.T) {
	for _, c := range dsnCases {
		if c.want == nil {
			continue
		}
		cfg, err := ParseDSN(c.dsn)
		if err != nil {
			t.Fatalf("ParseDSN(%q): %v", c.dsn, err)
		}
		s := cfg.FormatDSN()
		back, err := ParseDSN(s)
		if err != nil {
			t.Errorf("ParseDSN(FormatDSN) of %q = %q: %v", c.dsn, s, err)
			continue
		}
		if !configEqual(cfg, back) {
			t.Errorf("round trip of %q via %q\n got %#v\nwant %#v", c.dsn, s, back, cfg)
		}
	}
}

func TestStringHidesPassword(t *testing.T) {
	for _, dsn := range []string{
		"postgres://u:hunter2@h/db?replicas=r1",
		"postgres://u:hunter2@h1:5432,h2:5432/db",
		"postgres://u@h/db?password=hunter2&replicas=r1",
		"host=h password=hunter2 replicas=r1",
		"host=h password='hunter2 x' replicas=r1",
		"host=h password = hunter2",
	} {
		cfg, err := ParseDSN(dsn)
		if err != nil {
			t.Fatalf("%q: %v", dsn, err)
		}
		if s := cfg.String(); strings.Contains(s, "hunter2") {
			t.Errorf("String() of %q leaks the password: %q", dsn, s)
		}
	}
}

func TestNewConnectorValidates(t *testing.T) {
	cfg := NewConfig()
	cfg.WaitTimeout = 0
	if _, err := NewConnector(cfg); err == nil || !strings.Contains(err.Error(), "wait_timeout") {
		t.Fatalf("got %v", err)
	}
	cfg = NewConfig()
	cfg.OnTimeout = 9
	if _, err := NewConnector(cfg); err == nil || !strings.Contains(err.Error(), "on_timeout") {
		t.Fatalf("got %v", err)
	}
	if _, err := NewConnector(nil); err == nil {
		t.Fatal("nil config accepted")
	}
}

func FuzzParseDSN(f *testing.F) {
	for _, c := range dsnCases {
		f.Add(c.dsn)
	}
	f.Fuzz(func(t *testing.T, dsn string) {
		cfg, err := ParseDSN(dsn)
		if err != nil {
			return
		}
		back, err := ParseDSN(cfg.FormatDSN())
		if err != nil {
			t.Fatalf("FormatDSN of a parsed DSN does not parse: %q -> %q: %v", dsn, cfg.FormatDSN(), err)
		}
		if !configEqual(cfg, back) {
			t.Fatalf("round trip changed the config: %q -> %q", dsn, cfg.FormatDSN())
		}
	})
}

// readmeDSNTable renders README.md's DSN table from dsnOptions.
func readmeDSNTable() []string {
	rows := []string{"| key | type | values | default | meaning |", "|---|---|---|---|---|"}
	for _, o := range dsnOptions {
		def := "none"
		if o.def != "" {
			def = "`" + o.def + "`"
		}
		rows = append(rows, "| `"+o.key+"` | "+o.typ+" | "+o.values+" | "+def+" | "+o.doc+" |")
	}
	return rows
}

// The table in README.md's DSN section is dsnOptions, row for row.
func TestDSNTableInREADME(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## DSN\n")
	if !ok {
		t.Fatal(`README.md has no "## DSN" section`)
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	var got []string
	for _, l := range strings.Split(sec, "\n") {
		if strings.HasPrefix(l, "|") {
			got = append(got, l)
		}
	}
	want := readmeDSNTable()
	if slices.Equal(got, want) {
		return
	}
	for i := range max(len(got), len(want)) {
		g, w := "(none)", "(none)"
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			t.Errorf("README.md's DSN table differs from dsnOptions (dsn.go) at row %d:\nREADME:     %s\ndsnOptions: %s", i+1, g, w)
			break
		}
	}
	t.Errorf("edit dsnOptions in dsn.go or README.md so they agree; for dsnOptions as they are, the table in README.md's \"## DSN\" section is:\n\n%s\n", strings.Join(want, "\n"))
}

// Each option's default is what NewConfig sets, and formats back as the default.
func TestDSNOptionDefaults(t *testing.T) {
	seen := map[string]bool{}
	for _, o := range dsnOptions {
		if seen[o.key] {
			t.Errorf("DSN key %s listed twice", o.key)
		}
		seen[o.key] = true
		if o.key == "" || o.typ == "" || o.values == "" || o.doc == "" || o.parse == nil || o.format == nil {
			t.Errorf("DSN key %q: descriptor incomplete", o.key)
			continue
		}
		if v, isDefault := o.format(NewConfig()); !isDefault {
			t.Errorf("DSN key %s: NewConfig's value %q is not reported as the default %q", o.key, v, o.def)
		}
		c := &Config{}
		if o.def != "" {
			if err := o.parse(c, o.def); err != nil {
				t.Errorf("DSN key %s: default %q: %v", o.key, o.def, err)
			}
		}
		v, isDefault := o.format(c)
		if !isDefault {
			t.Errorf("DSN key %s: default %q formats as %q, not reported as the default", o.key, o.def, v)
		}
		if o.validate != nil {
			if err := o.validate(NewConfig()); err != nil {
				t.Errorf("DSN key %s: default does not validate: %v", o.key, err)
			}
		}
	}
}

// Config.validate and ParseDSN word their errors as they always have.
func TestConfigValidateMessages(t *testing.T) {
	for _, c := range []struct {
		set  func(*Config)
		want string
	}{
		{func(c *Config) { c.WaitTimeout = 0 }, "pgryw: wait_timeout 0s out of range (1ms to 1h)"},
		{func(c *Config) { c.WaitTimeout = 2 * time.Hour }, "pgryw: wait_timeout 2h0m0s out of range (1ms to 1h)"},
		{func(c *Config) { c.OnTimeout = 9 }, `pgryw: DSN key on_timeout: invalid value "invalid(9)" (allowed: primary, error, stale)`},
		{func(c *Config) { c.WaitMethod = 9 }, `pgryw: DSN key wait_method: invalid value "invalid(9)" (allowed: auto, wait_for, poll, polar)`},
		{func(c *Config) { c.SessionScope = 2 }, `pgryw: DSN key session_scope: invalid value "invalid(2)" (allowed: db, conn)`},
		{func(c *Config) { c.Replicas = []string{"a", "b:x"} }, `pgryw: DSN key replicas: invalid value "a,b:x" (allowed: entry "b:x": port must be 1-65535)`},
		{func(c *Config) { c.MaxFallback = -1 }, "pgryw: max_fallback -1 out of range (0 to 10000)"},
		{func(c *Config) { c.MaxWaits = 10001 }, "pgryw: max_waits 10001 out of range (0 to 10000)"},
		{func(c *Config) { c.OnMaxFallback = 3 }, `pgryw: DSN key on_max_fallback: invalid value "invalid(3)" (allowed: wait, error, stale)`},
		{func(c *Config) { c.MaxReplicaLag = ReplicaLag{Bytes: 1, Duration: time.Second} }, "pgryw: max_replica_lag sets both Bytes and Duration; set one"},
		{func(c *Config) { c.MaxReplicaLag = ReplicaLag{Bytes: 1<<40 + 1} }, "pgryw: max_replica_lag 1099511627777B out of range (1B to 1TB)"},
		{func(c *Config) { c.MaxReplicaLag = ReplicaLag{Duration: time.Millisecond} }, "pgryw: max_replica_lag 1ms out of range (250ms to 24h)"},
	} {
		cfg := NewConfig()
		c.set(cfg)
		if err := cfg.validate(); err == nil || err.Error() != c.want {
			t.Errorf("validate() = %v, want %s", err, c.want)
		}
	}
	for _, c := range []struct{ dsn, want string }{
		{"wait_timeout=soon", `pgryw: DSN key wait_timeout: invalid value "soon" (allowed: a Go duration such as 500ms or 2s, or integer milliseconds, from 1ms to 1h)`},
		{"wait_timeout=3600001", `pgryw: DSN key wait_timeout: invalid value "3600001" (allowed: a Go duration such as 500ms or 2s, or integer milliseconds, from 1ms to 1h)`},
		{"read_your_writes=yes", `pgryw: DSN key read_your_writes: invalid value "yes" (allowed: on, off)`},
		{"replicas=a:0", `pgryw: DSN key replicas: invalid value "a:0" (allowed: host[:port][,host[:port]...], IPv6 as [addr]:port; entry "a:0": port must be 1-65535)`},
		{"write_functions=a,", `pgryw: DSN key write_functions: invalid value "a," (allowed: a comma-separated list of function names, optionally schema-qualified, double-quoted where their case or characters need it)`},
		{"max_fallback=x", `pgryw: DSN key max_fallback: invalid value "x" (allowed: an integer from 0 to 10000)`},
		{"max_replica_lag=16", `pgryw: DSN key max_replica_lag: invalid value "16" (allowed: off; a size with a unit (B, kB, MB, GB, TB) from 1B to 1TB, such as 16MB; or a Go duration from 250ms to 24h, such as 2s)`},
	} {
		if _, err := ParseDSN(c.dsn); err == nil || err.Error() != c.want {
			t.Errorf("ParseDSN(%q) = %v, want %s", c.dsn, err, c.want)
		}
	}
	for _, c := range []struct {
		dsn  string
		want time.Duration
	}{{"wait_timeout=1", time.Millisecond}, {"wait_timeout=3600000", time.Hour}, {"wait_timeout=1h", time.Hour}} {
		if cfg, err := ParseDSN(c.dsn); err != nil || cfg.WaitTimeout != c.want {
			t.Errorf("ParseDSN(%q) = %v, %v; want %v", c.dsn, cfg, err, c.want)
		}
	}
}

// max_replica_lag reads PostgreSQL's 1024-based units in any case, and
// writes the largest unit that divides the value.
func TestReplicaLagSpelling(t *testing.T) {
	for _, c := range []struct {
		in   string
		want ReplicaLag
		out  string
	}{
		{"1B", ReplicaLag{Bytes: 1}, "1B"},
		{"1024b", ReplicaLag{Bytes: 1024}, "1kB"},
		{"1536kB", ReplicaLag{Bytes: 1536 << 10}, "1536kB"},
		{"16mb", ReplicaLag{Bytes: 16 << 20}, "16MB"},
		{"2048MB", ReplicaLag{Bytes: 2 << 30}, "2GB"},
		{"1tb", ReplicaLag{Bytes: 1 << 40}, "1TB"},
		{"250ms", ReplicaLag{Duration: 250 * time.Millisecond}, "250ms"},
		{"1m30s", ReplicaLag{Duration: 90 * time.Second}, "1m30s"},
		{"24h", ReplicaLag{Duration: 24 * time.Hour}, "24h"},
		{"off", ReplicaLag{}, "off"},
	} {
		got, err := parseReplicaLag("max_replica_lag", c.in)
		if err != nil || got != c.want || got.String() != c.out {
			t.Errorf("parseReplicaLag(%q) = %+v (%s), %v; want %+v (%s)", c.in, got, got.String(), err, c.want, c.out)
		}
	}
}

// Each DSN key's Config field names it, with its default, in its doc.
func TestConfigDocsNameDSNKeys(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "config.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var docs []string
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != "Config" {
			return true
		}
		for _, fld := range ts.Type.(*ast.StructType).Fields.List {
			docs = append(docs, strings.Join(strings.Fields(fld.Doc.Text()), " "))
		}
		return false
	})
	for _, o := range dsnOptions {
		def := o.def
		if def == "" {
			def = "none"
		}
		n := 0
		for _, d := range docs {
			if strings.Contains(d, "DSN key "+o.key+" ") || strings.Contains(d, "DSN key "+o.key+",") || strings.Contains(d, "DSN key "+o.key+":") {
				n++
				if !strings.Contains(d, "default "+def) {
					t.Errorf("Config field doc for DSN key %s does not say %q: %s", o.key, "default "+def, d)
				}
			}
		}
		if n != 1 {
			t.Errorf(`%d Config field docs say "DSN key %s", want 1`, n, o.key)
		}
	}
}
