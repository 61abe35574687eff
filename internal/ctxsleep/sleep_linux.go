package ctxsleep

import (
	"syscall"
	"time"
)

const short = time.Millisecond

// prSetTimerSlack is prctl's PR_SET_TIMERSLACK (linux/prctl.h), and
// timerSlack the slack threadSleep asks for.
const (
	prSetTimerSlack = 29
	timerSlack      = time.Microsecond
)

// threadSleep blocks the calling thread for d (plus its timer slack, which
// it first sets to timerSlack); the Go scheduler runs other goroutines on
// other threads meanwhile.
func threadSleep(d time.Duration) {
	// The default slack, 50 µs, is more than the sleeps this is for (a
	// replica's replay 20 µs from now): nanosleep(20 µs) took 110 µs at
	// the median on a 2-vCPU virtual machine, and 52 µs with 1 µs of
	// slack. The goroutine may be on any of the runtime's threads, so the
	// setting is made before every sleep (a system call of well under a
	// microsecond); it stays with the thread after.
	syscall.RawSyscall(syscall.SYS_PRCTL, prSetTimerSlack, uintptr(timerSlack), 0)
	ts := syscall.NsecToTimespec(int64(d))
	for {
		var left syscall.Timespec
		if err := syscall.Nanosleep(&ts, &left); err != syscall.EINTR {
			return
		}
		ts = left
	}
}
