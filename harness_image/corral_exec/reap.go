package main

// When the service is its container's first process, orphans of killed process groups are
// re-parented to it and must be reaped, or they stay zombies. Only children the service is not
// waiting for itself are reaped: a child being started or run is registered under childrenMu.

import (
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

var (
	childrenMu sync.Mutex
	children   = map[int]bool{}
)

func startChild(cmd *exec.Cmd) error {
	childrenMu.Lock()
	defer childrenMu.Unlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	children[cmd.Process.Pid] = true
	return nil
}

func childDone(pid int) {
	childrenMu.Lock()
	delete(children, pid)
	childrenMu.Unlock()
}

func reapOrphans() {
	if os.Getpid() != 1 {
		return
	}
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, syscall.SIGCHLD)
	go func() {
		for range signals {
			reapZombies()
		}
	}()
}

func reapZombies() {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	childrenMu.Lock()
	defer childrenMu.Unlock()
	for _, entry := range entries {
		pid, err := strconv.Atoi(entry.Name())
		if err != nil || children[pid] {
			continue
		}
		stat, err := os.ReadFile("/proc/" + entry.Name() + "/stat")
		if err != nil {
			continue
		}
		// "pid (comm) S ppid ...": the command name may hold spaces and parentheses.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) >= 2 && fields[0] == "Z" && fields[1] == "1" {
			var status syscall.WaitStatus
			_, _ = syscall.Wait4(pid, &status, syscall.WNOHANG, nil)
		}
	}
}
