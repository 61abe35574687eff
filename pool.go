package pgryw

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
)

// pgx's front end: a pool with pgxpool's methods, for code written against
// pgx rather than database/sql (pgxpool, sqlc's pgx/v5 DBTX). Each of its
// connections is a Conn, the same as database/sql's: a primary connection
// and a connection per replica opened when a read first needs it, with the
// same routing, waits, captures, watermarks, sessions and bounds.

// Pool is a pool of connections with pgxpool.Pool's methods, whose reads
// run on replicas that have replayed the session's writes. Its Query
// returns pgx.Rows, its Begin a pgx.Tx, and errors are pgx's own. A
// statement run on the Pool itself, like database/sql's *sql.DB, takes any
// connection: with session_scope=db (the default) a read still sees every
// write of the pool's; Acquire a PoolConn, or use WithSession, to keep a
// session of one's own.
type Pool struct {
	c   *Connector
	p   *puddle.Pool[*poolConn]
	cfg *PoolConfig

	prepare func(context.Context, *pgx.Conn) (bool, error)

	newConns, lifetimeDestroys, idleDestroys atomic.Int64

	closeOnce sync.Once
	closed    chan struct{}
	check     chan struct{} // a health check is due now
}

// poolConn is one of the pool's connections.
type poolConn struct {
	cn      *Conn
	expires time.Time // zero: never
	used    bool      // handed out before: checked before it is again
}

// NewPool parses dsn with ParsePoolConfig and opens a pool with it.
func NewPool(ctx context.Context, dsn string) (*Pool, error) {
	pc, err := ParsePoolConfig(dsn)
	if err != nil {
		return nil, err
	}
	return NewPoolWithConfig(ctx, pc)
}

// NewPoolWithConfig opens a pool with pc (copied: later changes have no
// effect). As with pgxpool, no connection is made before the first is
// needed, but MinConns and MinIdleConns are made in the background.
func NewPoolWithConfig(ctx context.Context, pc *PoolConfig) (*Pool, error) {
	if pc == nil || pc.Config == nil {
		return nil, errors.New("pgryw: PoolConfig without a Config: build it with ParsePoolConfig")
	}
	if pc.MaxConns < 1 {
		return nil, errors.New("pgryw: PoolConfig.MaxConns must be at least 1")
	}
	pc = pc.Copy()
	base := pc.ConnConfig
	if base == nil {
		var err error
		if base, err = pc.Config.primaryConfig(); err != nil {
			return nil, err
		}
	}
	if base.ConnectTimeout <= 0 {
		// A connection the pool makes goes on when the caller that wanted
		// it gives up: it must not hang for ever.
		base.ConnectTimeout = 2 * time.Minute
	}
	c, err := newConnector(pc.Config, connHooks{base: base, before: pc.BeforeConnect, after: pc.AfterConnect})
	if err != nil {
		return nil, err
	}
	p := &Pool{c: c, cfg: pc, closed: make(chan struct{}), check: make(chan struct{}, 1), prepare: pc.PrepareConn}
	if p.prepare == nil && pc.BeforeAcquire != nil {
		before := pc.BeforeAcquire
		p.prepare = func(ctx context.Context, conn *pgx.Conn) (bool, error) { return before(ctx, conn), nil }
	}
	p.p, err = puddle.NewPool(&puddle.Config[*poolConn]{
		Constructor: p.connect,
		Destructor:  p.destroy,
		MaxSize:     pc.MaxConns,
	})
	if err != nil {
		c.Close()
		return nil, err
	}
	go func() {
		p.fill(context.WithoutCancel(ctx), int(max(pc.MinConns, pc.MinIdleConns)))
		p.healthLoop()
	}()
	return p, nil
}

// connect makes one of the pool's connections.
func (p *Pool) connect(ctx context.Context) (*poolConn, error) {
	p.newConns.Add(1)
	dc, err := p.c.Connect(ctx)
	if err != nil {
		return nil, err
	}
	pc := &poolConn{cn: dc.(*Conn)}
	if lt := p.cfg.MaxConnLifetime; lt > 0 {
		jitter := time.Duration(rand.Int64N(int64(p.cfg.MaxConnLifetimeJitter) + 1))
		pc.expires = time.Now().Add(lt + jitter)
	}
	return pc, nil
}

// destroy closes one of the pool's connections.
func (p *Pool) destroy(pc *poolConn) {
	if p.cfg.BeforeClose != nil {
		p.cfg.BeforeClose(pc.cn.primary.pgx())
	}
	pc.cn.Close()
}

func (pc *poolConn) expired() bool {
	return !pc.expires.IsZero() && time.Now().After(pc.expires)
}

// Acquire takes a connection from the pool, for statements that must share
// one session (its watermark, its settings, an Exec'd transaction block);
// Release gives it back.
func (p *Pool) Acquire(ctx context.Context) (*PoolConn, error) {
	// As many tries as the pool has connections, and one: a pool of
	// broken connections still gets a new one.
	for range int(p.cfg.MaxConns) + 1 {
		res, err := p.p.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		pc := res.Value()
		if pc.expired() {
			p.lifetimeDestroys.Add(1)
			res.Destroy()
			continue
		}
		if pc.used {
			if err := p.reset(ctx, pc.cn); err != nil {
				res.Destroy()
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				continue
			}
		}
		if p.prepare != nil {
			ok, err := pc.cn.prepareHook(ctx, p.prepare)
			if !ok {
				res.Destroy()
			}
			if err != nil {
				if ok {
					res.Release()
				}
				return nil, err
			}
			if !ok {
				continue
			}
		}
		pc.used = true
		return &PoolConn{res: res, p: p}, nil
	}
	return nil, errors.New("pgryw: too many failed attempts to acquire a connection (PrepareConn or BeforeAcquire refused them all, or none could be used)")
}

// AcquireAllIdle takes every idle connection at once, as pgxpool's does
// (for keep-alive and health checks of one's own); each must be released.
func (p *Pool) AcquireAllIdle(ctx context.Context) []*PoolConn {
	all := p.p.AcquireAllIdle()
	out := make([]*PoolConn, 0, len(all))
	for _, res := range all {
		pc := res.Value()
		if pc.used && p.reset(ctx, pc.cn) != nil {
			res.Destroy()
			continue
		}
		if p.prepare != nil {
			ok, err := pc.cn.prepareHook(ctx, p.prepare)
			if !ok || err != nil {
				res.Destroy()
				continue
			}
		}
		pc.used = true
		out = append(out, &PoolConn{res: res, p: p})
	}
	return out
}

// reset readies a connection handed out before, as database/sql's
// ResetSession: what its last user left to settle is settled, a primary
// connection the server ended while idle is replaced, and one idle for
// more than a second is pinged (within PingTimeout, if set).
func (p *Pool) reset(ctx context.Context, cn *Conn) error {
	if t := p.cfg.PingTimeout; t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t)
		defer cancel()
	}
	return cn.ResetSession(ctx)
}

// AcquireFunc acquires a connection, calls f with it and releases it.
func (p *Pool) AcquireFunc(ctx context.Context, f func(*PoolConn) error) error {
	c, err := p.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	return f(c)
}

// Exec runs sql on a connection of the pool's, as pgxpool.Pool.Exec does.
func (p *Pool) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c, err := p.Acquire(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer c.Release()
	return c.Exec(ctx, sql, args...)
}

// Query runs sql on a connection of the pool's, which goes back to the pool
// when the rows are closed, as with pgxpool.Pool.Query.
func (p *Pool) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c, err := p.Acquire(ctx)
	if err != nil {
		return errRows{err: err}, err
	}
	return c.cn().pgxQuery(ctx, sql, args, c.releaser())
}

// QueryRow runs sql on a connection of the pool's; the row's Scan gives it
// back.
func (p *Pool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c, err := p.Acquire(ctx)
	if err != nil {
		return &pgxRow{rows: errRows{err: err}}
	}
	return c.cn().pgxQueryRow(ctx, sql, args, c.releaser())
}

// SendBatch sends b on a connection of the pool's, which goes back when
// the results are closed (or, for a batch that begins a transaction with
// pgx.Batch.BeginTx, when that transaction ends). A batch that only reads
// runs on a replica after one wait for the whole batch; one with anything
// else on the primary, and its commit moves the watermark.
func (p *Pool) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	c, err := p.Acquire(ctx)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return c.cn().pgxBatch(ctx, b, c.releaser())
}

// CopyFrom copies rows into a table on the primary, as pgx's CopyFrom, and
// moves the watermark.
func (p *Pool) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	c, err := p.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer c.Release()
	return c.CopyFrom(ctx, table, columns, src)
}

// Begin begins a transaction on a connection of the pool's, as
// pgxpool.Pool.Begin; its Commit or Rollback gives the connection back.
func (p *Pool) Begin(ctx context.Context) (pgx.Tx, error) {
	return p.BeginTx(ctx, pgx.TxOptions{})
}

// BeginTx is Begin with options. A read-only transaction
// (pgx.TxOptions.AccessMode pgx.ReadOnly) may run on a replica that has
// replayed the session's writes.
func (p *Pool) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	c, err := p.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	t, err := c.cn().pgxBegin(ctx, opts)
	if err != nil {
		c.Release()
		return nil, err
	}
	t.release = c.releaser()
	return t, nil
}

// Ping checks a connection of the pool's primary.
func (p *Pool) Ping(ctx context.Context) error {
	c, err := p.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	return c.Ping(ctx)
}

// Close closes the pool's connections, once each is released, and its
// monitor; calls after it fail.
func (p *Pool) Close() {
	p.closeOnce.Do(func() {
		close(p.closed)
		p.p.Close()
		p.c.Close()
	})
}

// Reset closes every connection of the pool's (those handed out when they
// are released), leaving the pool open.
func (p *Pool) Reset() { p.p.Reset() }

// Config returns a copy of the pool's configuration.
func (p *Pool) Config() *PoolConfig { return p.cfg.Copy() }

// Connector returns the pool's connector: its Stats, NodeStats, SetServedBy
// and the rest are the pool's.
func (p *Pool) Connector() *Connector { return p.c }

// Stats returns the pool's routing statistics (Connector.Stats).
func (p *Pool) Stats() Stats { return p.c.Stats() }

// Stat returns the pool's connection statistics, with pgxpool.Stat's
// methods.
func (p *Pool) Stat() *PoolStat {
	return &PoolStat{s: p.p.Stat(), newConns: p.newConns.Load(), lifetimeDestroys: p.lifetimeDestroys.Load(), idleDestroys: p.idleDestroys.Load()}
}

// fill makes up to n idle connections, within a minute.
func (p *Pool) fill(ctx context.Context, n int) error {
	if n <= 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	errs := make(chan error, n)
	for range n {
		go func() {
			err := p.p.CreateResource(ctx)
			if errors.Is(err, puddle.ErrNotAvailable) {
				err = nil // the pool filled up meanwhile
			}
			errs <- err
		}()
	}
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// healthLoop looks at the idle connections every HealthCheckPeriod, and
// soon after one was destroyed: it closes those past their lifetime or idle
// for too long, and makes up MinConns and MinIdleConns.
func (p *Pool) healthLoop() {
	period := p.cfg.HealthCheckPeriod
	if period <= 0 {
		period = defaultHealthCheckPeriod
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-p.closed:
			return
		case <-p.check:
		case <-t.C:
		}
		p.checkHealth()
	}
}

func (p *Pool) checkHealth() {
	st := p.p.Stat()
	want := max(p.cfg.MinConns-st.TotalResources(), p.cfg.MinIdleConns-st.IdleResources())
	if err := p.fill(context.Background(), int(want)); err != nil {
		return // below MinConns already: close nothing
	}
	total := p.p.Stat().TotalResources()
	for _, res := range p.p.AcquireAllIdle() {
		pc := res.Value()
		switch {
		case pc.expired() && total >= p.cfg.MinConns:
			p.lifetimeDestroys.Add(1)
			res.Destroy()
			total--
		case p.cfg.MaxConnIdleTime > 0 && res.IdleDuration() > p.cfg.MaxConnIdleTime && total > p.cfg.MinConns:
			p.idleDestroys.Add(1)
			res.Destroy()
			total--
		default:
			res.ReleaseUnused()
		}
	}
}

// dropped asks for a health check soon: a connection was destroyed, and
// MinConns may need making up.
func (p *Pool) dropped() {
	select {
	case p.check <- struct{}{}:
	default:
	}
}

// PoolStat is a snapshot of a Pool's connection statistics, with
// pgxpool.Stat's methods.
type PoolStat struct {
	s                                        *puddle.Stat
	newConns, lifetimeDestroys, idleDestroys int64
}

// AcquireCount is the number of connections handed out.
func (s *PoolStat) AcquireCount() int64 { return s.s.AcquireCount() }

// AcquireDuration is the time spent waiting for them.
func (s *PoolStat) AcquireDuration() time.Duration { return s.s.AcquireDuration() }

// AcquiredConns is the number of connections handed out now.
func (s *PoolStat) AcquiredConns() int32 { return s.s.AcquiredResources() }

// CanceledAcquireCount is the number of acquires given up by their context.
func (s *PoolStat) CanceledAcquireCount() int64 { return s.s.CanceledAcquireCount() }

// ConstructingConns is the number of connections being made now.
func (s *PoolStat) ConstructingConns() int32 { return s.s.ConstructingResources() }

// EmptyAcquireCount is the number of acquires that found no idle
// connection.
func (s *PoolStat) EmptyAcquireCount() int64 { return s.s.EmptyAcquireCount() }

// EmptyAcquireWaitTime is the time those waited.
func (s *PoolStat) EmptyAcquireWaitTime() time.Duration { return s.s.EmptyAcquireWaitTime() }

// IdleConns is the number of idle connections.
func (s *PoolStat) IdleConns() int32 { return s.s.IdleResources() }

// MaxConns is the pool's MaxConns.
func (s *PoolStat) MaxConns() int32 { return s.s.MaxResources() }

// TotalConns is the number of connections, idle, handed out or being made.
func (s *PoolStat) TotalConns() int32 { return s.s.TotalResources() }

// NewConnsCount is the number of connections made.
func (s *PoolStat) NewConnsCount() int64 { return s.newConns }

// MaxLifetimeDestroyCount is the number of connections closed past
// MaxConnLifetime.
func (s *PoolStat) MaxLifetimeDestroyCount() int64 { return s.lifetimeDestroys }

// MaxIdleDestroyCount is the number of connections closed past
// MaxConnIdleTime.
func (s *PoolStat) MaxIdleDestroyCount() int64 { return s.idleDestroys }
