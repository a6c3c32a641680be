//go:build !linux

package main

import (
	"os"
	"syscall"
	"time"
)

// The CPU time of another process is read from /proc: Linux only.
const cpuSupported = false

func cpuOf(int) time.Duration                         { return 0 }
func rusageOf(*os.ProcessState) (time.Duration, bool) { return 0, false }
func childAttr() *syscall.SysProcAttr                 { return nil }
