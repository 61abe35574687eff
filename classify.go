package pgryw

import (
	"sync"

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
// could not vouch for is listed in read_functions (and not in
// write_functions). Anything else stays on the writer.
func (c *Connector) readOnly(r *sqlclass.Result) bool {
	if r.Write || r.Pin {
		return false
	}
	for _, f := range r.Funcs {
		if c.writeFuncs[f] || !c.readFuncs[f] {
			return false
		}
	}
	return true
}

// mayCommitWrite reports whether a statement that ran on the writer, outside
// a transaction block once it is done, may have committed a change that later
// reads must see.
func (c *Connector) mayCommitWrite(r *sqlclass.Result) bool {
	switch r.Tx {
	case sqlclass.TxCommit:
		return true
	case sqlclass.TxBegin, sqlclass.TxRollback, sqlclass.TxSavepoint:
		return false
	}
	if r.Write {
		return true
	}
	// A statement that only changed the session (SET, LISTEN, PREPARE) commits
	// nothing another node could show; one that calls a function we cannot
	// vouch for might.
	for _, f := range r.Funcs {
		if c.writeFuncs[f] || !c.readFuncs[f] {
			return true
		}
	}
	return false
}
