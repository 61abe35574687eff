package redisstore

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgryw/pgryw/internal/pgtest"
	"github.com/pgryw/pgryw/rywhttp"
)

// Two devices of one user, each talking to its own application instance
// (its own pgryw pool), share nothing but the user's key in Redis: the
// second device's GET sees the first device's POST, with the replicas 100 ms
// behind. Against a real primary, real streaming replicas and a real
// redis-server.
func TestIntegrationDevicesThroughRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: no servers")
	}
	if redisAddr == "" {
		t.Skip(skipReason)
	}
	ctx := context.Background()
	cl, err := pgtest.Start(ctx, pgtest.Options{Replicas: 1, ApplyDelay: 100 * time.Millisecond})
	if err != nil {
		if pgtest.Required() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	defer cl.Close()
	store, _ := newStore(t)
	open := func() *sql.DB {
		db, err := sql.Open("pgryw", cl.WriterDSN()+"&session_scope=conn&wait_timeout=2s&replicas="+strings.Join(cl.ReplicaAddrs(), ","))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	dbA, dbB := open(), open()
	if _, err := dbA.Exec("CREATE TABLE devices (id int PRIMARY KEY, v int)"); err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	user := func(r *http.Request) string { return r.Header.Get("X-User") }
	mw := func(h http.Handler) http.Handler {
		return rywhttp.Middleware(h, rywhttp.Store(store, user), rywhttp.NoCookie(), rywhttp.Header(false))
	}
	post := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := strconv.Atoi(r.URL.Query().Get("id"))
		if _, err := dbA.ExecContext(r.Context(), "INSERT INTO devices VALUES ($1, $2)", id, id); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
	defer post.Close()
	get := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := strconv.Atoi(r.URL.Query().Get("id"))
		var v int
		switch err := dbB.QueryRowContext(r.Context(), "SELECT v FROM devices WHERE id = $1", id).Scan(&v); {
		case err == sql.ErrNoRows:
			http.Error(w, "not found", http.StatusNotFound)
		case err != nil:
			http.Error(w, err.Error(), 500)
		default:
			fmt.Fprint(w, v)
		}
	})))
	defer get.Close()
	send := func(c *http.Client, method, url, u string) int {
		req, _ := http.NewRequest(method, url, nil)
		req.Header.Set("X-User", u)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	phone, laptop := &http.Client{}, &http.Client{}
	stale := 0
	const rounds = 30
	for id := 1; id <= rounds; id++ {
		u := "user" + strconv.Itoa(id%3)
		if code := send(phone, "POST", post.URL+"?id="+strconv.Itoa(id), u); code != http.StatusCreated {
			t.Fatalf("POST %d: %d", id, code)
		}
		switch code := send(laptop, "GET", get.URL+"?id="+strconv.Itoa(id), u); code {
		case http.StatusOK:
		case http.StatusNotFound:
			stale++
		default:
			t.Fatalf("GET %d: %d", id, code)
		}
	}
	if stale != 0 {
		t.Fatalf("%d of %d GETs on the second device missed the first device's row", stale, rounds)
	}
}
