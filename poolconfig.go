package pgryw

import (
	"context"
	"runtime"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// PoolConfig configures a Pool: pgryw's settings, the primary's pgx
// configuration, and the pool's own, under pgxpool.Config's names. Build
// one with ParsePoolConfig.
type PoolConfig struct {
	// Config holds pgryw's settings: the replicas, the waits and their
	// policies, the DSN keys of the README.
	Config *Config
	// ConnConfig is the primary's pgx configuration; each replica's is a
	// copy with its own host and port, as for database/sql (see Config).
	// Set pgx's options here: Tracer, DefaultQueryExecMode,
	// StatementCacheCapacity, OnNotice, OnNotification... They apply to
	// every connection of the pool's, replicas included.
	ConnConfig *pgx.ConnConfig

	// BeforeConnect is called before each new server connection, primary
	// or replica (and those of pgryw's own monitor), with a copy of its
	// configuration, which it may change (a password that rotates).
	BeforeConnect func(context.Context, *pgx.ConnConfig) error
	// AfterConnect is called on each new server connection of the pool's,
	// the primary's and each replica's (a read may run on any): register
	// types here. It must not write: a replica refuses writes.
	AfterConnect func(context.Context, *pgx.Conn) error
	// BeforeAcquire is called with the connection's primary pgx connection
	// before the pool hands it out; false destroys it and another is
	// taken.
	//
	// Deprecated: use PrepareConn, as with pgxpool; when both are set
	// PrepareConn is used.
	BeforeAcquire func(context.Context, *pgx.Conn) bool
	// PrepareConn is called with the connection's primary pgx connection
	// before the pool hands it out, with pgxpool's meaning: true and nil
	// hands it out; false destroys it (and with a nil error another is
	// taken); an error fails the call that wanted it.
	PrepareConn func(context.Context, *pgx.Conn) (bool, error)
	// AfterRelease is called with the connection's primary pgx connection
	// when it is released; false destroys it instead of keeping it.
	AfterRelease func(*pgx.Conn) bool
	// BeforeClose is called with the connection's primary pgx connection
	// before the pool closes it.
	BeforeClose func(*pgx.Conn)

	// MaxConns bounds the pool's connections (each one a primary
	// connection and up to one per replica). DSN key pool_max_conns;
	// default the greater of 4 and runtime.NumCPU().
	MaxConns int32
	// MinConns: connections the pool keeps open. DSN key pool_min_conns;
	// default 0.
	MinConns int32
	// MinIdleConns: idle connections the pool keeps ready. DSN key
	// pool_min_idle_conns; default 0.
	MinIdleConns int32
	// MaxConnLifetime: a connection older than this is closed (DSN key
	// pool_max_conn_lifetime; default 1h), with up to
	// MaxConnLifetimeJitter more at random (pool_max_conn_lifetime_jitter;
	// default 0).
	MaxConnLifetime       time.Duration
	MaxConnLifetimeJitter time.Duration
	// MaxConnIdleTime: an idle connection is closed after this long
	// (pool_max_conn_idle_time; default 30m).
	MaxConnIdleTime time.Duration
	// HealthCheckPeriod is how often idle connections are looked at
	// (pool_health_check_period; default 1m).
	HealthCheckPeriod time.Duration
	// PingTimeout bounds the check of a connection idle for more than a
	// second before it is handed out (pool_ping_timeout; default 0: the
	// caller's context only).
	PingTimeout time.Duration
}

// Defaults of the pool_* DSN keys, as pgxpool's.
const (
	defaultMinPoolConns      = 4
	defaultMaxConnLifetime   = time.Hour
	defaultMaxConnIdleTime   = 30 * time.Minute
	defaultHealthCheckPeriod = time.Minute
)

// ParsePoolConfig parses a DSN as ParseDSN does (any pgx connection string
// for the primary, plus pgryw's keys) and, as pgxpool.ParseConfig does,
// the pool's keys: pool_max_conns, pool_min_conns, pool_min_idle_conns,
// pool_max_conn_lifetime, pool_max_conn_lifetime_jitter,
// pool_max_conn_idle_time, pool_health_check_period and
// pool_ping_timeout.
func ParsePoolConfig(dsn string) (*PoolConfig, error) {
	cfg, err := ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	cc, err := cfg.primaryConfig()
	if err != nil {
		return nil, err
	}
	pc := &PoolConfig{
		Config:            cfg,
		ConnConfig:        cc,
		MaxConns:          max(defaultMinPoolConns, int32(min(runtime.NumCPU(), 1<<30))),
		MaxConnLifetime:   defaultMaxConnLifetime,
		MaxConnIdleTime:   defaultMaxConnIdleTime,
		HealthCheckPeriod: defaultHealthCheckPeriod,
	}
	for _, k := range poolKeys {
		v, ok := cc.RuntimeParams[k.key]
		if !ok {
			continue
		}
		delete(cc.RuntimeParams, k.key)
		if err := k.parse(pc, v); err != nil {
			return nil, err
		}
	}
	return pc, nil
}

// poolKey is one of the pool's DSN keys.
type poolKey struct {
	key   string
	parse func(pc *PoolConfig, v string) error
}

var poolKeys = []poolKey{
	{"pool_max_conns", func(pc *PoolConfig, v string) (err error) {
		pc.MaxConns, err = parsePoolInt("pool_max_conns", v, 1)
		return err
	}},
	{"pool_min_conns", func(pc *PoolConfig, v string) (err error) {
		pc.MinConns, err = parsePoolInt("pool_min_conns", v, 0)
		return err
	}},
	{"pool_min_idle_conns", func(pc *PoolConfig, v string) (err error) {
		pc.MinIdleConns, err = parsePoolInt("pool_min_idle_conns", v, 0)
		return err
	}},
	{"pool_max_conn_lifetime", func(pc *PoolConfig, v string) (err error) {
		pc.MaxConnLifetime, err = parsePoolDuration("pool_max_conn_lifetime", v)
		return err
	}},
	{"pool_max_conn_lifetime_jitter", func(pc *PoolConfig, v string) (err error) {
		pc.MaxConnLifetimeJitter, err = parsePoolDuration("pool_max_conn_lifetime_jitter", v)
		return err
	}},
	{"pool_max_conn_idle_time", func(pc *PoolConfig, v string) (err error) {
		pc.MaxConnIdleTime, err = parsePoolDuration("pool_max_conn_idle_time", v)
		return err
	}},
	{"pool_health_check_period", func(pc *PoolConfig, v string) (err error) {
		pc.HealthCheckPeriod, err = parsePoolDuration("pool_health_check_period", v)
		return err
	}},
	{"pool_ping_timeout", func(pc *PoolConfig, v string) (err error) {
		pc.PingTimeout, err = parsePoolDuration("pool_ping_timeout", v)
		return err
	}},
}

func parsePoolInt(key, v string, least int64) (int32, error) {
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n < least {
		return 0, badValue(key, v, "an integer from "+strconv.FormatInt(least, 10)+" to 2147483647")
	}
	return int32(n), nil
}

func parsePoolDuration(key, v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, badValue(key, v, "a Go duration (1h30m, 90s)")
	}
	return d, nil
}

// Copy returns a copy of pc, with copies of its Config and ConnConfig.
func (pc *PoolConfig) Copy() *PoolConfig {
	cp := *pc
	if pc.Config != nil {
		cp.Config = pc.Config.Clone()
	}
	if pc.ConnConfig != nil {
		cp.ConnConfig = pc.ConnConfig.Copy()
	}
	return &cp
}
