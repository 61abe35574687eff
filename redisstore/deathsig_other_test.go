//go:build !linux

package redisstore

import "os/exec"

func setDeathSignal(*exec.Cmd) {}
