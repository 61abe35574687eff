package pgryw

import (
	"strings"
	"testing"
	"time"

	"github.com/pgryw/pgryw/internal/lsn"
)

// benchStatements are typical application statements, cached after first use.
var benchStatements = []string{
	`SELECT * FROM "users" WHERE "users"."id" = $1 ORDER BY "users"."id" LIMIT $2`,
	`INSERT INTO "users" ("name","email") VALUES ($1,$2) RETURNING "id"`,
	`SELECT id, name FROM accounts WHERE org_id = $1 AND deleted_at IS NULL /*controller='users',action='show'*/`,
	`UPDATE accounts SET balance = balance - $1 WHERE id = $2`,
	`WITH recent AS (SELECT * FROM orders WHERE created_at > now() - interval '1 day') SELECT count(*) FROM recent`,
}

// BenchmarkClassifyCached is the per-statement cost of classification once a
// statement has been seen: a map look-up under a read lock.
func BenchmarkClassifyCached(b *testing.B) {
	var cc classCache
	for _, q := range benchStatements {
		cc.get(q)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		cc.get(benchStatements[i%len(benchStatements)])
	}
}

// BenchmarkClassifyFirstSeen classifies without the cache.
func BenchmarkClassifyFirstSeen(b *testing.B) {
	var cc classCache
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		q := benchStatements[i%len(benchStatements)]
		cc.m = nil
		cc.get(q)
	}
}

// BenchmarkRouteDecision is the whole routing decision for a cached read
// after a write: classification, read-only check, watermark and replica
// choice. It must not allocate.
func BenchmarkRouteDecision(b *testing.B) {
	cfg, err := ParseDSN("host=w.invalid replicas=r1.invalid,r2.invalid,r3.invalid")
	if err != nil {
		b.Fatal(err)
	}
	c, err := newConnector(cfg, connHooks{})
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now().UnixNano()
	for i, n := range c.topo.replicas {
		c.topo.observe(n, 0, 0x3000000+lsnFor(i), now, now)
	}
	c.db.wm.Advance(0x3000010)
	q := benchStatements[0]
	c.classes.get(q)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		cls := c.classes.get(q)
		if !c.readOnly(&cls) {
			b.Fatal("not a read")
		}
		wm := c.db.wm.Load()
		if n, _ := c.topo.pick(wm, 0, c.cfg.WaitTimeout); n == nil {
			b.Fatal("no replica")
		}
	}
}

func lsnFor(i int) lsn.LSN { return lsn.LSN(i * 16) }

func TestBenchStatementsClassify(t *testing.T) {
	var cc classCache
	for _, q := range benchStatements {
		r := cc.get(q)
		read := !strings.HasPrefix(q, "INSERT") && !strings.HasPrefix(q, "UPDATE")
		if r.ReadOnly() != read {
			t.Errorf("%s: ReadOnly()=%v", q, r.ReadOnly())
		}
	}
}
