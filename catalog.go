package pgryw

import (
	"context"
	"database/sql/driver"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/pgryw/pgryw/internal/sqlclass"
)

// funcCatalog caches, per primary, whether functions the classifier could not
// vouch for are read-only: the primary's pg_proc is asked once per name, in
// the background, and a volatile function (any overload) counts as a write,
// as pgpool-II does. Until the answer is in, statements calling the
// function go to the primary.
//
// One worker goroutine per connector asks: it starts with the first unknown
// name, holds at most one primary connection, takes every pending name each
// turn and asks for all of them in one query. It closes its connection and
// ends after catalogIdle without work, and at Connector.Close. At most
// catalogMaxPending names wait; more are not asked now and stay writes. A
// turn that fails (the primary is down) makes the worker, and each name it
// asked about, wait a backoff that doubles from catalogBackoffMin to
// catalogBackoffMax, so a down primary is not hammered.
type funcCatalog struct {
	mu      sync.RWMutex
	known   map[string]funcInfo  // name -> what the catalog says
	queued  map[string]bool      // pending or being asked
	pending []string             // waiting for the worker's next turn
	retry   map[string]time.Time // failed names: not asked again before then

	failures  int       // consecutive failed turns
	notBefore time.Time // the worker's next turn waits until then

	idle time.Duration // 0: catalogIdle; tests shorten it
	// backoffMin: the first backoff after a failed turn (0:
	// catalogBackoffMin); tests shorten it.
	backoffMin time.Duration
	turn       chan struct{} // closed (and replaced) at the end of each turn
	running    bool          // a worker goroutine is running
	closed     bool          // Connector.Close: no worker starts any more
	wake       chan struct{}
	cancel     context.CancelFunc // the running worker's
	wg         sync.WaitGroup
}

const (
	// catalogMaxPending bounds the names waiting for a look-up.
	catalogMaxPending = 1024
	// catalogMaxRetry bounds the failed names remembered for their backoff.
	catalogMaxRetry = 4 * catalogMaxPending
	// catalogIdle is how long the worker keeps its connection without work.
	catalogIdle = 30 * time.Second
	// catalogTimeout bounds one turn: connecting and the query.
	catalogTimeout = 10 * time.Second
	// Backoff after a failed turn: doubles from min to max.
	catalogBackoffMin = time.Second
	catalogBackoffMax = 30 * time.Second
)

// sqlFuncVolatility asks about a batch of names, passed as two text[] bind
// parameters (schema, empty when unqualified; name), never spliced. Per name,
// bool_and is NULL when no function has that name (unknown stays a write),
// false when any overload is volatile. An unqualified name matches every
// schema. The casts to name truncate as identifiers in SQL are truncated.
//
// With it comes the code of every overload written in SQL or PL/pgSQL (the
// languages whose text tells something), for sqlclass.BodyEffects: what
// calling the function may do to the session.
const sqlFuncVolatility = `SELECT q.i, pg_catalog.bool_and(p.provolatile <> 'v'),
  pg_catalog.string_agg(CASE WHEN l.lanname IN ('sql', 'plpgsql') THEN p.prosrc END, E'\n')
FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.text[])) WITH ORDINALITY AS q(nsp, name, i)
LEFT JOIN (pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
  JOIN pg_catalog.pg_language l ON l.oid = p.prolang)
  ON p.proname = q.name::pg_catalog.name AND (q.nsp = '' OR n.nspname = q.nsp::pg_catalog.name)
GROUP BY q.i`

// funcInfo is what the catalog says of a function name.
type funcInfo struct {
	readOnly bool           // every overload is stable or immutable
	state    sqlclass.State // what its code may do to the session (BodyEffects)
	settings []string       // run-time parameters it sets by name
}

func (fc *funcCatalog) lookup(name string) (readOnly, known bool) {
	fc.mu.RLock()
	fi, known := fc.known[name]
	fc.mu.RUnlock()
	return fi.readOnly, known
}

// effects returns what calling name may do to the session, as far as the
// catalog has said.
func (fc *funcCatalog) effects(name string) (sqlclass.State, []string) {
	fc.mu.RLock()
	fi := fc.known[name]
	fc.mu.RUnlock()
	return fi.state, fi.settings
}

// catalogWait bounds how long a statement waits for the catalog to answer
// about the functions it calls.
const catalogWait = 2 * time.Second

// awaitFuncs waits, within ctx and catalogWait, until the catalog has
// answered about every function r calls (or failed to): what a function
// does to the session must be known before the first call runs, or the
// settings it makes would not reach the replicas. It returns at once when
// everything is known, which is every call but the first few.
func (c *Connector) awaitFuncs(ctx context.Context, r *sqlclass.Result) {
	if len(r.Funcs) == 0 {
		return
	}
	fc := &c.funcs
	var deadline <-chan time.Time
	for {
		// The common case, everything known, takes the shared lock only:
		// every statement calling a function of the pool passes here.
		fc.mu.RLock()
		pending := c.funcsPending(r)
		fc.mu.RUnlock()
		if !pending {
			return
		}
		fc.mu.Lock()
		if !c.funcsPending(r) {
			fc.mu.Unlock()
			return
		}
		if fc.turn == nil {
			fc.turn = make(chan struct{})
		}
		turn := fc.turn
		fc.mu.Unlock()
		if deadline == nil {
			t := time.NewTimer(catalogWait)
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-turn:
		case <-ctx.Done():
			return
		case <-deadline:
			return
		}
	}
}

// funcsPending reports that the catalog has yet to answer about a function
// r calls (not while it backs off: the primary did not answer, and a
// statement is not made to wait on it). Call it with c.funcs.mu held.
func (c *Connector) funcsPending(r *sqlclass.Result) bool {
	fc := &c.funcs
	if !fc.notBefore.IsZero() && time.Now().Before(fc.notBefore) {
		return false
	}
	for _, f := range r.Funcs {
		if _, ok := fc.known[f]; !ok && fc.queued[f] && !c.forcedRead(f) && !c.forcedWrite(f) {
			return true
		}
	}
	return false
}

// funcReadOnly reports whether f may run on a replica; an unknown name
// queues a catalog look-up and counts as a write for now. It never blocks
// on the look-up.
func (c *Connector) funcReadOnly(f string) bool {
	if c.forcedWrite(f) {
		return false
	}
	if c.forcedRead(f) {
		return true
	}
	if ro, ok := c.funcs.lookup(f); ok {
		return ro
	}
	c.askCatalog(f)
	return false
}

// askCatalog queues f for the catalog worker, starting the worker if it is
// not running. Names already queued, in their failure backoff, or beyond
// the pending bound are left alone.
func (c *Connector) askCatalog(f string) {
	fc := &c.funcs
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if fc.closed || fc.queued[f] {
		return
	}
	if _, ok := fc.known[f]; ok {
		return
	}
	if until, ok := fc.retry[f]; ok {
		if time.Now().Before(until) {
			return
		}
		delete(fc.retry, f)
	}
	if len(fc.pending) >= catalogMaxPending {
		return
	}
	if fc.known == nil {
		fc.known = map[string]funcInfo{}
		fc.queued = map[string]bool{}
		fc.retry = map[string]time.Time{}
		fc.wake = make(chan struct{}, 1)
	}
	if !utf8.ValidString(f) || strings.IndexByte(f, 0) >= 0 {
		// No catalog of a UTF-8 database has it, and the server would
		// refuse the whole batch over it.
		fc.known[f] = funcInfo{}
		return
	}
	fc.queued[f] = true
	fc.pending = append(fc.pending, f)
	if !fc.running {
		ctx, cancel := context.WithCancel(context.Background())
		fc.running, fc.cancel = true, cancel
		fc.wg.Add(1)
		go c.runCatalog(ctx, cancel)
	}
	select {
	case fc.wake <- struct{}{}:
	default:
	}
}

// stopCatalog stops the catalog worker for good and waits for it to end,
// closing its connection.
func (c *Connector) stopCatalog() {
	fc := &c.funcs
	fc.mu.Lock()
	fc.closed = true
	cancel := fc.cancel
	fc.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	fc.wg.Wait()
}

// runCatalog is the catalog worker: each turn it takes every pending name
// and asks the primary about them in one query, over the one connection it
// keeps. It ends when idle for catalogIdle or when ctx is cancelled.
func (c *Connector) runCatalog(ctx context.Context, cancel context.CancelFunc) {
	fc := &c.funcs
	var b *backend
	defer func() {
		if b != nil {
			b.close()
		}
		cancel()
		fc.wg.Done()
	}()
	idleFor := catalogIdle
	if fc.idle > 0 {
		idleFor = fc.idle
	}
	idle := time.NewTimer(idleFor)
	defer idle.Stop()
	backoff := time.NewTimer(catalogIdle)
	backoff.Stop()
	defer backoff.Stop()
	idleSince := time.Now()
	for {
		names, wait, what := fc.turnNow(ctx, b != nil, idleFor, idleSince)
		switch what {
		case turnStop:
			return
		case turnAsk:
			b = c.askBatch(ctx, b, names)
			idleSince = time.Now()
			idle.Reset(idleFor)
			continue
		}
		var retry <-chan time.Time
		if len(names) > 0 {
			backoff.Reset(wait)
			retry = backoff.C
		}
		select {
		case <-ctx.Done():
		case <-fc.wake:
		case <-retry:
		case <-idle.C:
			// Idle: let the primary have its connection back. With names
			// waiting out a backoff, the worker stays for them.
			if b != nil {
				b.close()
				b = nil
			}
			idle.Reset(idleFor)
		}
	}
}

// What the catalog worker does next (funcCatalog.turnNow).
const (
	turnSleep = iota // wait for a name, the backoff's end, or idleness
	turnAsk          // ask about the names now
	turnStop         // end: cancelled, or idle with no connection
)

// turnNow decides the worker's next step, taking the pending names when it
// asks. connected: the worker holds a connection; it ends when idle only
// without one (the idle branch closes it first), so a worker started after
// it never overlaps it.
func (fc *funcCatalog) turnNow(ctx context.Context, connected bool, idleFor time.Duration, idleSince time.Time) (names []string, wait time.Duration, what int) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	names, wait = fc.pending, time.Until(fc.notBefore)
	switch {
	case ctx.Err() != nil, len(names) == 0 && !connected && time.Since(idleSince) >= idleFor:
		fc.running = false
		return nil, 0, turnStop
	case len(names) > 0 && wait <= 0:
		fc.pending = nil
		return names, 0, turnAsk
	}
	return names, wait, turnSleep
}

// askBatch asks the primary about names over b, connecting first when there
// is no usable connection, records the answers or the failure, and returns
// the connection to keep for the next turn (nil for none).
func (c *Connector) askBatch(ctx context.Context, b *backend, names []string) *backend {
	qctx, cancel := context.WithTimeout(ctx, catalogTimeout)
	defer cancel()
	if b != nil && b.closed() {
		b.close()
		b = nil
	}
	var (
		ro  []funcInfo
		err error
	)
	if b == nil {
		var dc driver.Conn
		if dc, err = c.dial(qctx, c.topo.primary, forCatalog); err == nil {
			b = newBackend(dc, c.topo.primary)
		}
	}
	if err == nil {
		ro, err = queryVolatility(qctx, b, names)
		if err != nil && b.closed() {
			b.close()
			b = nil
		}
	}
	c.funcs.answered(names, ro, err, ctx.Err() != nil)
	return b
}

// answered records a turn's outcome: each name's answer, or on failure a
// backoff before the worker, and each of these names, try again.
func (fc *funcCatalog) answered(names []string, ro []funcInfo, err error, stopping bool) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if fc.turn != nil {
		close(fc.turn)
		fc.turn = nil
	}
	for _, f := range names {
		delete(fc.queued, f)
	}
	if stopping {
		return
	}
	if err == nil {
		fc.failures = 0
		fc.notBefore = time.Time{}
		for i, f := range names {
			fc.known[f] = ro[i]
		}
		return
	}
	fc.failures++
	first := catalogBackoffMin
	if fc.backoffMin > 0 {
		first = fc.backoffMin
	}
	d := catalogBackoffMax
	if fc.failures <= 5 && first<<(fc.failures-1) < d {
		d = first << (fc.failures - 1)
	}
	fc.notBefore = time.Now().Add(d)
	if len(fc.retry)+len(names) > catalogMaxRetry {
		now := time.Now()
		for f, until := range fc.retry {
			if !now.Before(until) {
				delete(fc.retry, f)
			}
		}
	}
	for _, f := range names {
		if len(fc.retry) >= catalogMaxRetry {
			break // the worker's own backoff still spares the primary
		}
		fc.retry[f] = fc.notBefore
	}
}

// queryVolatility asks the primary over b whether each of names is
// read-only, and what its code may do to the session, in one query; ro[i]
// answers names[i].
func queryVolatility(ctx context.Context, b *backend, names []string) ([]funcInfo, error) {
	schemas, bare := make([]string, len(names)), make([]string, len(names))
	for i, f := range names {
		bare[i] = f
		if j := strings.LastIndexByte(f, '.'); j >= 0 {
			schemas[i], bare[i] = f[:j], f[j+1:]
		}
	}
	types := pgtype.NewMap() // not safe for concurrent use; one per turn is cheap
	p1, err := types.Encode(pgtype.TextArrayOID, pgtype.BinaryFormatCode, schemas, nil)
	if err != nil {
		return nil, fmt.Errorf("pgryw: catalog look-up: encoding schema names: %w", err)
	}
	p2, err := types.Encode(pgtype.TextArrayOID, pgtype.BinaryFormatCode, bare, nil)
	if err != nil {
		return nil, fmt.Errorf("pgryw: catalog look-up: encoding function names: %w", err)
	}
	res := b.pg.ExecParams(ctx, sqlFuncVolatility, [][]byte{p1, p2},
		[]uint32{pgtype.TextArrayOID, pgtype.TextArrayOID},
		[]int16{pgtype.BinaryFormatCode, pgtype.BinaryFormatCode}, nil).Read()
	if res.Err != nil {
		return nil, res.Err
	}
	if len(res.Rows) != len(names) {
		return nil, fmt.Errorf("pgryw: catalog look-up returned %d rows for %d names", len(res.Rows), len(names))
	}
	ro := make([]funcInfo, len(names))
	for _, row := range res.Rows {
		if len(row) != 3 {
			return nil, fmt.Errorf("pgryw: catalog look-up returned %d columns", len(row))
		}
		i, err := strconv.Atoi(string(row[0]))
		if err != nil || i < 1 || i > len(names) {
			return nil, fmt.Errorf("pgryw: catalog look-up returned row number %q for %d names", row[0], len(names))
		}
		st, settings := sqlclass.BodyEffects(string(row[2]))
		ro[i-1] = funcInfo{readOnly: string(row[1]) == "t", state: st, settings: settings}
	}
	return ro, nil
}
