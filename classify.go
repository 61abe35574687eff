package pgryw

import (
	"context"
	"strings"
	"sync"

	"slices"

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

// classifyOp classifies the statement op runs: a batch of pgx's as one.
func (c *Connector) classifyOp(ctx context.Context, op *stmtOp) sqlclass.Result {
	if op.kind == opPgxBatch {
		return c.classifyBatch(ctx, op.batch)
	}
	return c.classify(ctx, op.query)
}

// learnWrite records that q turned out to write: a replica refused it with
// SQLSTATE 25006. It stays on the primary from then on.
func (cc *classCache) learnWrite(q string) {
	r := sqlclass.Classify(q)
	r.Write = true
	r.Reason = "refused by a replica (25006)"
	cc.put(q, r)
}

// learnPrimary records that q, a read, is one a standby refuses although
// the primary serves it (SQLSTATE code: an unlogged table, a WAL function
// during recovery): it is answered by the primary from then on, like a
// node-local read.
func (cc *classCache) learnPrimary(q, code string) {
	r := sqlclass.Classify(q)
	r.Node = true
	r.NodeReason = "refused by a replica (" + code + ")"
	cc.put(q, r)
}

// readOnly reports whether a statement may run on a replica: the classifier
// found nothing that writes or changes the session, and every function it
// could not vouch for is listed in read_functions or known from the
// primary's catalog to be stable or immutable (and is not in
// write_functions). Anything else stays on the primary.
func (c *Connector) readOnly(r *sqlclass.Result) bool {
	// Transaction control opens or ends a block on the primary: database/sql
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

// callsVolatile reports whether a statement calls a function of the
// database's that is not known to be read-only (write_functions names it,
// or the catalog does not say it is stable or immutable): what it does
// may go beyond what its code shows (sqlclass.BodyEffects).
func (c *Connector) callsVolatile(r *sqlclass.Result) bool {
	for _, f := range r.Funcs {
		if c.forcedWrite(f) {
			return true
		}
		if c.forcedRead(f) {
			continue
		}
		if ro, ok := c.funcs.lookup(f); !ok || !ro {
			return true
		}
	}
	return false
}

// mayWrite reports whether a statement that runs on the primary may change
// data that later reads must see once it commits: it writes, or it calls a
// function not known to be read-only. Transaction control and statements
// that only change the session (SET, LISTEN, PREPARE) do not.
func (c *Connector) mayWrite(r *sqlclass.Result) bool {
	if r.Write {
		return true
	}
	return r.Tx == sqlclass.TxNone && c.callsVolatile(r)
}

// funcOverrides are write_functions and read_functions, as the classifier
// names functions (sqlclass.Result.Funcs: lower-cased unless quoted,
// qualified as written).
type funcOverrides struct {
	write     map[string]bool // bare names: whatever schema a call names, or none
	read      map[string]bool // as listed
	readBare  map[string]bool // unqualified entries: in any schema
	anyWrites bool
}

func newFuncOverrides(write, read []string) funcOverrides {
	o := funcOverrides{write: map[string]bool{}, read: map[string]bool{}, readBare: map[string]bool{}}
	for _, f := range write {
		o.write[bareName(f)] = true
		o.anyWrites = true
	}
	for _, f := range read {
		o.read[f] = true
		if bareName(f) == f {
			o.readBare[f] = true
		}
	}
	return o
}

// bareName is a function name without its schema.
func bareName(f string) string {
	if i := strings.LastIndexByte(f, '.'); i >= 0 {
		return f[i+1:]
	}
	return f
}

// forcedWrite reports a function write_functions names. A listed name
// matches however a call writes it: unqualified or in any schema (a
// session's search_path may resolve an unqualified call to any schema's
// function of that name), so an override cannot be bypassed by
// qualifying the call.
func (c *Connector) forcedWrite(f string) bool {
	return c.overrides.anyWrites && c.overrides.write[bareName(f)]
}

// forcedRead reports a function read_functions names (and write_functions
// does not): an entry with a schema matches calls that name it, one
// without matches the name in any schema.
func (c *Connector) forcedRead(f string) bool {
	if len(c.overrides.read) == 0 || c.forcedWrite(f) {
		return false
	}
	return c.overrides.read[f] || c.overrides.readBare[bareName(f)]
}

// classify is the classification of query with what the catalog knows of
// the functions it calls (see awaitFuncs, withFuncEffects).
func (c *Connector) classify(ctx context.Context, query string) sqlclass.Result {
	r := c.classes.get(query)
	if len(r.Funcs) == 0 {
		return r
	}
	for _, f := range r.Funcs {
		c.funcReadOnly(f) // asks the catalog about names it has not seen
	}
	c.awaitFuncs(ctx, &r)
	c.withFuncEffects(&r)
	return r
}

// withFuncEffects adds to r what the functions it calls may do to the
// session, from the catalog and write_functions/read_functions: such a
// statement touches session state (it runs on the primary, and the
// state is read back behind it), as if the code were written in it.
func (c *Connector) withFuncEffects(r *sqlclass.Result) {
	if len(r.Funcs) == 0 {
		return
	}
	var st sqlclass.State
	var names []string
	for _, f := range r.Funcs {
		if c.forcedRead(f) {
			continue
		}
		fst, fnames := c.funcs.effects(f)
		st |= fst
		for _, n := range fnames {
			if !slices.Contains(names, n) && !slices.Contains(r.Settings, n) {
				names = append(names, n)
			}
		}
	}
	if st == 0 {
		return
	}
	r.Pin = true
	r.State |= st
	if len(names) > 0 {
		r.Settings = slices.Concat(r.Settings, names)
	}
	if r.Reason == "SELECT" {
		r.Reason = "a function that changes the session"
	}
}
