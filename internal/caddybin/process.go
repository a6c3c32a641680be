package caddybin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// StartCaddy writes caddyfile to dir/name.Caddyfile and starts bin on it,
// its data and config folders in dir and its output in dir/name.log. attr,
// when not nil, is the child's process attributes (a parent-death signal,
// say).
func StartCaddy(bin, dir, name, caddyfile string, attr *syscall.SysProcAttr) (*exec.Cmd, error) {
	path := filepath.Join(dir, name+".Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "run", "--config", path, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	cmd.SysProcAttr = attr
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return cmd, nil
}

// CPUTime is the user and system CPU time process pid has used, read from
// /proc/<pid>/stat (0 where that cannot be read, or for pid 0).
func CPUTime(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name, which is in parentheses.
	st := string(b)
	f := strings.Fields(st[strings.LastIndexByte(st, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	sy, _ := strconv.ParseInt(f[12], 10, 64)
	const hz = 100 // USER_HZ on Linux
	return time.Duration(ut+sy) * time.Second / hz
}

// KillAll kills the processes a benchmark started and waits for each.
func KillAll(procs []*exec.Cmd) {
	for _, p := range procs {
		p.Process.Kill()
		p.Wait()
	}
}
