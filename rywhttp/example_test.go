package rywhttp_test

import (
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"

	"github.com/pgryw/pgryw/rywhttp"
)

func ExampleMiddleware() {
	db, err := sql.Open("pgryw", "postgres://app@primary/app?replicas=replica1,replica2")
	if err != nil {
		panic(err)
	}
	defer db.Close()

	mux := http.NewServeMux()
	mux.HandleFunc("POST /notes", func(w http.ResponseWriter, r *http.Request) {
		// r.Context() carries the request's Session: the commit advances it,
		// and the middleware sends its token back (header and cookie).
		if _, err := db.ExecContext(r.Context(), "INSERT INTO notes (body) VALUES ($1)", r.FormValue("body")); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	mux.HandleFunc("GET /notes", func(w http.ResponseWriter, r *http.Request) {
		// A replica read waits until the replica has the client's writes.
		rows, err := db.QueryContext(r.Context(), "SELECT body FROM notes")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer rows.Close()
		// ...
	})

	key := []byte(os.Getenv("PGRYW_TOKEN_KEY")) // 32 random bytes, shared by all servers
	var stats rywhttp.Stats
	opts := []rywhttp.Option{rywhttp.Counters(&stats)}
	if len(key) > 0 {
		opts = append(opts, rywhttp.Keys(key))
	}
	// The same session across a user's devices, through a shared store.
	opts = append(opts, rywhttp.Store(rywhttp.NewMemoryTokenStore(), func(r *http.Request) string {
		return r.Header.Get("X-User-Id") // the authenticated user, "" for none
	}))
	handler := rywhttp.Middleware(mux, opts...)

	// A request that writes nothing gets no token back.
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest("GET", "/nothing", nil))
	fmt.Println(rec.Code, rec.Header().Get(rywhttp.TokenHeader) == "")
	// Output: 404 true
}
