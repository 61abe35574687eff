package pgryw_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgryw/pgryw"
	"github.com/pgryw/pgryw/internal/pgfake"
)

// A read that begins while its connection's own capture is on its way
// starts with a watermark that leaves that write out, and its first try's
// check is compared with the whole one once the capture arrives. When that
// first try cannot check at all (a replica behind a transaction pooler
// that takes no chained check: the read goes elsewhere), the read must
// not go on to the next replica with the partial watermark: there it was
// served from a standby that had replayed the first write and not the
// second. The capture on its way: one riding behind the write whose
// answer is late (capture=always), or one sent as the read starts for a
// write that went without (capture=auto in a run of writes, on_read).
func TestProtocolPartialWatermarkStaysPartialNowhere(t *testing.T) {
	for _, capture := range []string{"always", "auto", "on_read"} {
		t.Run(capture, func(t *testing.T) {
			t.Parallel()
			pw := &protoWriter{lsn: protoBehind, value: "writer"}
			writer := fakeServer(t, pgfake.Config{ServerVersion: "15.4", InHotStandby: "off", Handler: pw.handle})
			pooled := &protoReplica{replay: protoLSN, status: "success"}
			sa := fakeServer(t, pgfake.Config{ServerVersion: "15.4", InHotStandby: "on", Handler: pooled.handle, Pooled: true})
			direct := &protoReplica{replay: protoStart, status: "success"}
			sb := fakeServer(t, pgfake.Config{ServerVersion: "15.4", InHotStandby: "on", Handler: direct.handle})
			db, c := openDSN(t, fmt.Sprintf("host=%s port=%d user=app password=secret dbname=app sslmode=disable connect_timeout=2 wait_timeout=2s capture=%s replicas=%s,%s",
				writer.Host(), writer.Port(), capture, sa.Addr(), sb.Addr()))
			db.SetMaxOpenConns(1)
			ctx := context.Background()
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			var marked int
			for dl := time.Now().Add(3 * time.Second); time.Now().Before(dl); time.Sleep(5 * time.Millisecond) { // until both replicas are connected
				var v string
				if err := conn.QueryRowContext(ctx, protoRead, 7).Scan(&v); err != nil {
					t.Fatal(err)
				}
				conn.Raw(func(dc any) error { marked = pgryw.SetNoChain(dc.(*pgryw.Conn)); return nil })
				if marked == 1 && len(sb.Conns()) > 0 {
					break
				}
			}
			if marked != 1 || len(sb.Conns()) == 0 {
				t.Fatalf("replica connections: pooled %d (marked %d), direct %d", len(sa.Conns()), marked, len(sb.Conns()))
			}
			// The first write's position is 0/2FFFF00, which the direct
			// standby replays as the read comes; the second's is
			// 0/3000100, which only the pooled one is known to have: the
			// read tries it first, and cannot check there.
			if _, err := conn.ExecContext(ctx, protoInsert, 1); err != nil {
				t.Fatal(err)
			}
			pw.mu.Lock()
			pw.lsn = protoLSN
			pw.holdCapture, pw.release = true, make(chan struct{})
			pw.mu.Unlock()
			if _, err := conn.ExecContext(ctx, protoInsert, 2); err != nil {
				t.Fatal(err)
			}
			pgryw.Observe(c, 0, protoLSN)
			direct.replays(protoBehind, protoLSN)
			time.AfterFunc(30*time.Millisecond, func() { close(pw.release) })
			var v string
			var sbv pgryw.ServedBy
			if err := conn.QueryRowContext(pgryw.WithServedBy(ctx, func(_ context.Context, s pgryw.ServedBy) { sbv = s }), protoRead, 7).Scan(&v); err != nil {
				t.Fatal(err)
			}
			t.Logf("served %+v; direct %s pooled %s", sbv, sb.Addr(), sa.Addr())
			if v != "new" {
				t.Fatalf("the read after the second write returned %q: served against the first write's position", v)
			}
		})
	}
}

// capture=auto: a Session's token asks for a watermark as a read does, so
// a loop of a write and its token keeps each write's capture: the token
// reads it from there, and opens no connection of its own to read one.
func TestProtocolWriteThenTokenKeepsCapture(t *testing.T) {
	t.Parallel()
	pc := newProtoCluster(t, "15.4", "")
	s := pgryw.NewSession()
	ctx := pgryw.WithSession(context.Background(), s)
	if _, err := pc.db.ExecContext(ctx, protoInsert, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TokenContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := len(pc.writer.Conns())
	for range 10 {
		if _, err := pc.db.ExecContext(ctx, protoInsert, 1); err != nil {
			t.Fatal(err)
		}
		if _, err := s.TokenContext(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(pc.writer.Conns()) - before; n != 0 {
		t.Fatalf("10 tokens after writes opened %d connections to the writer, want 0", n)
	}
}
