package pgtest

// SetForceCopy lets the external tests cover the copied-data-dir replica
// route (the only one for bin dirs without pg_basebackup) on any server.
func SetForceCopy(v bool) (restore func()) {
	old := forceCopy
	forceCopy = v
	return func() { forceCopy = old }
}

// RecordEnd exposes Cluster.recordEnd for a unit test.
func RecordEnd(lsn, blockSize, segSize uint64) uint64 {
	return (&Cluster{walBlockSize: blockSize, walSegSize: segSize}).recordEnd(lsn)
}

// WALSizes reports the WAL page and segment sizes Start read.
func (c *Cluster) WALSizes() (block, seg uint64) { return c.walBlockSize, c.walSegSize }
