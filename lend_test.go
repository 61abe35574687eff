package pgryw

import (
	"database/sql/driver"
	"testing"
	"time"
)

// closeCounter is a driver.Conn that only counts Close.
type closeCounter struct {
	driver.Conn
	closed *int
}

func (c closeCounter) Close() error { *c.closed++; return nil }

// A lent replica connection nobody borrowed for lentIdleTime is closed, the
// oldest first; one given back since stays, and the next borrow gets the
// newest.
func TestLendPoolExpire(t *testing.T) {
	closed := 0
	var p lendPool
	bs := make([]*backend, 3)
	for i := range bs {
		bs[i] = &backend{conn: closeCounter{closed: &closed}}
	}
	now := time.Now()
	for _, b := range bs {
		p.put(b, 10)
	}
	p.since[0], p.since[1] = now.Add(-2*lentIdleTime), now.Add(-lentIdleTime-1)
	p.expire(now.Add(-lentIdleTime))
	if closed != 2 || p.size() != 1 || p.idle[0] != bs[2] || len(p.since) != 1 {
		t.Fatalf("closed %d, %d left (%v), since %v; want the two oldest closed", closed, p.size(), p.idle, p.since)
	}
	p.expire(now.Add(-lentIdleTime))
	if closed != 2 || p.size() != 1 {
		t.Fatalf("closed %d, %d left; the one given back since must stay", closed, p.size())
	}
	p.trim(0)
	if closed != 3 || p.size() != 0 || len(p.since) != 0 {
		t.Fatalf("trim(0): closed %d, %d left, since %v", closed, p.size(), p.since)
	}
}
