package pgryw

import "testing"

// The replica executor's outcome table: what each attempt's outcome leads
// to, and what it does to the node.
func TestNextStep(t *testing.T) {
	want := map[outcome]step{
		outAnswer:           stepDone,
		outFailed:           stepFail,
		outPositionLost:     stepPrimary,
		outCheckRefused:     stepOther,
		outCheckFault:       stepOther,
		outNotStandby:       stepOther,
		outCannotWait:       stepOther,
		outBusy:             stepOther,
		outUnchecked:        stepOther,
		outBehindPrimary:    stepPrimary,
		outSettingsRefused:  stepPrimary,
		outSettingsPooled:   stepPrimary,
		outUnbounded:        stepSame,
		outReadOnly:         stepPrimary,
		outRefusedByStandby: stepPrimary,
		outRefusedAsStandby: stepPrimary,
		outStaleDescription: stepSame,
		outIdleEnded:        stepSame,
		outFault:            stepOther,
		outNoReplica:        stepPrimary,
	}
	for o := outcome(0); o < outcomes; o++ {
		if o == outBehind {
			continue // on_timeout turns it into outBehindPrimary, outFailed or the answer
		}
		w, ok := want[o]
		if !ok {
			t.Errorf("outcome %d has no row here", o)
			continue
		}
		if got := next(o, false); got != w {
			t.Errorf("outcome %d: step %d, want %d", o, got, w)
		}
	}
	// A stale description is read again once on the same replica, then
	// elsewhere.
	if got := next(outStaleDescription, true); got != stepOther {
		t.Errorf("a second stale description: step %d, want another replica", got)
	}
	// Only connection faults and refusals mark the node; only what may
	// hold a lock pgryw did not take closes a connection that is open.
	for o, e := range effects {
		switch outcome(o) {
		case outCheckRefused, outRefusedByStandby:
			if e.event != eventRefused {
				t.Errorf("outcome %d: event %d, want refused", o, e.event)
			}
		case outCheckFault:
			if e.event != eventDown {
				t.Errorf("outcome %d: event %d, want down", o, e.event)
			}
		case outFault:
			if e.event != eventGone {
				t.Errorf("outcome %d: event %d, want down once closed", o, e.event)
			}
		default:
			if e.event != eventNone {
				t.Errorf("outcome %d: event %d, want none", o, e.event)
			}
		}
		if (e.conn == dropConn) != (outcome(o) == outCannotWait) {
			t.Errorf("outcome %d: conn rule %d", o, e.conn)
		}
	}
}
