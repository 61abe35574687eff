package pgryw_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// panicScanner panics when a row is scanned into it: the caller's own code
// failing while it reads.
type panicScanner struct{}

func (panicScanner) Scan(any) error { panic("scanner panics") }

// A panic inside QueryRow(...).Scan, in the caller's own Scanner, gives the
// connection back, as pgxpool's does: a pool of one keeps serving. Before
// the fix the connection stayed with the abandoned row and the pool ran
// dry (pgxpool's own TestPoolQueryRowScanPanicReleasesConnection hung). The
// same program on pgxpool against the primary is the control.
func TestIntegrationPoolQueryRowScanPanicReleases(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ryw := openPool(t, "pool_max_conns=1")
	xp, err := pgxpool.New(ctx, cluster.WriterDSN()+"&pool_max_conns=1")
	if err != nil {
		t.Fatal(err)
	}
	defer xp.Close()
	type queryRower interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}
	for _, side := range []struct {
		name string
		p    queryRower
	}{{"pgxpool", xp}, {"pgryw", ryw}} {
		for i := 0; i < 3; i++ {
			func() {
				defer func() {
					if r := recover(); r == nil {
						t.Errorf("%s: the Scanner's panic did not reach the caller", side.name)
					}
				}()
				side.p.QueryRow(ctx, "SELECT 1").Scan(panicScanner{})
			}()
		}
		qctx, qcancel := context.WithTimeout(ctx, 3*time.Second)
		var n int
		err := side.p.QueryRow(qctx, "SELECT 42").Scan(&n)
		qcancel()
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: after panics in Scan the pool of one has no connection to give", side.name)
		}
		if err != nil || n != 42 {
			t.Fatalf("%s: %d, %v", side.name, n, err)
		}
	}
}
