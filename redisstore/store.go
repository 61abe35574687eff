// Package redisstore keeps pgryw read-your-writes tokens in Redis, so that
// several application processes share one position per key (a user, a
// session, a tenant).
//
// A Store implements the two methods of pgryw's token store interface:
//
//	Load(ctx, key) (string, error)
//	Advance(ctx, key, token, ttl) error
//
// Advance merges on the server with a Lua script (sent with EVALSHA, falling
// back to EVAL when the server has not cached it), so concurrent advances
// from any number of processes never move a key backwards. The merge follows
// pgryw's token order: for the same system and timeline the larger LSN is
// kept, for the same system the later timeline, and a token from another
// system replaces the stored one. Every Advance sets the key's TTL.
//
// The package is a separate Go module so that pgryw itself depends on pgx
// alone.
package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/pgryw/pgryw/internal/token"
	"github.com/redis/go-redis/v9"
)

// DefaultPrefix is prepended to every key unless WithPrefix says otherwise.
const DefaultPrefix = "pgryw:token:"

// ErrTTL is returned (wrapped) by Advance for a TTL that is not positive.
var ErrTTL = errors.New("redisstore: ttl must be positive")

//go:embed advance.lua
var advanceSource string

// advanceScript is the server-side max-merge. KEYS[1] is the key, ARGV[1]
// the token and ARGV[2] the TTL in milliseconds; it returns the token that
// the key holds afterwards.
var advanceScript = redis.NewScript(advanceSource)

// Store is a token store backed by Redis. It is safe for concurrent use.
// Create one with New.
type Store struct {
	client redis.UniversalClient
	prefix string
}

// Option configures a Store.
type Option func(*Store)

// WithPrefix sets the string prepended to every key (DefaultPrefix if not
// given). An empty prefix uses the caller's keys as they are.
func WithPrefix(prefix string) Option {
	return func(s *Store) { s.prefix = prefix }
}

// New returns a Store that keeps tokens through client (a *redis.Client,
// *redis.ClusterClient, *redis.Ring or failover client). The Store does not
// own the client: closing it is the caller's job.
func New(client redis.UniversalClient, opts ...Option) *Store {
	if client == nil {
		panic("redisstore: New with a nil client")
	}
	s := &Store{client: client, prefix: DefaultPrefix}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Load returns the token stored under key, or "" when there is none (the
// key was never advanced or has expired). A stored value that is not a
// token gives an error wrapping token's malformed error, without the value.
func (s *Store) Load(ctx context.Context, key string) (string, error) {
	v, err := s.client.Get(ctx, s.prefix+key).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("redisstore: load: %w", err)
	}
	if _, err := token.Parse(v, nil); err != nil {
		return "", fmt.Errorf("redisstore: load: stored value (%d bytes) is not a token: %w", len(v), token.ErrMalformed)
	}
	return v, nil
}

// Advance stores tok under key unless the key already holds a later
// position, atomically on the server, and sets the key's TTL either way:
// to ttl (rounded up to whole milliseconds; ttl must be positive), or to
// the key's remaining TTL if that is longer, so one caller's short TTL
// never cuts short another's.
//
// tok must be a canonical token, signed or not; signatures are not checked
// here (the middleware verifies them when it reads a token back), and a
// signed token is stored with its signature. A position equal to the stored
// one leaves the stored token (and its signature) in place. The zero token
// "1.0.0.0" means "no position": it never replaces a stored token. A stored
// value that is not a token is overwritten.
func (s *Store) Advance(ctx context.Context, key, tok string, ttl time.Duration) error {
	_, err := s.advance(ctx, key, tok, ttl)
	return err
}

// advance is Advance returning the token the key holds afterwards.
func (s *Store) advance(ctx context.Context, key, tok string, ttl time.Duration) (string, error) {
	if _, err := token.Parse(tok, nil); err != nil {
		return "", fmt.Errorf("redisstore: advance: %w", err)
	}
	if ttl <= 0 {
		return "", fmt.Errorf("%w (got %v)", ErrTTL, ttl)
	}
	ms := ttl / time.Millisecond // ttl+time.Millisecond-1 could overflow
	if ttl%time.Millisecond != 0 {
		ms++
	}
	v, err := advanceScript.Run(ctx, s.client, []string{s.prefix + key}, tok, strconv.FormatInt(int64(ms), 10)).Text()
	if err != nil {
		return "", fmt.Errorf("redisstore: advance script: %w", err)
	}
	return v, nil
}
