package redisstore

import (
	"os/exec"
	"syscall"
)

// setDeathSignal has the kernel kill the server if the test binary dies
// without running its cleanup.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
