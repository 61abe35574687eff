//go:build race

package pgryw

// raceEnabled: the race detector is on. sync.Pool (pgx's buffer pools)
// then drops a random quarter of what it is given, so allocation counts
// vary from run to run and mean nothing.
const raceEnabled = true
