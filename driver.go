package pgryw

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pgryw/pgryw/internal/wire"
)

// DriverName is the name pgryw registers with database/sql.
const DriverName = "pgryw"

func init() {
	// Another copy of this package (a vendored fork, say) may have taken the
	// name; sql.Register would panic, and a blank import must never do that.
	if !slices.Contains(sql.Drivers(), DriverName) {
		sql.Register(DriverName, &Driver{})
	}
}

// Driver is the database/sql driver registered as "pgryw".
type Driver struct{}

// Open implements driver.Driver. database/sql calls it only when the driver
// lacks OpenConnector, which pgryw has; it is here for direct callers.
func (d *Driver) Open(dsn string) (driver.Conn, error) {
	c, err := d.OpenConnector(dsn)
	if err != nil {
		return nil, err
	}
	return c.Connect(context.Background())
}

// OpenConnector implements driver.DriverContext: sql.Open parses the DSN once.
func (d *Driver) OpenConnector(dsn string) (driver.Connector, error) {
	cfg, err := ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	c, err := NewConnector(cfg)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return c, nil
}

// Connector holds everything one pool shares: the parsed configuration, what
// is known about each node, the pool-wide watermark and the statement cache.
// Use it with sql.OpenDB.
type Connector struct {
	cfg   *Config
	plain bool // no replicas: every statement goes to the primary untouched

	primary  driver.Connector
	replicas []driver.Connector
	topo     topology

	// The pool's watermark, and what it needs, shared with every other
	// connector of this process to the same database of the same writer
	// (scopeOf): two *sql.DB handles to one database see each other's
	// writes, with session_scope=db.
	*clusterScope
	classes classCache

	overrides funcOverrides // write_functions, read_functions
	funcs     funcCatalog
	// monitorEvery is how often the monitor looks at each node (0:
	// monitorInterval); tests shorten it.
	monitorEvery time.Duration

	// opened counts the replica connections Conns opened (backend.born).
	opened atomic.Uint64
	// conns counts the Conns open: the most idle connections each
	// replica's lendPool keeps.
	conns atomic.Int64

	stats   counters
	over    overload // max_fallback and max_waits (max_replica_lag is topo.lag)
	log     atomic.Pointer[slog.Logger]
	obs     connObs // the pool-wide served-by hook (observe.go)
	mon     monitor
	seenTLI atomic.Uint32 // the writer's timeline as this connector's connections last saw it (noteTimeline)

	// afterConnect runs on each new connection of a Conn's (a Pool's
	// AfterConnect).
	afterConnect func(context.Context, *pgx.Conn) error

	// dial opens a backend connection; tests wrap it to fail or count
	// dials.
	dial func(ctx context.Context, n *node, why dialFor) (driver.Conn, error)
	// netHook, when set by tests, wraps each server connection under
	// pgryw's wire layer (to count round trips).
	netHook func(*pgconn.Config, net.Conn) net.Conn
}

// NewConnector validates cfg and returns a connector for sql.OpenDB. cfg is
// copied; later changes to it have no effect.
func NewConnector(cfg *Config) (*Connector, error) {
	return newConnector(cfg, connHooks{})
}

// connHooks are what a connector's caller gives it beyond a Config: the
// primary's pgx configuration, already parsed (a Pool's PoolConfig.ConnConfig,
// with its Tracer and handlers), and calls around each new connection.
type connHooks struct {
	base *pgx.ConnConfig
	// before runs before each server connection is made, with a copy of
	// its configuration.
	before func(context.Context, *pgx.ConnConfig) error
	// after runs on each new connection of a Conn's, primary or replica.
	after func(context.Context, *pgx.Conn) error
}

func newConnector(cfg *Config, h connHooks) (*Connector, error) {
	if cfg == nil {
		return nil, fmt.Errorf("pgryw: nil Config")
	}
	cfg = cfg.Clone()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	wc, err := cfg.primaryConfig()
	if err != nil {
		return nil, err
	}
	if h.base != nil {
		wc = h.base.Copy()
	}
	var opts []stdlib.OptionOpenDB
	if h.before != nil {
		opts = append(opts, stdlib.OptionBeforeConnect(h.before))
	}
	c := &Connector{
		afterConnect: h.after,
		cfg:          cfg,
		plain:        len(cfg.Replicas) == 0,
		overrides:    newFuncOverrides(cfg.WriteFunctions, cfg.ReadFunctions),
		clusterScope: scopeOf(wc),
	}
	c.topo.primary = &node{index: -1, addr: fmt.Sprintf("%s:%d", wc.Host, wc.Port), host: wc.Host, port: wc.Port}
	addNode := func(host string, port uint16, candidate bool) {
		rc := replicaConfig(wc, host, port)
		n := &node{index: len(c.topo.replicas), addr: fmt.Sprintf("%s:%d", host, port), host: host, port: port, candidate: candidate}
		c.wireUp(rc, n)
		c.replicas = append(c.replicas, stdlib.GetConnector(*rc, opts...))
		c.topo.replicas = append(c.topo.replicas, n)
	}
	for _, r := range cfg.Replicas {
		host, port, err := splitHostPort(r, wc.Port)
		if err != nil {
			return nil, badValue("replicas", r, err.Error())
		}
		addNode(host, port, false)
	}
	if !c.plain {
		// A writer named by several hosts fails over among them: each is
		// also a replica while it is a standby (the monitor tells), and a
		// former writer that comes back as a standby serves reads again.
		for _, hp := range writerHosts(wc) {
			if !slices.ContainsFunc(c.topo.replicas, func(n *node) bool { return n.port == hp.port && strings.EqualFold(n.host, hp.host) }) {
				addNode(hp.host, hp.port, true)
			}
		}
	}
	if !c.plain {
		c.wireUp(wc, c.topo.primary)
	}
	c.primary = stdlib.GetConnector(*wc, opts...)
	c.dial = c.dialServer
	c.log.Store(cfg.Logger)
	c.initOverload()
	return c, nil
}

// wireUp puts a wire.Conn between pgconn and each new server connection
// (after TLS), through which pgryw's own statements ride along with the
// application's. A connector without replicas has no use for it.
func (c *Connector) wireUp(cc *pgx.ConnConfig, n *node) {
	prev := cc.AfterNetConnect
	cc.AfterNetConnect = func(ctx context.Context, pc *pgconn.Config, nc net.Conn) (net.Conn, error) {
		if prev != nil {
			var err error
			if nc, err = prev(ctx, pc, nc); err != nil {
				return nil, err
			}
		}
		if c.netHook != nil {
			nc = c.netHook(pc, nc)
		}
		return wire.Wrap(nc), nil
	}
	prevAfter := cc.AfterConnect
	cc.AfterConnect = func(ctx context.Context, pc *pgconn.PgConn) error {
		if prevAfter != nil {
			if err := prevAfter(ctx, pc); err != nil {
				return err
			}
		}
		w, ok := pc.Conn().(*wire.Conn)
		if !ok {
			return nil
		}
		return c.identify(ctx, pc, w, n)
	}
}

// sqlIdentity names the backend and the server instance a new connection
// reached: a backend process ID other than the BackendKeyData's means a
// pooler in between; the postmaster's start time (as a number: text would
// follow the session's TimeZone) and port tell one server instance from
// another behind the same address. A role that may not call
// pg_postmaster_start_time gets NULL there: no instance.
// The fourth column is sqlSystem's: see checkSystemOf.
const sqlIdentity = "SELECT pg_catalog.pg_backend_pid(), CASE WHEN pg_catalog.has_function_privilege('pg_catalog.pg_postmaster_start_time()', 'EXECUTE')" +
	" THEN pg_catalog.date_part('epoch', pg_catalog.pg_postmaster_start_time())::pg_catalog.text END, COALESCE(pg_catalog.inet_server_port(), 0)," +
	" CASE WHEN pg_catalog.has_function_privilege('pg_catalog.pg_control_system()', 'EXECUTE')" +
	" THEN (SELECT s.system_identifier::pg_catalog.text FROM pg_catalog.pg_control_system() s) END"

// identify sets w.Peer for a connection to n just opened, by c's pooler
// setting: with auto and session, from sqlIdentity's answer (one round
// trip). A server error (a standby refusing a default of SERIALIZABLE,
// say) leaves the connection as it is, with nothing known: no instance
// (so nothing known of the node spares its reads a check), and with auto
// taken to be behind a transaction pooler, which is safe whatever is
// there; the error comes again with the application's statement, where
// pgryw handles it. Unless a transaction pooler is in between, the
// connection's system identifier is compared too (checkSystemOf): with
// pooler=none that is the round trip's only question.
func (c *Connector) identify(ctx context.Context, pc *pgconn.PgConn, w *wire.Conn, n *node) error {
	auto := c.cfg.Pooler == PoolerAuto
	switch c.cfg.Pooler {
	case PoolerTransaction:
		w.Peer = wire.Peer{TxPooled: true, Unnamed: true}
		return nil
	case PoolerNone:
		return c.identifySystem(ctx, pc, w, n)
	}
	res, err := pc.Exec(ctx, sqlIdentity).ReadAll()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		w.Peer = wire.Peer{TxPooled: auto, Unnamed: true, Auto: auto}
		return nil
	}
	if err != nil {
		return fmt.Errorf("pgryw: reading which server the connection reached: %w", err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 4 {
		return errors.New("pgryw: reading which server the connection reached: unexpected answer")
	}
	row := res[0].Rows[0]
	pid, _ := strconv.ParseUint(string(row[0]), 10, 32)
	if auto && uint32(pid) != pc.PID() {
		// Behind a pooler each transaction may reach another server:
		// this one's identifier says nothing of the next.
		w.Peer = wire.Peer{TxPooled: true, Unnamed: true, Auto: true}
		return nil
	}
	w.Peer = wire.Peer{Unnamed: c.cfg.Pooler == PoolerSession, Auto: auto, Instance: instanceOf(row[1], row[2])}
	return c.checkSystemOf(n, row[3])
}

// identifySystem is identify with pooler=none: no pooler to look for; the
// system identifier and the server instance still are, on a replica's
// connection (the instance binds what a read learns of the node's replay
// to the server that replayed it: node.knownReplayOn), and on the writer's
// until the system identifier is known. One round trip, sqlIdentity's,
// whose backend PID is not looked at.
func (c *Connector) identifySystem(ctx context.Context, pc *pgconn.PgConn, w *wire.Conn, n *node) error {
	if n.index < 0 && c.sysAnswered() {
		return nil
	}
	res, err := pc.Exec(ctx, sqlIdentity).ReadAll()
	if err != nil || len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 4 {
		return nil // nothing known (no instance: every read checks); the monitor asks again
	}
	row := res[0].Rows[0]
	w.Peer.Instance = instanceOf(row[1], row[2])
	return c.checkSystemOf(n, row[3])
}

// instanceOf names a server instance by its start time and address (the
// identity query's second and third columns), 0 when unknown.
func instanceOf(start, addr []byte) uint64 {
	if start == nil {
		return 0
	}
	h := fnv.New64a()
	h.Write(start)
	h.Write([]byte{0})
	h.Write(addr)
	return h.Sum64() | 1
}

// checkSystemOf compares the system identifier a new connection to n
// reported (nil: the role may not read it) with the writer's. The writer's
// own connections teach it; a replica connection that reached another
// cluster's standby (an address left over from a blue/green or
// major-upgrade migration) fails with errForeign, wrapped with both
// identifiers, and takes n out of reads (HealthForeign, logged) until a
// connection to it reaches this cluster again. The monitor compares the
// same on its own connections: this check covers the reads before its
// first probe and an address that leads elsewhere between probes.
func (c *Connector) checkSystemOf(n *node, v []byte) error {
	if v == nil {
		if n.index < 0 {
			c.sysTried.Store(true) // as the monitor would conclude
		}
		return nil
	}
	sys, err := strconv.ParseUint(string(v), 10, 64)
	if err != nil || sys == 0 {
		return nil
	}
	if n.index < 0 {
		c.sysID.CompareAndSwap(0, sys)
		return nil
	}
	w := c.sysID.Load()
	if w == 0 {
		return nil // the writer has not said: the monitor compares later
	}
	n.system.Store(sys)
	n.foreign.Store(sys != w)
	c.noteHealth(n)
	if sys != w {
		return fmt.Errorf("%w at %s: its system identifier is %d, the writer's %d", errForeign, n.addr, sys, w)
	}
	return nil
}

type hostPort struct {
	host string
	port uint16
}

// writerHosts returns the writer's hosts when the DSN names more than one
// (pgx's multi-host form, with target_session_attrs choosing among them), in
// order, each once; nil for a single host.
func writerHosts(wc *pgx.ConnConfig) []hostPort {
	hosts := []hostPort{{wc.Host, wc.Port}}
	for _, fb := range wc.Fallbacks {
		if !slices.Contains(hosts, hostPort{fb.Host, fb.Port}) {
			hosts = append(hosts, hostPort{fb.Host, fb.Port})
		}
	}
	if len(hosts) < 2 {
		return nil
	}
	return hosts
}

// clusterScope is what every connector of the process to one database of
// one writer shares: the pool-wide watermark (session_scope=db) and what
// keeps it right (the captures it awaits, the writer's generation). GORM
// beside raw SQL, a prepared-statement pool beside the plain one: an
// application's handles to one database are one session to it, as users
// expect of session_scope=db.
type clusterScope struct {
	db       Session
	inflight pendingSet    // captures of possible commits the watermark awaits (deferred.go)
	sysID    atomic.Uint64 // the primary's system identifier, once read; 0: unknown
	sysTried atomic.Bool   // the server refused to say: not asked again
	sysAsked atomic.Int64  // when the monitor last asked the writer (unix ns)
	fresh    freshState    // tokens' fresh positions (freshPosition)
	tli      atomic.Uint32 // the current writer's timeline (see sawPrimary); 0 until known
	genMu    sync.Mutex    // serializes changes of tli
	// uses counts the reads (and tokens) that asked for a watermark: what
	// tells a write whether its position is likely to be wanted before the
	// next write's (Conn.captureLater).
	uses atomic.Uint64
	// autoMiss: when (unix ns) a read last read a position afresh for a
	// write elsewhere that had gone without one (missedLately).
	autoMiss atomic.Int64

	key  string
	refs int // open connectors; under scopes.mu
}

// sysAnswered reports whether the writer's system identifier is known, or
// the server refused to say: either way it is not asked again.
func (s *clusterScope) sysAnswered() bool { return s.sysID.Load() != 0 || s.sysTried.Load() }

// scopes holds the process's cluster scopes, by scopeKey.
var scopes struct {
	mu sync.Mutex
	m  map[string]*clusterScope
}

// scopeOf returns the scope of the writer wc names: every host it lists,
// in order, and the database. Connectors that name the writer otherwise
// (another host name for it) get scopes of their own.
func scopeOf(wc *pgx.ConnConfig) *clusterScope {
	var b strings.Builder
	for _, h := range append([]hostPort{{wc.Host, wc.Port}}, writerHosts(wc)...) {
		fmt.Fprintf(&b, "%s:%d,", strings.ToLower(h.host), h.port)
	}
	b.WriteString("/" + wc.Database)
	key := b.String()
	scopes.mu.Lock()
	defer scopes.mu.Unlock()
	if scopes.m == nil {
		scopes.m = map[string]*clusterScope{}
	}
	s := scopes.m[key]
	if s == nil {
		s = &clusterScope{key: key, fresh: freshState{turn: make(chan struct{}, 1)}}
		scopes.m[key] = s
	}
	s.refs++
	return s
}

// release gives up a connector's hold on s (Connector.Close): the last one
// forgets it, so that a later pool to the same address starts afresh.
func (s *clusterScope) release() {
	scopes.mu.Lock()
	defer scopes.mu.Unlock()
	if s.refs--; s.refs <= 0 && scopes.m[s.key] == s {
		delete(scopes.m, s.key)
	}
}

// dialFor says what a server connection is opened for: tests that wrap
// Connector.dial tell the monitor's from the reads' by it.
type dialFor uint8

const (
	forConn     dialFor = iota // a Conn's primary or replica connection
	forMonitor                 // the monitor's probe of a node
	forPrimary                 // the monitor's look at the writer (its system identifier)
	forSampler                 // max_replica_lag's primary sampler
	forCatalog                 // the catalog worker
	forPosition                // a fresh primary position (Session.TokenContext)
)

func (c *Connector) dialServer(ctx context.Context, n *node, why dialFor) (driver.Conn, error) {
	dc, err := c.connectorOf(n).Connect(ctx)
	if err != nil || why != forConn || c.afterConnect == nil {
		return dc, err
	}
	if err := c.afterConnect(ctx, dc.(*stdlib.Conn).Conn()); err != nil {
		dc.Close()
		return nil, err
	}
	return dc, nil
}

// connectorOf returns pgx's stdlib connector for node n.
func (c *Connector) connectorOf(n *node) driver.Connector {
	if n.index < 0 {
		return c.primary
	}
	return c.replicas[n.index]
}

// Connect implements driver.Connector. It opens the primary connection now;
// replica connections are opened by the first read that needs each.
func (c *Connector) Connect(ctx context.Context) (driver.Conn, error) {
	wc, err := c.dial(ctx, c.topo.primary, forConn)
	if err != nil {
		return nil, err
	}
	c.startMonitor()
	c.conns.Add(1)
	return &Conn{c: c, primary: newBackend(wc, c.topo.primary), replicas: make([]*backend, len(c.topo.replicas))}, nil
}

// sqlGeneration names the primary's history: its system identifier, and its
// timeline as the first eight hex digits of the current WAL file's name.
const sqlGeneration = "SELECT s.system_identifier::pg_catalog.text, pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_insert_lsn()) FROM pg_catalog.pg_control_system() s"

// generationOf returns the current writer's generation: its system
// identifier, read on b (idle on the primary) the first time a Session
// needs it (one round trip per connector, paid only by applications that
// use Sessions; a failover keeps the system identifier), and the timeline of
// the latest position read on the writer (see sawPrimary). A server that
// refuses the query (pg_control_system may be restricted) is not asked
// again; Session positions then carry the timeline alone. Until the system
// identifier is known they carry no generation, and tokens of any
// generation are taken as this one's.
func (c *Connector) generationOf(ctx context.Context, b *backend) generation {
	if sys := c.sysID.Load(); sys != 0 || c.sysTried.Load() {
		return generation{system: sys, timeline: c.tli.Load()}
	}
	row, _, err := b.control(ctx, sqlGeneration)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		c.sysTried.Store(true)
		return generation{timeline: c.tli.Load()}
	}
	if err != nil || len(row) != 2 {
		return generation{}
	}
	sys, err := strconv.ParseUint(row[0], 10, 64)
	tli, ok := walFileTimeline(row[1])
	if err != nil || !ok || sys == 0 {
		c.sysTried.Store(true)
		return generation{timeline: c.tli.Load()}
	}
	c.sysID.Store(sys)
	// Before any position was read, this is the current writer's timeline.
	c.tli.CompareAndSwap(0, tli)
	return generation{system: sys, timeline: c.tli.Load()}
}

// Driver implements driver.Connector.
func (c *Connector) Driver() driver.Driver { return &Driver{} }

// Config returns a copy of the connector's configuration.
func (c *Connector) Config() *Config { return c.cfg.Clone() }

var (
	_ driver.Driver        = (*Driver)(nil)
	_ driver.DriverContext = (*Driver)(nil)
	_ driver.Connector     = (*Connector)(nil)
	_ io.Closer            = (*Connector)(nil)
)
