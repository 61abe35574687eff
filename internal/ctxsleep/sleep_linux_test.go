package ctxsleep

import (
	"runtime"
	"syscall"
	"testing"
	"time"
)

// A short sleep sets its thread's timer slack to timerSlack first: with
// Linux's default, 50 µs, a sleep of 20 µs takes several times that.
func TestShortSleepSetsTimerSlack(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	const prGetTimerSlack = 30
	before, _, _ := syscall.RawSyscall(syscall.SYS_PRCTL, prGetTimerSlack, 0, 0)
	defer syscall.RawSyscall(syscall.SYS_PRCTL, prSetTimerSlack, before, 0)
	threadSleep(time.Microsecond)
	if got, _, _ := syscall.RawSyscall(syscall.SYS_PRCTL, prGetTimerSlack, 0, 0); time.Duration(got) != timerSlack {
		t.Fatalf("timer slack %v after a short sleep, want %v", time.Duration(got), timerSlack)
	}
}
