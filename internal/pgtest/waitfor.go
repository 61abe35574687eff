package pgtest

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"regexp"
	"sync"

	"github.com/jackc/pgx/v5"
)

// PostgreSQL 19's WAIT FOR LSN is in no package these machines can install.
// To run pgryw's WAIT FOR path end to end against real replicas anyway,
// WaitForProxy sits in front of a PostgreSQL 15+ standby and rewrites each
// statement of the exact form pgryw sends (a simple-protocol Query, or the
// Parse of one riding with no Sync of its own in front of a read),
//
//	WAIT FOR LSN '<lsn>' WITH (MODE 'standby_replay', TIMEOUT '<n>ms', NO_THROW)
//
// into a call of pgtest_wait_for(lsn, ms), a function installed by
// InstallWaitFor that behaves like the real statement with NO_THROW: it
// returns one text column, status, with 'success' once replay has reached
// the position, 'timeout' when the time runs out, and 'not in recovery' on a
// node that is not a standby. Everything else passes through untouched.
//
// The emulation polls inside a function, which the real server avoids (a
// held snapshot can delay replay of cleanup records); that is acceptable for
// tests whose tables see no vacuum conflicts, and it keeps the protocol
// shape (one statement, one row, answered before the next query) exactly
// that of PostgreSQL 19. Unlike WAIT FOR, the SELECT takes a snapshot: with
// REPEATABLE READ as a session's default, a read chained behind it in one
// implicit transaction would share it, so the emulation is for READ
// COMMITTED sessions only.

const waitForFunction = `CREATE OR REPLACE FUNCTION pgtest_wait_for(target pg_lsn, ms int) RETURNS TABLE(status text)
LANGUAGE plpgsql AS $$
DECLARE deadline timestamptz := clock_timestamp() + ms * interval '1 millisecond';
BEGIN
  IF NOT pg_is_in_recovery() THEN status := 'not in recovery'; RETURN NEXT; RETURN; END IF;
  LOOP
    IF pg_last_wal_replay_lsn() >= target THEN status := 'success'; RETURN NEXT; RETURN; END IF;
    IF clock_timestamp() >= deadline THEN status := 'timeout'; RETURN NEXT; RETURN; END IF;
    PERFORM pg_sleep(0.0005);
  END LOOP;
END $$`

// InstallWaitFor creates pgtest_wait_for on the writer (it replicates to the
// standbys) and waits until every replica has it.
func (c *Cluster) InstallWaitFor(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.WriterDSN())
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, waitForFunction); err != nil {
		return fmt.Errorf("pgtest: install pgtest_wait_for: %w", err)
	}
	return c.WaitCaughtUp(ctx)
}

var waitForRE = regexp.MustCompile(`^WAIT FOR LSN '([0-9A-F]{1,8}/[0-9A-F]{1,8})' WITH \(MODE 'standby_replay', TIMEOUT '([0-9]{1,9})ms', NO_THROW\)$`)

// WaitForProxy is a loopback TCP proxy that emulates WAIT FOR LSN.
type WaitForProxy struct {
	*proxy
	mu sync.Mutex
	n  int64 // rewritten statements
}

// StartWaitForProxy listens on a free loopback port and forwards to target
// ("host:port").
func StartWaitForProxy(target string) (*WaitForProxy, error) {
	p := &WaitForProxy{}
	var err error
	p.proxy, err = startProxy(target, func(client, server net.Conn) (func(), func()) {
		return func() { p.frontend(client, server) }, func() { io.Copy(client, server) }
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// Rewritten returns how many WAIT FOR statements the proxy has emulated.
func (p *WaitForProxy) Rewritten() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// frontend copies client messages to the server, rewriting WAIT FOR.
func (p *WaitForProxy) frontend(client, server net.Conn) {
	if !forwardStartup(client, server) {
		return
	}
	var hdr [5]byte
	for {
		if _, err := io.ReadFull(client, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(hdr[1:])
		if n < 4 || n > 1<<30 {
			return
		}
		body := make([]byte, n-4)
		if _, err := io.ReadFull(client, body); err != nil {
			return
		}
		var name, query, rest []byte // a Parse's parts; a Query's is all query
		switch {
		case hdr[0] == 'Q' && len(body) > 0:
			query = body[:len(body)-1]
		case hdr[0] == 'P':
			// name \0 query \0 parameter types: pgryw's WAIT FOR riding
			// without a Sync of its own in front of a read.
			if i := bytes.IndexByte(body, 0); i >= 0 {
				if j := bytes.IndexByte(body[i+1:], 0); j >= 0 {
					name, query, rest = body[:i], body[i+1:i+1+j], body[i+1+j+1:]
				}
			}
		}
		if m := waitForRE.FindStringSubmatch(string(query)); m != nil {
			q := fmt.Sprintf("SELECT status FROM pgtest_wait_for('%s', %s)", m[1], m[2])
			if hdr[0] == 'Q' {
				body = append([]byte(q), 0)
			} else {
				body = append(append(append(append([]byte{}, name...), 0), q...), 0)
				body = append(body, rest...)
			}
			binary.BigEndian.PutUint32(hdr[1:], uint32(len(body)+4))
			p.mu.Lock()
			p.n++
			p.mu.Unlock()
		}
		if _, err := server.Write(append(hdr[:], body...)); err != nil {
			return
		}
	}
}
