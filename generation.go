package pgryw

import (
	"context"
	"log/slog"
	"time"
)

// Writer generations. Every position pgryw reads on the writer (the
// capture riding behind a write, a capture of its own) carries the writer's
// timeline, from the name of the WAL file it falls in, at no extra round
// trip. A promoted standby writes on a new, higher timeline, so the first
// position read on a new writer after a failover tells the connector, before
// that position moves any shared watermark:
//
//   - the pool's watermark (session_scope=db), whose old-history position
//     the new history may not reach for a long time, moves to the new
//     writer's position, which is at or past every write of the old history
//     that the new writer has (a standby replays everything it received
//     before it is promoted), so a replica of the new history that reached
//     it has them all; writes that never reached the new writer are gone;
//   - the primary-position history used for lag estimates starts afresh;
//   - a Session holding a position of the old history is moved the same way
//     when it is next used (see Conn.watermark);
//   - an answer read on the old writer after the change (a straggler, or a
//     writer that was not quite dead) moves only its own connection's
//     watermark.
//
// A connection's own watermark needs no rebasing: its primary connection is
// to one writer for life, and connections to a dead writer are discarded
// (see Conn.ResetSession).

// sawPrimary records a position read on the writer: its timeline (a new one
// is a new writer; see switchTimeline) and, for lag estimates, its WAL
// position. It reports false for a position of an earlier timeline than the
// current writer's, which must not move shared watermarks.
func (c *Connector) sawPrimary(p primaryPos) bool {
	if p.tli != c.tli.Load() && !c.switchTimeline(p) {
		return false
	}
	if p.tli != c.seenTLI.Load() {
		c.noteTimeline(p.tli)
	}
	c.topo.hist.add(p.lsn, time.Now().UnixNano(), p.tli)
	return true
}

// switchTimeline makes p's timeline the current writer's unless it is an
// earlier one (it then reports false). A change of writer (not the first
// timeline seen) moves the pool's watermark to p: see the comment at the
// top of this file. Positions of the new timeline wait here until the move
// is done, so none is overwritten by it.
func (c *Connector) switchTimeline(p primaryPos) bool {
	c.genMu.Lock()
	defer c.genMu.Unlock()
	cur := c.tli.Load()
	switch {
	case p.tli == cur:
		return true
	case p.tli < cur:
		return false
	}
	if cur != 0 {
		c.db.wm.Set(p.lsn)
	}
	c.tli.Store(p.tli)
	return true
}

// noteTimeline records, for this connector's stats and log, the writer's
// timeline as its connections see it: the timeline itself is the cluster
// scope's, shared with the process's other connectors to the same writer,
// and whichever saw the new one first moved the shared watermark.
func (c *Connector) noteTimeline(tli uint32) {
	for {
		old := c.seenTLI.Load()
		if tli <= old {
			return
		}
		if c.seenTLI.CompareAndSwap(old, tli) {
			if old != 0 {
				c.stats.writerChanges.Add(1)
				c.logAt(slog.LevelWarn, "pgryw: the writer changed (a new timeline): watermarks of the old history move to the new writer's position",
					slog.Uint64("old_timeline", uint64(old)), slog.Uint64("new_timeline", uint64(tli)))
			}
			return
		}
	}
}

// genAt returns the generation of a position read on b's writer on
// timeline tli: no generation while the system identifier is not known
// (see generationOf).
func (c *Connector) genAt(ctx context.Context, b *backend, tli uint32) generation {
	g := c.generationOf(ctx, b)
	if g == (generation{}) {
		return g
	}
	g.timeline = tli
	return g
}

// newer reports that a is a later timeline of b's system: a position from a
// writer newer than the one this connection reaches, which must not be
// moved back onto the older history.
func newer(a, b generation) bool {
	return a.system == b.system && a.timeline > b.timeline
}
