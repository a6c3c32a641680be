package main

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const cpuSupported = true

// cpuOf is the CPU time process pid has used so far: the sum of its
// threads' run time (se.sum_exec_runtime, in milliseconds with six
// decimals). A thread that exited is no longer counted; the Go runtime
// keeps its threads.
func cpuOf(pid int) time.Duration {
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/sched")
	var sum time.Duration
	for _, t := range tasks {
		f, err := os.Open(t)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if !ok || strings.TrimSpace(k) != "se.sum_exec_runtime" {
				continue
			}
			if ms, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
				sum += time.Duration(ms * float64(time.Millisecond))
			}
			break
		}
		f.Close()
	}
	return sum
}

// rusageOf is the user + system time getrusage reports of an exited child.
func rusageOf(ps *os.ProcessState) (time.Duration, bool) {
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok || ru == nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano()) + time.Duration(ru.Stime.Nano()), true
}

// childAttr makes a child process die with this one.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
