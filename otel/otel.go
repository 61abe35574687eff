// Package pgrywotel puts where each statement of a pgryw pool ran on the
// active OpenTelemetry span: the serving node's server.address and
// server.port, and why pgryw sent the statement there. With
// github.com/XSAM/otelsql, that span is the statement's own:
//
//	db, err := otelsql.Open("pgryw", dsn)
//	err = pgrywotel.Instrument(db) // every statement of the pool
//
// or, for the statements of one context only,
//
//	db.QueryContext(pgrywotel.Context(ctx), …)
//
// It lives in its own module so that pgryw itself depends on pgx alone.
package pgrywotel

import (
	"context"
	"database/sql"

	"github.com/pgryw/pgryw"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Attribute keys. server.address and server.port are OpenTelemetry's
// semantic conventions; the others are pgryw's.
const (
	ServerAddressKey = attribute.Key("server.address")      // the serving node's host
	ServerPortKey    = attribute.Key("server.port")         // the serving node's port
	RoleKey          = attribute.Key("pgryw.node.role")     // "primary" or "replica"
	RouteKey         = attribute.Key("pgryw.route")         // pgryw.Route's name: "replica", "write", "fallback"...
	FallbackKey      = attribute.Key("pgryw.fallback")      // pgryw.Fallback's name, when a replica could not serve
	WaitKey          = attribute.Key("pgryw.wait.duration") // seconds waited for replicas, when any
	StaleKey         = attribute.Key("pgryw.stale")         // true when a replica served stale rows (on_timeout=stale)
)

// Attributes returns the span attributes for s: the node's address, port
// and role, and the route; the fallback reason, the wait and staleness
// when there are any.
func Attributes(s pgryw.ServedBy) []attribute.KeyValue {
	kv := make([]attribute.KeyValue, 0, 7)
	kv = append(kv,
		ServerAddressKey.String(s.Host),
		ServerPortKey.Int(int(s.Port)),
		RoleKey.String(s.Role.String()),
		RouteKey.String(s.Route.String()),
	)
	if s.Fallback != pgryw.FallbackNone {
		kv = append(kv, FallbackKey.String(s.Fallback.String()))
	}
	if s.Wait > 0 {
		kv = append(kv, WaitKey.Float64(s.Wait.Seconds()))
	}
	if s.Stale {
		kv = append(kv, StaleKey.Bool(true))
	}
	return kv
}

// Hook is a pgryw.ServedByFunc that adds Attributes to the span in the
// statement's context, when it is recording. Call it from a hook of your
// own to combine it with others.
func Hook(ctx context.Context, s pgryw.ServedBy) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(Attributes(s)...)
}

// Instrument makes every statement of a pgryw pool (opened with
// sql.Open("pgryw", …), otelsql.Open("pgryw", …) or sql.OpenDB on a
// pgryw.Connector, wrapped or not) annotate its span, by setting Hook as
// the pool's served-by hook (replacing one set before). It fails for a
// pool of another driver.
func Instrument(db *sql.DB) error {
	c, err := pgryw.ConnectorOf(db)
	if err != nil {
		return err
	}
	c.SetServedBy(Hook)
	return nil
}

// Context returns a context whose statements annotate their spans (see
// pgryw.WithServedBy).
func Context(ctx context.Context) context.Context {
	return pgryw.WithServedBy(ctx, Hook)
}
