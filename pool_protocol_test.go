package pgryw_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgryw/pgryw"
)

// pgx's front end on scripted servers (protocol_test.go's): what the Pool
// sends in one flush is what database/sql's front end sends.

// protoPool opens a Pool of one connection on pc's writer and replica.
func protoPool(t *testing.T, pc *protoCluster, extra string) *pgryw.Pool {
	t.Helper()
	dsn := fmt.Sprintf("host=%s port=%d user=app password=secret dbname=app sslmode=disable connect_timeout=2 replicas=%s pool_max_conns=1 %s",
		pc.writer.Host(), pc.writer.Port(), pc.replica.Addr(), extra)
	p, err := pgryw.NewPool(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// poolWarm reads once through p, so that the replica connection has the
// read prepared, as warmReplica does for database/sql.
func poolWarm(t *testing.T, p *pgryw.Pool) {
	t.Helper()
	var v string
	if err := p.QueryRow(context.Background(), protoRead, 7).Scan(&v); err != nil || v != "old" {
		t.Fatalf("warm-up read: %q, %v", v, err)
	}
}

// A write through the Pool carries its capture in its own flush; the read
// after it goes to the replica with its check in front, in one flush.
func TestProtocolPoolWriteThenRead(t *testing.T) {
	pc := newProtoCluster(t, "15.4", "")
	p := protoPool(t, pc, "")
	ctx := context.Background()
	poolWarm(t, p)
	wBefore := len(flushes(pc.writer, false))
	if _, err := p.Exec(ctx, protoInsert, 1); err != nil {
		t.Fatal(err)
	}
	wfs := flushes(pc.writer, false)[wBefore:]
	if len(wfs) == 0 || !slices.Contains(wfs[len(wfs)-1].msgs, "Parse pgryw_capture") || !slices.Contains(wfs[len(wfs)-1].msgs, "Bind "+protoInsert) {
		t.Fatalf("writer flushes %v; want the insert with the capture behind it, in one flush", wfs)
	}
	pc.r.replays(protoLSN)
	rBefore := len(flushes(pc.replica, false))
	var v string
	if err := p.QueryRow(ctx, protoRead, 7).Scan(&v); err != nil || v != "new" {
		t.Fatalf("read after the write: %q, %v", v, err)
	}
	rfs := flushes(pc.replica, false)[rBefore:]
	if want := cat(parseCheck, checkMsgs, readExec); len(rfs) != 1 || !reflect.DeepEqual(rfs[0].msgs, want) {
		t.Fatalf("replica flushes %v; want one %q", rfs, want)
	}
}

// A read-only batch after a write is one replica read: one check in front
// of it. When the replica is behind, the attempt is discarded and the
// batch sent again; the caller's callbacks run once, with the answer that
// stands.
func TestProtocolPoolBatchOneCheck(t *testing.T) {
	pc := newProtoCluster(t, "15.4", "")
	p := protoPool(t, pc, "")
	ctx := context.Background()
	poolWarm(t, p)
	if _, err := p.Exec(ctx, protoInsert, 1); err != nil {
		t.Fatal(err)
	}
	pc.r.replays(protoBehind, protoLSN)
	rBefore := len(flushes(pc.replica, false))
	var got []string
	b := &pgx.Batch{}
	for range 2 {
		b.Queue(protoRead, 7).QueryRow(func(r pgx.Row) error {
			var v string
			err := r.Scan(&v)
			got = append(got, v)
			return err
		})
	}
	if err := p.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, []string{"new", "new"}) {
		t.Fatalf("callbacks saw %q; want the answer that stood, once each", got)
	}
	rfs := flushes(pc.replica, false)[rBefore:]
	polls := 0
	for _, f := range rfs {
		for _, m := range f.msgs {
			if m == "Bind pgryw_check" {
				polls++
			}
		}
	}
	if polls != 2 {
		t.Errorf("%d checks for two attempts of one batch; flushes %v", polls, rfs)
	}
	if st := p.Stats(); st.ReplicaReads != 2 || st.Fallbacks != 0 {
		t.Errorf("stats %+v", st)
	}
}
