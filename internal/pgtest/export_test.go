package pgtest

import (
	"context"
	"os/exec"
)

// SetForceCopy lets the external tests cover the copied-data-dir replica
// route (the only one for bin dirs without pg_basebackup) on any server.
func SetForceCopy(v bool) (restore func()) {
	old := forceCopy
	forceCopy = v
	return func() { forceCopy = old }
}

// SetForceRebuildCopy makes RebuildStandby take the copy route on any
// server.
func SetForceRebuildCopy(v bool) (restore func()) {
	old := forceRebuildCopy
	forceRebuildCopy = v
	return func() { forceRebuildCopy = old }
}

// WALSizes reports the WAL page and segment sizes Start read.
func (c *Cluster) WALSizes() (block, seg uint64) { return c.walBlockSize, c.walSegSize }

// SetProviderCommand replaces the command Start runs for
// PGRYW_PG_PROVIDER=docker, so tests can stand in for pgdocker.
func SetProviderCommand(f func(replicas int) (*exec.Cmd, error)) (restore func()) {
	old := providerCommand
	providerCommand = f
	return func() { providerCommand = old }
}

// StopBehindItsBack stops replica i through the backend alone, as another
// process holding the servers would (the Cluster does not learn of it);
// StartBehindItsBack starts it again.
func (c *Cluster) StopBehindItsBack(i int) error { return c.be.stopNode(i + 1) }

// StartBehindItsBack: see StopBehindItsBack.
func (c *Cluster) StartBehindItsBack(ctx context.Context, i int) error {
	return c.be.startNode(ctx, i+1)
}
