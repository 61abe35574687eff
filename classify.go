package pgryw

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/pgryw/pgryw/internal/sqlclass"
)

// Classification is cached by SQL text: applications send the same few
// hundred statements over and over, and the cached path must not allocate.
// The cache is bounded by the bytes of SQL it holds; when full it starts
// over, which costs one re-classification per statement and nothing else.
const (
	classCacheMaxBytes = 8 << 20
	classCacheMaxSQL   = 16 << 10 // longer texts (bulk VALUES lists) are classified every time
	classEntryOverhead = 96       // map entry, Result and string header, roughly
)

type classCache struct {
	mu    sync.RWMutex
	m     map[string]sqlclass.Result
	bytes int
}

func (cc *classCache) get(q string) sqlclass.Result {
	cc.mu.RLock()
	r, ok := cc.m[q]
	cc.mu.RUnlock()
	if ok {
		return r
	}
	r = sqlclass.Classify(q)
	if len(q) <= classCacheMaxSQL {
		cc.put(q, r)
	}
	return r
}

func (cc *classCache) put(q string, r sqlclass.Result) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if _, ok := cc.m[q]; !ok {
		if cc.m == nil || cc.bytes+len(q)+classEntryOverhead > classCacheMaxBytes {
			cc.m = make(map[string]sqlclass.Result)
			cc.bytes = 0
		}
		cc.bytes += len(q) + classEntryOverhead
	}
	cc.m[q] = r
}

// learnWrite records that q turned out to write: a replica refused it with
// SQLSTATE 25006. It stays on the writer from then on.
func (cc *classCache) learnWrite(q string) {
	r := sqlclass.Classify(q)
	r.Write = true
	r.Reason = "refused by a replica (25006)"
	cc.put(q, r)
}

// readOnly reports whether a statement may run on a replica: the classifier
// found nothing that writes or changes the session, and every function it
// could not vouch for is listed in read_functions or known from the
// writer's catalog to be stable or immutable (and is not in
// write_functions). Anything else stays on the writer.
func (c *Connector) readOnly(r *sqlclass.Result) bool {
	// Transaction control opens or ends a block on the writer: database/sql
	// transactions do not come this way, so an Exec'd BEGIN is the caller
	// managing a block on this connection.
	if r.Write || r.Pin || r.Tx != sqlclass.TxNone {
		return false
	}
	for _, f := range r.Funcs {
		if !c.funcReadOnly(f) {
			return false
		}
	}
	return true
}

// mayWrite reports whether a statement that runs on the writer may change
// data that later reads must see once it commits: it writes, or it calls a
// function not known to be read-only. Transaction control and statements
// that only change the session (SET, LISTEN, PREPARE) do not.
func (c *Connector) mayWrite(r *sqlclass.Result) bool {
	if r.Write {
		return true
	}
	if r.Tx != sqlclass.TxNone {
		return false
	}
	for _, f := range r.Funcs {
		if c.writeFuncs[f] {
			return true
		}
		if c.readFuncs[f] {
			continue
		}
		if ro, ok := c.funcs.lookup(f); !ok || !ro {
			return true
		}
	}
	return false
}

// funcCatalog caches, per writer, whether functions the classifier could not
// vouch for are read-only: the writer's pg_proc is asked once per name, in
// the background, and a volatile function (any overload) counts as a write,
// as pgpool-II does. Until the answer is in, statements calling the
// function go to the writer.
type funcCatalog struct {
	mu      sync.RWMutex
	known   map[string]bool // name -> read-only
	pending map[string]bool
}

// sqlFuncVolatility is asked with the name as bind parameters, never
// spliced: bool_and is NULL when no function has that name (unknown stays a
// write), false when any overload is volatile.
const sqlFuncVolatility = `SELECT bool_and(p.provolatile <> 'v') FROM pg_catalog.pg_proc p
JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
WHERE p.proname = $1 AND ($2 = '' OR n.nspname = $2)`

func (fc *funcCatalog) lookup(name string) (readOnly, known bool) {
	fc.mu.RLock()
	readOnly, known = fc.known[name]
	fc.mu.RUnlock()
	return
}

// funcReadOnly reports whether f may run on a replica; an unknown name
// starts a catalog look-up and counts as a write for now.
func (c *Connector) funcReadOnly(f string) bool {
	if c.writeFuncs[f] {
		return false
	}
	if c.readFuncs[f] {
		return true
	}
	if ro, ok := c.funcs.lookup(f); ok {
		return ro
	}
	c.askCatalog(f)
	return false
}

func (c *Connector) askCatalog(f string) {
	if c.noCatalog {
		return
	}
	fc := &c.funcs
	fc.mu.Lock()
	if fc.pending[f] {
		fc.mu.Unlock()
		return
	}
	if fc.pending == nil {
		fc.pending = map[string]bool{}
		fc.known = map[string]bool{}
	}
	fc.pending[f] = true
	fc.mu.Unlock()
	go func() {
		ro, err := c.queryVolatility(f)
		fc.mu.Lock()
		defer fc.mu.Unlock()
		delete(fc.pending, f)
		if err == nil {
			fc.known[f] = ro
		}
	}()
}

// catalogTimeout bounds one background look-up.
const catalogTimeout = 10 * time.Second

func (c *Connector) queryVolatility(f string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), catalogTimeout)
	defer cancel()
	dc, err := c.dial(ctx, c.topo.writer)
	if err != nil {
		return false, err
	}
	b := newBackend(dc, c.topo.writer)
	defer b.close()
	if b.pg == nil {
		return false, errors.New("pgryw: catalog look-up needs a pgx connection")
	}
	schema, name := "", f
	if i := strings.LastIndexByte(f, '.'); i >= 0 {
		schema, name = f[:i], f[i+1:]
	}
	res := b.pg.ExecParams(ctx, sqlFuncVolatility, [][]byte{[]byte(name), []byte(schema)}, nil, nil, nil).Read()
	if res.Err != nil {
		return false, res.Err
	}
	if len(res.Rows) != 1 {
		return false, errors.New("pgryw: catalog look-up returned no row")
	}
	return string(res.Rows[0][0]) == "t", nil
}
