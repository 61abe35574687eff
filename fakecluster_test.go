package pgryw

// A scripted cluster on the wire: pgfake servers stand for the primary and
// the replicas, reached through pgx as in production (no test double below
// the backend). Each node answers pgryw's own statements as PostgreSQL
// would and the application's from a strict sequence of expectations, in
// the manner of pgx's pgmock: the next statement executed must be the next
// one expected.

import (
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/pgryw/pgryw/internal/pgfake"
)

// fakeNode is one scripted node.
type fakeNode struct {
	srv *pgfake.Server
	mu  sync.Mutex
	exp []*fakeExp
	// always answers these statements with rows, however often they
	// come, outside the script (for benchmarks).
	always map[string]*fakeRows
	bad    []string // what arrived out of script
	// settings and locks per server connection, for the session-state
	// read-back: what SET and pg_advisory_lock did there.
	settings map[int]map[string]string
	locks    map[int]int
}

// fakeExp is one expected application statement and its answer.
type fakeExp struct {
	sql  string
	rows *fakeRows // nil: the statement's command tag (fakeTag)
	err  error
}

// fakeRows are rows an expectation answers with: one column v, in text.
type fakeRows struct{ vals []string }

// valueRow is one row of column v holding n.
func valueRow(n int) *fakeRows { return &fakeRows{vals: []string{fmt.Sprint(n)}} }

// ExpectQuery expects sql executed for rows.
func (n *fakeNode) ExpectQuery(sql string) *fakeExp { return n.expect(sql) }

// ExpectExec expects sql executed for its tag.
func (n *fakeNode) ExpectExec(sql string) *fakeExp { return n.expect(sql) }

// ExpectBegin, ExpectCommit and ExpectRollback expect transaction control
// (pgx's "begin …" for BeginTx).
func (n *fakeNode) ExpectBegin()    { n.expect("begin") }
func (n *fakeNode) ExpectCommit()   { n.expect("commit") }
func (n *fakeNode) ExpectRollback() { n.expect("rollback") }

func (n *fakeNode) expect(sql string) *fakeExp {
	e := &fakeExp{sql: sql}
	n.mu.Lock()
	n.exp = append(n.exp, e)
	n.mu.Unlock()
	return e
}

// Always answers sql with rows (nil: its command tag) whenever it comes,
// outside the script.
func (n *fakeNode) Always(sql string, rows *fakeRows) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.always == nil {
		n.always = map[string]*fakeRows{}
	}
	n.always[sql] = rows
}

// WithArgs is accepted for the reader: arguments are not checked.
func (e *fakeExp) WithArgs(...any) *fakeExp { return e }

// WillReturnRows answers with rows.
func (e *fakeExp) WillReturnRows(r *fakeRows) *fakeExp { e.rows = r; return e }

// WillReturnError answers with err: a *pgconn.PgError, or
// driver.ErrBadConn for the connection lost mid-answer.
func (e *fakeExp) WillReturnError(err error) *fakeExp { e.err = err; return e }

// ExpectationsWereMet reports expectations left, and statements that came
// out of script.
func (n *fakeNode) ExpectationsWereMet() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	var left []string
	for _, e := range n.exp {
		left = append(left, e.sql)
	}
	if len(left) > 0 || len(n.bad) > 0 {
		return fmt.Errorf("expected but not run: %q; out of script: %q", left, n.bad)
	}
	return nil
}

var (
	setRe  = regexp.MustCompile(`(?i)^SET\s+(?:SESSION\s+)?([a-z_.]+)\s*(?:=|TO)\s*'?([^']*)'?$`)
	lockRe = regexp.MustCompile(`(?i)pg_advisory_lock\(`)
	params = regexp.MustCompile(`\$[0-9]+`)
)

// handle answers a batch of n's.
func (n *fakeNode) handle(c *pgfake.Conn, b pgfake.Batch) []pgproto3.BackendMessage {
	return c.Answer(b, func(q pgfake.Query) pgfake.Result {
		n.mu.Lock()
		defer n.mu.Unlock()
		if r, ok := n.own(c, q); ok {
			return r
		}
		if q.SQL == "" || strings.HasPrefix(q.SQL, "--") {
			return pgfake.Result{}
		}
		oids := make([]uint32, len(params.FindAllString(q.SQL, -1)))
		for i := range oids {
			oids[i] = 20
		}
		if r, ok := n.always[q.SQL]; ok {
			res := pgfake.Result{Params: oids}
			switch {
			case r == nil:
				res.Tag = fakeTag(q.SQL)
			case !q.Describe:
				res.Rows = [][][]byte{pgfake.Row(r.vals...)}
				fallthrough
			default:
				res.Cols = []pgfake.Column{{Name: "v", OID: 25}}
			}
			return res
		}
		var e *fakeExp
		if len(n.exp) > 0 && n.matches(n.exp[0].sql, q.SQL) {
			e = n.exp[0]
		}
		if e == nil {
			if !q.Describe {
				n.bad = append(n.bad, q.SQL)
			}
			return pgfake.Result{Err: pgfake.Error("XX000", "fake cluster: out of script: "+q.SQL)}
		}
		res := pgfake.Result{Params: oids}
		if e.rows != nil {
			res.Cols = []pgfake.Column{{Name: "v", OID: 25}}
		}
		if q.Describe {
			return res
		}
		n.exp = n.exp[1:]
		if errors.Is(e.err, driver.ErrBadConn) {
			c.Hangup() // a connection fault: the server goes away mid-answer
			return pgfake.Result{Err: pgfake.Error("08006", "connection lost")}
		}
		var pgErr *pgconn.PgError
		if errors.As(e.err, &pgErr) {
			return pgfake.Result{Err: pgfake.Error(pgErr.Code, pgErr.Message)}
		}
		if e.rows != nil {
			res.Rows = [][][]byte{pgfake.Row(e.rows.vals...)}
			return res
		}
		res.Tag = fakeTag(q.SQL)
		n.track(c, q.SQL)
		return res
	})
}

// matches reports that an expected statement is the one that arrived.
func (n *fakeNode) matches(want, got string) bool {
	if want == "begin" || want == "commit" || want == "rollback" {
		return strings.HasPrefix(strings.ToLower(got), want)
	}
	return want == got
}

// own answers pgryw's own statements as PostgreSQL would.
func (n *fakeNode) own(c *pgfake.Conn, q pgfake.Query) (pgfake.Result, bool) {
	switch q.SQL {
	case sqlSystem:
		return pgfake.Result{Cols: []pgfake.Column{{Name: "system_identifier", OID: 25}}, Rows: [][][]byte{{nil}}}, true
	case sqlState:
		res := pgfake.Result{Params: []uint32{1009}, Cols: []pgfake.Column{
			{Name: "locks", OID: 20}, {Name: "listen", OID: 20}, {Name: "temp", OID: 20},
			{Name: "prepared", OID: 20}, {Name: "cursors", OID: 20}, {Name: "settings", OID: 25}}}
		if q.Describe {
			return res, true
		}
		var js []byte
		if s := n.settings[c.ID()]; len(s) > 0 {
			var pairs [][2]string
			for k, v := range s {
				pairs = append(pairs, [2]string{k, v})
			}
			js, _ = json.Marshal(pairs)
		}
		res.Rows = [][][]byte{{[]byte(fmt.Sprint(n.locks[c.ID()])), []byte("0"), []byte("0"), []byte("0"), []byte("0"), js}}
		return res, true
	case sqlApplySettings:
		res := pgfake.Result{Params: []uint32{1009, 1009}, Cols: []pgfake.Column{{Name: "count", OID: 20}}}
		if !q.Describe {
			res.Rows = [][][]byte{pgfake.Row("1")}
		}
		return res, true
	}
	return pgfake.Result{}, false
}

// track records what an application statement did to the session.
func (n *fakeNode) track(c *pgfake.Conn, sql string) {
	if m := setRe.FindStringSubmatch(sql); m != nil {
		if n.settings[c.ID()] == nil {
			n.settings[c.ID()] = map[string]string{}
		}
		n.settings[c.ID()][strings.ToLower(m[1])] = m[2]
	}
	if lockRe.MatchString(sql) {
		n.locks[c.ID()]++
	}
}

// fakeTag is the command tag PostgreSQL gives sql.
func fakeTag(sql string) string {
	w := strings.ToUpper(strings.Fields(sql + " x")[0])
	switch w {
	case "INSERT":
		return "INSERT 0 1"
	case "UPDATE", "DELETE":
		return w + " 1"
	}
	return w
}

// fakeCluster is a Connector on a scripted primary and n replicas, with
// read_your_writes=off (which node receives a statement does not depend on
// it), its monitor stopped, and a pool of one connection.
type fakeCluster struct {
	c        *Connector
	db       *sql.DB
	primary  *fakeNode
	replicas []*fakeNode
}

func newFakeNode(t testing.TB, standby bool) *fakeNode {
	t.Helper()
	n := &fakeNode{settings: map[int]map[string]string{}, locks: map[int]int{}}
	hs := "off"
	if standby {
		hs = "on"
	}
	var err error
	n.srv, err = pgfake.Start(pgfake.Config{ServerVersion: "15.4", InHotStandby: hs, Handler: n.handle})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.srv.Close() })
	return n
}

// newFakeCluster builds it; extra is appended to the DSN.
func newFakeCluster(t testing.TB, replicas int, extra string) *fakeCluster {
	t.Helper()
	fc := &fakeCluster{primary: newFakeNode(t, false)}
	var addrs []string
	for i := 0; i < replicas; i++ {
		r := newFakeNode(t, true)
		fc.replicas = append(fc.replicas, r)
		addrs = append(addrs, r.srv.Addr())
	}
	dsn := fmt.Sprintf("host=%s port=%d user=app password=hunter2 dbname=app sslmode=disable read_your_writes=off %s",
		fc.primary.srv.Host(), fc.primary.srv.Port(), extra)
	if replicas > 0 {
		dsn += " replicas=" + strings.Join(addrs, ",")
	}
	cfg, err := ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if fc.c, err = newConnector(cfg, connHooks{}); err != nil {
		t.Fatal(err)
	}
	fc.c.mon.closed = true // the monitor's probes are not what these tests script
	fc.db = sql.OpenDB(fc.c)
	fc.db.SetMaxOpenConns(1)
	t.Cleanup(func() { fc.db.Close() })
	return fc
}

// verify fails t for any node's unmet expectations or unscripted statements.
func (fc *fakeCluster) verify(t *testing.T) {
	t.Helper()
	if err := fc.primary.ExpectationsWereMet(); err != nil {
		t.Errorf("primary: %v", err)
	}
	for i, r := range fc.replicas {
		if err := r.ExpectationsWereMet(); err != nil {
			t.Errorf("replica %d: %v", i, err)
		}
	}
}
