package pgryw_test

import (
	"database/sql"
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgryw/pgryw/rywhttp"
)

// rowServers starts two HTTP servers, each with its own pool: POST /?id=N
// on the writer inserts row N, GET /?id=N on the reader answers 200 if it
// sees row N and 404 if not. wrap (nil: none) wraps both handlers.
func rowServers(t *testing.T, table string, wrap func(http.Handler) http.Handler) (writer, reader *httptest.Server) {
	t.Helper()
	dbA, _ := openDB(t, "session_scope=conn&wait_timeout=2s")
	dbB, _ := openDB(t, "session_scope=conn&wait_timeout=2s")
	if wrap == nil {
		wrap = func(h http.Handler) http.Handler { return h }
	}
	writer = httptest.NewServer(wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := strconv.Atoi(r.URL.Query().Get("id"))
		if _, err := dbA.ExecContext(r.Context(), "INSERT INTO "+table+" VALUES ($1, $2)", id, id); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
	reader = httptest.NewServer(wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := strconv.Atoi(r.URL.Query().Get("id"))
		var v int
		err := dbB.QueryRowContext(r.Context(), "SELECT v FROM "+table+" WHERE id = $1", id).Scan(&v)
		switch {
		case err == sql.ErrNoRows:
			http.Error(w, "not found", http.StatusNotFound)
		case err != nil:
			http.Error(w, err.Error(), 500)
		default:
			fmt.Fprint(w, v)
		}
	})))
	t.Cleanup(writer.Close)
	t.Cleanup(reader.Close)
	return writer, reader
}

// do sends a request and returns the response (body drained and closed).
func do(t *testing.T, c *http.Client, method, url string, hdr http.Header) (*http.Response, error) {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		return nil, err
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	return resp, nil
}

// roundTrips runs n POST-then-GET pairs, 5 at a time; post and get send one
// request each for row id and report the status codes. It returns how many
// GETs missed their row.
func roundTrips(t *testing.T, n int, pair func(id int) (postCode, getCode int, err error)) int64 {
	t.Helper()
	const workers = 5
	var stale atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := w + 1; id <= n; id += workers {
				pc, gc, err := pair(id)
				switch {
				case err != nil:
					t.Error(err)
					return
				case pc != http.StatusCreated:
					t.Errorf("POST %d: %d", id, pc)
					return
				case gc == http.StatusNotFound:
					stale.Add(1)
				case gc != http.StatusOK:
					t.Errorf("GET %d: %d", id, gc)
					return
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return stale.Load()
}

const middlewareRounds = 50

// The Pgryw-Token header of a POST's response, sent with a GET to another
// server (its own pool), makes the GET see the POST's row.
func TestIntegrationMiddlewareHeader(t *testing.T) {
	table := newTable(t)
	setDelay(t, 100*time.Millisecond)
	var st rywhttp.Stats
	a, b := rowServers(t, table, func(h http.Handler) http.Handler {
		return rywhttp.Middleware(h, rywhttp.Counters(&st))
	})
	c := &http.Client{} // no jar: only the header carries the token
	stale := roundTrips(t, middlewareRounds, func(id int) (int, int, error) {
		p, err := do(t, c, "POST", a.URL+"?id="+strconv.Itoa(id), nil)
		if err != nil {
			return 0, 0, err
		}
		tok := p.Header.Get(rywhttp.TokenHeader)
		if tok == "" {
			return 0, 0, fmt.Errorf("POST %d: no %s header", id, rywhttp.TokenHeader)
		}
		g, err := do(t, c, "GET", b.URL+"?id="+strconv.Itoa(id), http.Header{rywhttp.TokenHeader: {tok}})
		if err != nil {
			return 0, 0, err
		}
		if g.Header.Get(rywhttp.TokenHeader) != "" {
			return 0, 0, fmt.Errorf("GET %d: a read sent a token back", id)
		}
		return p.StatusCode, g.StatusCode, nil
	})
	t.Logf("%d round trips, %d stale; middleware: sent %d, observed %d, rejected %d",
		middlewareRounds, stale, st.TokensSent.Load(), st.TokensObserved.Load(), st.TokensRejected.Load())
	if stale != 0 {
		t.Fatalf("%d of %d GETs with the POST's token missed its row", stale, middlewareRounds)
	}
	if st.TokensSent.Load() != middlewareRounds || st.TokensObserved.Load() != middlewareRounds {
		t.Fatalf("sent %d, observed %d, want %d each", st.TokensSent.Load(), st.TokensObserved.Load(), middlewareRounds)
	}
}

// The same with the cookie alone: a browser-like client with a cookie jar.
func TestIntegrationMiddlewareCookie(t *testing.T) {
	table := newTable(t)
	setDelay(t, 100*time.Millisecond)
	a, b := rowServers(t, table, func(h http.Handler) http.Handler {
		// httptest serves plain HTTP: a Secure cookie would not come back.
		return rywhttp.Middleware(h, rywhttp.Header(false), rywhttp.CookieSecure(false))
	})
	stale := roundTrips(t, middlewareRounds, func(id int) (int, int, error) {
		jar, _ := cookiejar.New(nil)
		c := &http.Client{Jar: jar} // one browser per round trip
		p, err := do(t, c, "POST", a.URL+"?id="+strconv.Itoa(id), nil)
		if err != nil {
			return 0, 0, err
		}
		if p.Header.Get(rywhttp.TokenHeader) != "" || len(p.Cookies()) != 1 {
			return 0, 0, fmt.Errorf("POST %d: header %q, cookies %v", id, p.Header.Get(rywhttp.TokenHeader), p.Cookies())
		}
		g, err := do(t, c, "GET", b.URL+"?id="+strconv.Itoa(id), nil)
		if err != nil {
			return 0, 0, err
		}
		return p.StatusCode, g.StatusCode, nil
	})
	if stale != 0 {
		t.Fatalf("%d of %d GETs with the POST's cookie missed its row", stale, middlewareRounds)
	}
}

// Two devices of one user share nothing but the user's key in a TokenStore:
// the second device's GET sees the first device's POST.
func TestIntegrationMiddlewareStoreDevices(t *testing.T) {
	table := newTable(t)
	setDelay(t, 100*time.Millisecond)
	store := rywhttp.NewMemoryTokenStore() // shared by both servers, as Redis would be
	user := func(r *http.Request) string { return r.Header.Get("X-User") }
	var st rywhttp.Stats
	a, b := rowServers(t, table, func(h http.Handler) http.Handler {
		return rywhttp.Middleware(h, rywhttp.Store(store, user), rywhttp.NoCookie(), rywhttp.Counters(&st))
	})
	phone, laptop := &http.Client{}, &http.Client{}
	stale := roundTrips(t, middlewareRounds, func(id int) (int, int, error) {
		u := http.Header{"X-User": {"user" + strconv.Itoa(id)}}
		p, err := do(t, phone, "POST", a.URL+"?id="+strconv.Itoa(id), u)
		if err != nil {
			return 0, 0, err
		}
		g, err := do(t, laptop, "GET", b.URL+"?id="+strconv.Itoa(id), u)
		if err != nil {
			return 0, 0, err
		}
		return p.StatusCode, g.StatusCode, nil
	})
	if stale != 0 {
		t.Fatalf("%d of %d GETs from the second device missed the first device's row", stale, middlewareRounds)
	}
	if st.StoreErrors.Load() != 0 || st.TokensObserved.Load() != middlewareRounds {
		t.Fatalf("store errors %d, observed %d", st.StoreErrors.Load(), st.TokensObserved.Load())
	}
}

// The control: without the middleware the same GETs are stale.
func TestIntegrationMiddlewareControl(t *testing.T) {
	table := newTable(t)
	setDelay(t, 100*time.Millisecond)
	a, b := rowServers(t, table, nil)
	c := &http.Client{}
	stale := roundTrips(t, middlewareRounds, func(id int) (int, int, error) {
		p, err := do(t, c, "POST", a.URL+"?id="+strconv.Itoa(id), nil)
		if err != nil {
			return 0, 0, err
		}
		g, err := do(t, c, "GET", b.URL+"?id="+strconv.Itoa(id), nil)
		if err != nil {
			return 0, 0, err
		}
		return p.StatusCode, g.StatusCode, nil
	})
	t.Logf("without the middleware: %d of %d GETs stale", stale, middlewareRounds)
	if stale == 0 {
		t.Fatal("without the middleware no GET was stale: the test cannot tell")
	}
}
