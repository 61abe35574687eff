package pgryw_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"

	"github.com/pgryw/pgryw"
)

// A request log that says which node answered each statement, and why.
func ExampleWithServedBy() {
	var db *sql.DB // opened with sql.Open("pgryw", …)
	ctx := pgryw.WithServedBy(context.Background(), func(_ context.Context, s pgryw.ServedBy) {
		slog.Info("statement served", "node", s.Addr, "role", s.Role, "route", s.Route, "fallback", s.Fallback, "wait", s.Wait)
	})
	if db != nil {
		db.QueryRowContext(ctx, "SELECT name FROM users WHERE id = $1", 7)
	}
}

// Per-node counters of a pool opened with sql.Open.
func ExampleNodeStatsOf() {
	var db *sql.DB // opened with sql.Open("pgryw", …)
	if db == nil {
		return
	}
	nodes, err := pgryw.NodeStatsOf(db)
	if err != nil {
		return
	}
	for _, n := range nodes {
		fmt.Printf("%s %s %s: %d reads, %d writes, %d waits (%v), %d fallbacks, lag %v\n",
			n.Addr, n.Role, n.Health, n.Reads, n.Writes, n.Waits, n.WaitTime.Sum, n.Fallbacks.Total(), n.Lag)
	}
}

func ExampleConnector_NodeStats() {
	cfg := pgryw.NewConfig()
	cfg.Primary = "host=primary user=app dbname=app"
	cfg.Replicas = []string{"replica1"}
	c, err := pgryw.NewConnector(cfg)
	if err != nil {
		panic(err)
	}
	for _, n := range c.NodeStats() {
		fmt.Println(n.Addr, n.Role, n.Health, n.Statements)
	}
	// Output:
	// primary:5432 primary unknown 0
	// replica1:5432 replica unknown 0
}
