package faultnet

import (
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// pair returns a wrapped client connection and the server's end of a
// loopback TCP connection.
func pair(t *testing.T, nw *Network) (*Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	srv := <-acc
	if srv == nil {
		t.Fatal("accept failed")
	}
	_, ps, _ := net.SplitHostPort(ln.Addr().String())
	port, _ := strconv.Atoi(ps)
	c := nw.Wrap(uint16(port), raw).(*Conn)
	t.Cleanup(func() { c.Close(); srv.Close() })
	return c, srv
}

func TestCutWrite(t *testing.T) {
	for _, after := range []int{0, 3, 7, 10} {
		nw := New()
		c, srv := pair(t, nw)
		c.Arm(Fault{Kind: CutWrite, After: after})
		total := 0
		var err error
		for _, chunk := range []string{"abcde", "fghij", "klmno"} {
			var n int
			n, err = c.Write([]byte(chunk))
			total += n
			if err != nil {
				break
			}
		}
		if !errors.Is(err, ErrInjected) || total != after {
			t.Fatalf("after=%d: wrote %d, err %v", after, total, err)
		}
		got, _ := io.ReadAll(srv)
		if len(got) != after || string(got) != "abcdefghijklmno"[:after] {
			t.Fatalf("after=%d: server got %q", after, got)
		}
		if _, err := c.Write([]byte("x")); err == nil {
			t.Fatal("write after the cut succeeded")
		}
		if nw.Fired(CutWrite) != 1 || len(nw.Conns(0)) != 0 {
			t.Fatalf("fired %d, live %d", nw.Fired(CutWrite), len(nw.Conns(0)))
		}
	}
}

func TestCutRead(t *testing.T) {
	nw := New()
	c, srv := pair(t, nw)
	srv.Write([]byte("0123456789"))
	c.Arm(Fault{Kind: CutRead, After: 4})
	buf := make([]byte, 100)
	var got []byte
	var err error
	for {
		var n int
		n, err = c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			break
		}
	}
	if string(got) != "0123" || !errors.Is(err, ErrInjected) {
		t.Fatalf("read %q, err %v", got, err)
	}
	// The server sees the connection closed.
	srv.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := srv.Read(buf); err == nil {
		t.Fatal("server read succeeded after the cut")
	}
}

func TestReset(t *testing.T) {
	nw := New()
	var fired atomic.Int64
	nw.OnFire = func(_ *Conn, k Kind) {
		if k == Reset {
			fired.Add(1)
		}
	}
	c, srv := pair(t, nw)
	c.Arm(Fault{Kind: Reset})
	if !c.Armed() {
		t.Fatal("not armed")
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, ErrInjected) {
		t.Fatalf("write: %v", err)
	}
	srv.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := srv.Read(make([]byte, 1)); err == nil || os.IsTimeout(err) {
		t.Fatalf("server read after reset: %v", err)
	}
	// Reset at once, from outside.
	c2, _ := pair(t, nw)
	c2.Reset()
	if _, err := c2.Read(make([]byte, 1)); !errors.Is(err, ErrInjected) {
		t.Fatalf("read after Reset: %v", err)
	}
	if fired.Load() != 2 || nw.Fired(Reset) != 2 {
		t.Fatalf("fired %d / %d", fired.Load(), nw.Fired(Reset))
	}
}

func TestStall(t *testing.T) {
	nw := New()
	c, srv := pair(t, nw)
	c.Arm(Fault{Kind: Stall, Delay: 100 * time.Millisecond})
	t0 := time.Now()
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d < 100*time.Millisecond {
		t.Fatalf("stall lasted %v", d)
	}
	// One-shot.
	t0 = time.Now()
	c.Write([]byte("y"))
	if d := time.Since(t0); d > 50*time.Millisecond {
		t.Fatalf("second write took %v", d)
	}
	buf := make([]byte, 2)
	if _, err := io.ReadFull(srv, buf); err != nil || string(buf) != "xy" {
		t.Fatalf("server got %q, %v", buf, err)
	}

	// A deadline set during the stall ends it.
	c.Arm(Fault{Kind: Stall, Delay: 10 * time.Second})
	go func() {
		time.Sleep(30 * time.Millisecond)
		c.SetDeadline(time.Unix(1, 0))
	}()
	t0 = time.Now()
	if _, err := c.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) || time.Since(t0) > 5*time.Second {
		t.Fatalf("stalled read: %v after %v", err, time.Since(t0))
	}
	c.SetDeadline(time.Time{})

	// Close ends it too.
	c.Arm(Fault{Kind: Stall, Delay: 10 * time.Second})
	go func() {
		time.Sleep(30 * time.Millisecond)
		c.Close()
	}()
	if _, err := c.Write(buf); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("stalled write after close: %v", err)
	}
}

func TestNetworkTracking(t *testing.T) {
	nw := New()
	c1, _ := pair(t, nw)
	c2, _ := pair(t, nw)
	if nw.Lookup(c1.LocalAddr()) != c1 || nw.Lookup(c2.LocalAddr()) != c2 {
		t.Fatal("lookup by local address")
	}
	if got := len(nw.Conns(c1.Port())); got != 1 {
		t.Fatalf("conns to c1's port: %d", got)
	}
	if n := nw.ArmAll(0, Fault{Kind: Stall, Delay: time.Millisecond}); n != 2 {
		t.Fatalf("ArmAll armed %d", n)
	}
	nw.DisarmAll()
	if c1.Armed() || c2.Armed() {
		t.Fatal("still armed after DisarmAll")
	}
	c1.Arm(Fault{Kind: CutWrite, After: 5})
	c1.Disarm()
	if _, err := c1.Write(make([]byte, 10)); err != nil {
		t.Fatalf("disarmed write: %v", err)
	}
	c1.Close()
	if nw.Lookup(c1.LocalAddr()) != nil || len(nw.Conns(0)) != 1 {
		t.Fatal("closed conn still tracked")
	}
}

// msg encodes one backend message.
func msg(typ byte, body string) []byte {
	n := len(body) + 4
	return append([]byte{typ, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, body...)
}

// readAll reads c until an error or want bytes, one small buffer at a time
// (so messages and the ReadyForQuery are split across Reads).
func readAll(c *Conn, want int, size int) ([]byte, error) {
	buf := make([]byte, size)
	var got []byte
	for len(got) < want {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			return got, err
		}
	}
	return got, nil
}

func TestAfterReady(t *testing.T) {
	// A Parse and Describe's answer comes first, and a SELECT's: neither
	// changes data.
	before := append(append(msg('1', ""), msg('n', "")...), msg('Z', "I")...)
	before = append(append(append(before, msg('D', "\x00\x01\x00\x00\x00\x011")...), msg('C', "SELECT 1\x00")...), msg('Z', "I")...)
	before = append(append(append(before, msg('2', "")...), msg('C', "INSERT 0 1\x00")...), msg('Z', "I")...)
	behind := append(msg('D', "\x00\x01\x00\x00\x00\x030/1"), msg('Z', "I")...)
	startup := append(msg('R', "\x00\x00\x00\x00"), msg('Z', "I")...)
	for _, size := range []int{1, 3, 7, 4096} {
		// Cut: what follows the next ReadyForQuery is lost.
		nw := New()
		c, srv := pair(t, nw)
		srv.Write(startup)
		if got, err := readAll(c, len(startup), size); err != nil || string(got) != string(startup) {
			t.Fatalf("size %d: startup %q, %v", size, got, err)
		}
		c.Arm(Fault{Kind: CutAfterReady})
		srv.Write(append(append([]byte{}, before...), behind...))
		got, err := readAll(c, len(before)+len(behind), size)
		if string(got) != string(before) || !errors.Is(err, ErrInjected) || nw.Fired(CutAfterReady) != 1 {
			t.Fatalf("size %d: cut: read %q, err %v, fired %d", size, got, err, nw.Fired(CutAfterReady))
		}
		// Stall: it comes, Delay later.
		nw = New()
		c, srv = pair(t, nw)
		srv.Write(startup)
		readAll(c, len(startup), size)
		c.Arm(Fault{Kind: StallAfterReady, Delay: 150 * time.Millisecond})
		srv.Write(append(append([]byte{}, before...), behind...))
		got, err = readAll(c, len(before), size)
		if err != nil || string(got) != string(before) {
			t.Fatalf("size %d: stall: read %q, %v", size, got, err)
		}
		start := time.Now()
		got, err = readAll(c, len(behind), size)
		if took := time.Since(start); err != nil || string(got) != string(behind) || took < 140*time.Millisecond {
			t.Fatalf("size %d: stall: behind %q, %v, after %v", size, got, err, took)
		}
		// A deadline ends the wait; the bytes still come after it.
		c.Arm(Fault{Kind: StallAfterReady, Delay: 200 * time.Millisecond})
		srv.Write(append(append([]byte{}, before...), behind...))
		readAll(c, len(before), size)
		c.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
		if _, err := c.Read(make([]byte, 10)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("size %d: stall past the deadline: %v", size, err)
		}
		c.SetReadDeadline(time.Time{})
		if got, err := readAll(c, len(behind), size); err != nil || string(got) != string(behind) {
			t.Fatalf("size %d: after the deadline: %q, %v", size, got, err)
		}
		if nw.Fired(StallAfterReady) != 2 || c.Armed() {
			t.Fatalf("size %d: fired %d, armed %v", size, nw.Fired(StallAfterReady), c.Armed())
		}
	}
}
