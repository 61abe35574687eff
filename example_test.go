package pgryw_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/pgryw/pgryw"
)

func ExampleParseDSN() {
	cfg, err := pgryw.ParseDSN("postgres://app:secret@primary/app?replicas=replica1,replica2:5433&wait_timeout=200ms&on_timeout=error")
	if err != nil {
		panic(err)
	}
	fmt.Println(cfg.Replicas, cfg.WaitTimeout, cfg.OnTimeout)
	fmt.Println(cfg.Primary)
	fmt.Println(cfg) // the password is never printed
	// Output:
	// [replica1 replica2:5433] 200ms error
	// postgres://app:secret@primary/app
	// postgres://app:xxxxx@primary/app?replicas=replica1%2Creplica2%3A5433&wait_timeout=200ms&on_timeout=error
}

func ExampleParseDSN_badValue() {
	_, err := pgryw.ParseDSN("host=primary on_timeout=later")
	fmt.Println(err)
	// Output:
	// pgryw: DSN key on_timeout: invalid value "later" (allowed: primary, error, stale)
}

func ExampleNewConnector() {
	cfg := pgryw.NewConfig()
	cfg.Primary = "host=primary user=app dbname=app"
	cfg.Replicas = []string{"replica1", "replica2"}
	c, err := pgryw.NewConnector(cfg)
	if err != nil {
		panic(err)
	}
	db := sql.OpenDB(c)
	defer db.Close()
	// Where did the reads go?
	fmt.Printf("%+v\n", c.Stats())
	// Output:
	// {ReplicaReads:0 PrimaryReads:0 Fallbacks:0 StaleReads:0 BehindErrors:0 Waits:0 WaitTimeouts:0 WaitRefusals:0 Captures:0 CaptureFailures:0 TokensClamped:0 TokensRebased:0 SnapshotMoves:0 Pinned:0 PinnedBy:map[] FallbackPeak:0 FallbackWaits:0 FallbacksRefused:0 WaitPeak:0 WaitsRefused:0 LagSkips:0}
}

func ExampleWithPrimary() {
	var db *sql.DB // opened with sql.Open("pgryw", …)
	read := func(ctx context.Context) {
		// Reads with this context go to the primary: they see other sessions'
		// latest writes too, not only this session's.
		if db != nil {
			db.QueryRowContext(pgryw.WithPrimary(ctx), "SELECT balance FROM accounts WHERE id = $1", 7)
		}
	}
	read(context.Background())
}

func ExampleErrReplicaBehind() {
	var db *sql.DB // opened with on_timeout=error
	if db == nil {
		return
	}
	var name string
	err := db.QueryRow("SELECT name FROM users WHERE id = $1", 7).Scan(&name)
	if errors.Is(err, pgryw.ErrReplicaBehind) {
		// No replica caught up within wait_timeout: retry later, or ask the
		// primary explicitly with pgryw.WithPrimary.
		fmt.Println("replica behind:", err)
	}
}

// A token travels in a job payload: the web process that wrote hands it to
// the worker, which observes it before it reads.
func ExampleSession_Token() {
	// In the web process, with db a pgryw pool:
	s := pgryw.NewSession()
	ctx := pgryw.WithSession(context.Background(), s)
	_ = ctx // db.ExecContext(ctx, "INSERT INTO orders …")
	payload := map[string]string{"order": "42", "pgryw_token": s.Token()}

	// In the worker process:
	w := pgryw.NewSession()
	if err := w.Observe(payload["pgryw_token"]); err != nil {
		fmt.Println("bad token:", err)
		return
	}
	wctx := pgryw.WithSession(context.Background(), w)
	_ = wctx // db.QueryRowContext(wctx, "SELECT … FROM orders WHERE id = $1", 42): sees the order
	fmt.Println(pgryw.SessionFrom(wctx) == w)
	// Output: true
}
