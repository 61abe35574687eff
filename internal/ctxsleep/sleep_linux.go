package ctxsleep

import (
	"syscall"
	"time"
)

const short = time.Millisecond

// threadSleep blocks the calling thread for d (plus its timer slack); the Go
// scheduler runs other goroutines on other threads meanwhile.
func threadSleep(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	for {
		var left syscall.Timespec
		if err := syscall.Nanosleep(&ts, &left); err != syscall.EINTR {
			return
		}
		ts = left
	}
}
