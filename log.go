package pgryw

import (
	"context"
	"database/sql"
	"log/slog"
)

// logger returns the connector's logger, or nil when none is set.
func (c *Connector) logger() *slog.Logger { return c.log.Load() }

// logAt writes one line at level when a logger is set and enabled for it.
// Callers pass attributes, never statement text, arguments or passwords.
func (c *Connector) logAt(level slog.Level, msg string, attrs ...slog.Attr) {
	l := c.logger()
	if l == nil || !l.Enabled(context.Background(), level) {
		return
	}
	l.LogAttrs(context.Background(), level, msg, attrs...)
}

// SetLogger replaces the connector's logger (Config.Logger); nil stops
// logging.
func (c *Connector) SetLogger(l *slog.Logger) { c.log.Store(l) }

// SetLogger sets the logger of a pool opened with sql.Open("pgryw", dsn),
// which has no Config to carry one. It takes a connection from the pool
// (opening one if none is idle) to reach pgryw's connector, and fails for a
// pool of another driver.
func SetLogger(db *sql.DB, l *slog.Logger) error {
	c, err := connectorOf(db)
	if err != nil {
		return err
	}
	c.SetLogger(l)
	return nil
}
