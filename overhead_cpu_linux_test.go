package pgryw_test

import (
	"runtime"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// threadCPU returns the CPU time the calling OS thread has used
// (CLOCK_THREAD_CPUTIME_ID), user and system.
func threadCPU() time.Duration {
	var ts syscall.Timespec
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 3, uintptr(unsafe.Pointer(&ts)), 0) // 3: CLOCK_THREAD_CPUTIME_ID
	return time.Duration(ts.Nano())
}

// BenchmarkReplicaReadCPU measures what BenchmarkReplicaReadOverhead times,
// in CPU instead: the CPU time the benchmark's thread (locked to it) spends
// on one replica read with no watermark pending, through pgx's driver and
// through pgryw, alternating. Latency on an idle machine hides client CPU
// under the round trip; on a busy one (rywbench at 4 workers on 2 cores)
// every microsecond of it is a microsecond the servers do not get. The
// thread's clock counts the system calls the read makes on it, not the
// work of the Go runtime's other threads (the network poller's wakeups).
func BenchmarkReplicaReadCPU(b *testing.B) {
	plain, ryw := replicaReadPools(b)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var cPlain, cRyw time.Duration
	b.ReportAllocs()
	alternate(b, plain, ryw, 200, pointQueryBy(b, threadCPU), func(p, r time.Duration) { cPlain, cRyw = cPlain+p, cRyw+r })
	n := float64(b.N)
	b.ReportMetric(float64(cPlain.Nanoseconds())/n, "pgx-cpu-ns")
	b.ReportMetric(float64(cRyw.Nanoseconds())/n, "pgryw-cpu-ns")
	b.ReportMetric(float64((cRyw-cPlain).Nanoseconds())/n, "extra-cpu-ns")
	b.ReportMetric(float64(cRyw)/float64(cPlain), "pgryw/pgx-cpu")
}
