package pgryw_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgtest"
)

// A token issued through one *sql.DB makes a read through another (its own
// connector, no pool watermark in common) see the write, with the replicas
// 100 ms behind.
func TestIntegrationSessionTokenAcrossPools(t *testing.T) {
	table := newTable(t)
	setDelay(t, 100*time.Millisecond)
	dbA, _ := openDB(t, "session_scope=conn&wait_timeout=2s")
	dbB, cB := openDB(t, "session_scope=conn&wait_timeout=2s")
	ctx := context.Background()
	const workers, each = 4, 50
	const n = workers * each
	var stale, failed atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < each; j++ {
				i := w*each + j + 1
				a := pgryw.NewSession()
				if _, err := dbA.ExecContext(pgryw.WithSession(ctx, a), "INSERT INTO "+table+" VALUES ($1, $2)", i, i); err != nil {
					t.Error(err)
					failed.Add(1)
					return
				}
				b := pgryw.NewSession()
				if err := b.Observe(a.Token()); err != nil || a.Token() == "" {
					t.Errorf("token %q: %v", a.Token(), err)
					failed.Add(1)
					return
				}
				var v int
				err := dbB.QueryRowContext(pgryw.WithSession(ctx, b), "SELECT v FROM "+table+" WHERE id = $1", i).Scan(&v)
				if err == sql.ErrNoRows {
					stale.Add(1)
				} else if err != nil {
					t.Error(err)
					failed.Add(1)
					return
				}
			}
		}()
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.FailNow()
	}
	s := cB.Stats()
	t.Logf("%d reads, %d stale; reader stats %+v", n, stale.Load(), s)
	if stale.Load() != 0 {
		t.Fatalf("%d of %d reads with the writer's token missed the write", stale.Load(), n)
	}
	if s.ReplicaReads < n*9/10 {
		t.Fatalf("only %d of %d reads on replicas", s.ReplicaReads, n)
	}
}

// Without the token the same reads are stale: the control.
func TestIntegrationSessionTokenControl(t *testing.T) {
	table := newTable(t)
	setDelay(t, 100*time.Millisecond)
	dbA, _ := openDB(t, "session_scope=conn")
	dbB, _ := openDB(t, "session_scope=conn")
	ctx := context.Background()
	stale := 0
	for i := 1; i <= 20; i++ {
		if _, err := dbA.ExecContext(ctx, "INSERT INTO "+table+" VALUES ($1, $2)", i, i); err != nil {
			t.Fatal(err)
		}
		if err := dbB.QueryRowContext(ctx, "SELECT v FROM "+table+" WHERE id = $1", i).Scan(new(int)); err == sql.ErrNoRows {
			stale++
		}
	}
	if stale == 0 {
		t.Fatal("without a token no read was stale: the test cannot tell")
	}
}

const childDSNEnv = "PGRYW_TEST_CHILD_DSN"

// TestHelperProcessWrite is the child of TestIntegrationSessionTokenAcrossProcesses:
// it writes one row with a Session and prints the Session's token.
func TestHelperProcessWrite(t *testing.T) {
	dsn := os.Getenv(childDSNEnv)
	if dsn == "" {
		t.Skip("a child process of TestIntegrationSessionTokenAcrossProcesses")
	}
	db, err := sql.Open("pgryw", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	id, _ := strconv.Atoi(os.Getenv("PGRYW_TEST_CHILD_ID"))
	s := pgryw.NewSession()
	if _, err := db.ExecContext(pgryw.WithSession(context.Background(), s), "INSERT INTO "+os.Getenv("PGRYW_TEST_CHILD_TABLE")+" VALUES ($1, $2)", id, id); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("TOKEN %s\n", s.Token())
}

// The token crosses an OS process boundary: a child process writes and
// prints its token; the parent observes it and reads through its own pool.
func TestIntegrationSessionTokenAcrossProcesses(t *testing.T) {
	table := newTable(t)
	setDelay(t, 100*time.Millisecond)
	dsn := cluster.WriterDSN() + "&session_scope=conn&replicas=" + strings.Join(cluster.ReplicaAddrs(), ",")
	db, _ := openDB(t, "session_scope=conn&wait_timeout=2s")
	ctx := context.Background()
	for i := 1; i <= 4; i++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcessWrite$", "-test.count=1")
		cmd.Env = append(os.Environ(), childDSNEnv+"="+dsn, "PGRYW_TEST_CHILD_TABLE="+table, "PGRYW_TEST_CHILD_ID="+strconv.Itoa(i))
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		var tok string
		sc := bufio.NewScanner(strings.NewReader(string(out)))
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "TOKEN" {
				tok = f[1]
			}
		}
		if tok == "" {
			t.Fatalf("child printed no token:\n%s", out)
		}
		s := pgryw.NewSession()
		if err := s.Observe(tok); err != nil {
			t.Fatal(err)
		}
		var v int
		if err := db.QueryRowContext(pgryw.WithSession(ctx, s), "SELECT v FROM "+table+" WHERE id = $1", i).Scan(&v); err != nil {
			t.Fatalf("read %d with the child's token %s: %v", i, tok, err)
		}
	}
}

// Tampered and forged tokens: rejected when signed; an unsigned position
// beyond anything the primary wrote is clamped and counted, and never makes
// a read wait; a token from another primary generation is rebased.
func TestIntegrationSessionTokenHostile(t *testing.T) {
	pgtest.Require(t, cluster)
	table := newTable(t)
	ctx := context.Background()
	key := []byte("0123456789abcdef0123456789abcdef")
	db, c := openDB(t, "session_scope=conn&wait_timeout=300ms&on_timeout=error")
	w := pgryw.NewSession(pgryw.SessionKeys(key))
	if _, err := db.ExecContext(pgryw.WithSession(ctx, w), "INSERT INTO "+table+" VALUES (1, 1)"); err != nil {
		t.Fatal(err)
	}
	tok := w.Token()
	r := pgryw.NewSession(pgryw.SessionKeys([]byte("new key, listed first"), key))
	if err := r.Observe(tok); err != nil {
		t.Fatalf("a token signed with a rotated-out key: %v", err)
	}
	for i := range len(tok) {
		b := []byte(tok)
		b[i] ^= 1
		if err := pgryw.NewSession(pgryw.SessionKeys(key)).Observe(string(b)); err == nil {
			t.Fatalf("tampered token %q accepted", b)
		}
	}
	fields := strings.Split(tok, ".")
	forged := strings.Join(fields[:3], ".") + ".ffffffffffff"
	if err := pgryw.NewSession(pgryw.SessionKeys(key)).Observe(forged); err == nil {
		t.Fatal("an unsigned token accepted by a signed session")
	}
	// Unsigned sessions take it, and the pool clamps it.
	u := pgryw.NewSession()
	if err := u.Observe(forged); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(pgryw.WithSession(ctx, u), "SELECT count(*) FROM "+table).Scan(new(int)); err != nil {
		t.Fatalf("read with a forged far-future token: %v", err)
	}
	if s := c.Stats(); s.TokensClamped != 1 || s.WaitTimeouts != 0 || s.BehindErrors != 0 {
		t.Fatalf("forged token: %+v", s)
	}
	// Another primary generation: rebased onto this one.
	other := "1.1." + fields[2] + "." + fields[3]
	g := pgryw.NewSession()
	if err := g.Observe(other); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRowContext(pgryw.WithSession(ctx, g), "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 1 {
		t.Fatalf("read with another generation's token: %d, %v", n, err)
	}
	if s := c.Stats(); s.TokensRebased != 1 {
		t.Fatalf("generation change not rebased: %+v", s)
	}
	if g.Token() == other {
		t.Fatal("the session still carries the other generation")
	}
}
