package pgtest

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
)

// PolarProxy is a protocol-level stand-in for a PolarDB replica, in front of
// a real PostgreSQL standby, for pgryw's wait_method=polar. It accepts the
// three settings PolarDB's proxy sends (seed 000), as one simple query of
// exactly the form pgryw sends,
//
//	SET polar_consistency_mode = 'strict'; SET polar_proxy_wait_timeout_ms = 500; SET polar_xact_split_wait_lsn = '97500059720'
//
// answering it itself (three SET completions), and remembers them for the
// session, as PolarDB does. Before it forwards the next statement it waits,
// polling the standby, until replay has reached the LSN or the timeout has
// passed (once per batch of messages up to a Sync, before any of them
// reaches the server). On a timeout in strict mode it fails the statement with SQLSTATE
// 57014 and a message naming polar_xact_split_wait_lsn (and skips the
// client's messages up to the next Sync, as a server does after an error);
// in best_effort mode it sends a WARNING notice saying so and runs the
// statement anyway. Every other message passes through untouched.
type PolarProxy struct {
	*proxy
	probe   string // connection string of the standby, for the waits
	mu      sync.Mutex
	waits   int64 // statements that had to wait
	timeout int64 // waits that timed out
}

var polarRE = regexp.MustCompile(`^SET polar_consistency_mode = '(strict|best_effort)'; SET polar_proxy_wait_timeout_ms = ([0-9]{1,9}); SET polar_xact_split_wait_lsn = '([0-9]{1,20})'$`)

// StartPolarProxy listens on a free loopback port and forwards to target
// ("host:port"), a standby; probeDSN connects to the same standby, to watch
// its replay position.
func StartPolarProxy(target, probeDSN string) (*PolarProxy, error) {
	p := &PolarProxy{probe: probeDSN}
	var err error
	p.proxy, err = startProxy(target, func(client, server net.Conn) (func(), func()) {
		s := &polarSession{p: p, client: client, server: server}
		return func() {
				s.frontend()
				if s.probe != nil {
					s.probe.Close(context.Background())
				}
			},
			s.backend
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// Waits returns how many statements waited for a PolarDB LSN, and how many
// of those waits timed out.
func (p *PolarProxy) Waits() (waits, timeouts int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waits, p.timeout
}

// polarSession is one client connection through the proxy.
type polarSession struct {
	p              *PolarProxy
	client, server net.Conn
	wmu            sync.Mutex // whole messages to the client, from either side

	// The session's settings, as PolarDB keeps them.
	strict  bool
	timeout time.Duration
	lsn     uint64 // 0: no wait
	reached uint64 // the standby was seen at or past this
	probe   *pgx.Conn
}

func (s *polarSession) toClient(b []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_, err := s.client.Write(b)
	return err
}

// backend copies the server's answers to the client, a whole message at a
// time, so that the proxy's own answers never land inside one.
func (s *polarSession) backend() {
	var hdr [5]byte
	for {
		if _, err := io.ReadFull(s.server, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(hdr[1:])
		if n < 4 || n > 1<<30 {
			return
		}
		msg := make([]byte, 1+n)
		copy(msg, hdr[:])
		if _, err := io.ReadFull(s.server, msg[5:]); err != nil {
			return
		}
		if s.toClient(msg) != nil {
			return
		}
	}
}

func (s *polarSession) frontend() {
	if !forwardStartup(s.client, s.server) {
		return
	}
	var hdr [5]byte
	skipping := false // after a refused statement, up to the next Sync
	waited := false   // this batch (up to its Sync) has had its wait
	for {
		if _, err := io.ReadFull(s.client, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(hdr[1:])
		if n < 4 || n > 1<<30 {
			return
		}
		body := make([]byte, n-4)
		if _, err := io.ReadFull(s.client, body); err != nil {
			return
		}
		t := hdr[0]
		if skipping {
			if t == 'S' {
				skipping = false
				if s.answer(&pgproto3.ReadyForQuery{TxStatus: 'I'}) != nil {
					return
				}
			}
			continue
		}
		if t == 'Q' && len(body) > 0 {
			if m := polarRE.FindStringSubmatch(string(body[:len(body)-1])); m != nil {
				s.strict = m[1] == "strict"
				ms, _ := strconv.ParseInt(m[2], 10, 64)
				s.timeout = time.Duration(ms) * time.Millisecond
				s.lsn, _ = strconv.ParseUint(m[3], 10, 64)
				set := &pgproto3.CommandComplete{CommandTag: []byte("SET")}
				if s.answer(set, set, set, &pgproto3.ReadyForQuery{TxStatus: 'I'}) != nil {
					return
				}
				continue
			}
		}
		if t == 'S' {
			waited = false
		}
		switch t {
		case 'Q', 'P', 'B', 'E':
			if waited {
				break
			}
			// The first message of a batch that may take a snapshot
			// waits, before anything of the batch reaches the server.
			waited = t != 'Q'
			ok, err := s.wait()
			if err != nil {
				return
			}
			if !ok && s.strict {
				e := &pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "57014",
					Message: fmt.Sprintf("canceling statement: replay did not reach polar_xact_split_wait_lsn %d within polar_proxy_wait_timeout_ms %d", s.lsn, s.timeout.Milliseconds())}
				if t == 'Q' {
					if s.answer(e, &pgproto3.ReadyForQuery{TxStatus: 'I'}) != nil {
						return
					}
				} else {
					if s.answer(e) != nil {
						return
					}
					skipping = true
				}
				continue
			}
			if !ok {
				w := &pgproto3.NoticeResponse{Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: "01000",
					Message: fmt.Sprintf("replay did not reach polar_xact_split_wait_lsn %d within polar_proxy_wait_timeout_ms %d; the rows may be stale (best_effort)", s.lsn, s.timeout.Milliseconds())}
				if s.answer(w) != nil {
					return
				}
			}
		}
		if _, err := s.server.Write(append(hdr[:], body...)); err != nil {
			return
		}
	}
}

// answer sends the proxy's own messages to the client.
func (s *polarSession) answer(msgs ...pgproto3.BackendMessage) error {
	var b []byte
	for _, m := range msgs {
		var err error
		if b, err = m.Encode(b); err != nil {
			return err
		}
	}
	return s.toClient(b)
}

// wait makes the statement about to be forwarded wait for the session's
// LSN: it reports false when the timeout passed first. Each LSN is waited
// for once: the standby only moves forward.
func (s *polarSession) wait() (bool, error) {
	if s.lsn == 0 || s.lsn <= s.reached {
		return true, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout+5*time.Second)
	defer cancel()
	if s.probe == nil {
		pc, err := pgx.Connect(ctx, s.p.probe)
		if err != nil {
			return false, err
		}
		s.probe = pc
	}
	s.p.mu.Lock()
	s.p.waits++
	s.p.mu.Unlock()
	target := fmt.Sprintf("%X/%X", s.lsn>>32, uint32(s.lsn))
	deadline := time.Now().Add(s.timeout)
	for {
		var ok bool
		if err := s.probe.QueryRow(ctx, "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)", target).Scan(&ok); err != nil {
			return false, err
		}
		if ok {
			s.reached = s.lsn
			return true, nil
		}
		if time.Now().After(deadline) {
			s.p.mu.Lock()
			s.p.timeout++
			s.p.mu.Unlock()
			return false, nil
		}
		time.Sleep(500 * time.Microsecond)
	}
}
