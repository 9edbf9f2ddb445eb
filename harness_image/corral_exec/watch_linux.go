//go:build linux

package main

// The survey's change signal without the scan (ADR 0088). After every command the service
// told the harness whether the instruction files, the root's entries or .git/HEAD had changed
// by scanning: a stat per directory and per AGENTS.md, on the step's critical path. With
// inotify watches on the directories the scan walks (and on .git), the kernel queues an event
// for every change there as it happens, so once a command has exited one non-blocking read
// says whether anything that matters moved; only then is the tree scanned. Events about other
// files (the command's own output, a build) are read and dropped. When watches cannot be had
// (no inotify, the user's limit, a tree too large) or events were lost, every check scans, as
// before.

import (
	"strings"
	"sync"
	"syscall"
	"unsafe"
)

// More directories than this and the tree is scanned after every command instead: each watch
// holds kernel memory, and the user's watches are shared with everything else it runs.
const maxWatchedDirs = 16384

const watchMask = syscall.IN_CREATE | syscall.IN_DELETE | syscall.IN_MOVED_FROM |
	syscall.IN_MOVED_TO | syscall.IN_MODIFY | syscall.IN_ATTRIB | syscall.IN_CLOSE_WRITE |
	syscall.IN_DELETE_SELF | syscall.IN_MOVE_SELF | syscall.IN_ONLYDIR | syscall.IN_DONT_FOLLOW |
	syscall.IN_EXCL_UNLINK

type treeWatch struct {
	mu     sync.Mutex
	fd     int
	root   string
	dirOf  map[int32]string // watch descriptor -> directory relative to the root ("" the root)
	wdOf   map[string]int32
	clean  map[string]bool // by file name: scanned, and nothing that matters seen since
	failed bool            // a watch could not be added: every check scans
	buf    []byte
}

func newTreeWatch(root string) *treeWatch {
	fd, err := syscall.InotifyInit1(syscall.IN_NONBLOCK | syscall.IN_CLOEXEC)
	if err != nil {
		return nil
	}
	return &treeWatch{
		fd: fd, root: root, dirOf: map[int32]string{}, wdOf: map[string]int32{},
		clean: map[string]bool{}, buf: make([]byte, 64<<10),
	}
}

// unchanged reports whether nothing that matters to a survey of name changed since its last
// scan: then the last scan's generation still holds.
func (w *treeWatch) unchanged(name string) bool {
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.drain()
	return !w.failed && w.clean[name]
}

// beforeScan is called as a scan of name starts: every event queued until now is accounted
// for by that scan; any later one will be read by the next check.
func (w *treeWatch) beforeScan(name string) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.drain()
	w.clean[name] = true
}

// afterScan watches every directory the scan walked (and .git, for HEAD). A directory watched
// only now may have changed between its listing and its watch, so the next check scans again.
func (w *treeWatch) afterScan(name string, dirs []string) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failed {
		return
	}
	if len(dirs) > maxWatchedDirs {
		w.failed = true
		return
	}
	added := false
	for _, rel := range append(dirs, ".git") {
		if _, ok := w.wdOf[rel]; ok {
			continue
		}
		full := w.root
		if rel != "" {
			full = w.root + "/" + rel
		}
		wd, err := syscall.InotifyAddWatch(w.fd, full, watchMask)
		if err != nil {
			if rel == ".git" || err == syscall.ENOENT || err == syscall.ENOTDIR {
				continue // no .git, or a directory gone since the scan: its parent's event says so
			}
			w.failed = true // the user's limit, most likely: scan after every command
			return
		}
		if old, ok := w.dirOf[int32(wd)]; ok && w.wdOf[old] == int32(wd) {
			delete(w.wdOf, old) // the same directory under a new name (it was moved)
		}
		w.dirOf[int32(wd)] = rel
		w.wdOf[rel] = int32(wd)
		added = true
	}
	if added {
		w.clean[name] = false
	}
}

// drain reads every queued event and forgets the scans they may have outdated. Called with
// w.mu held.
func (w *treeWatch) drain() {
	for {
		n, err := syscall.Read(w.fd, w.buf)
		if err != nil || n <= 0 {
			return // EAGAIN: nothing more queued
		}
		for off := 0; off+syscall.SizeofInotifyEvent <= n; {
			ev := (*syscall.InotifyEvent)(unsafe.Pointer(&w.buf[off]))
			nameBytes := w.buf[off+syscall.SizeofInotifyEvent : off+syscall.SizeofInotifyEvent+int(ev.Len)]
			off += syscall.SizeofInotifyEvent + int(ev.Len)
			length := 0
			for length < len(nameBytes) && nameBytes[length] != 0 {
				length++
			}
			w.note(ev.Wd, ev.Mask, string(nameBytes[:length]))
		}
	}
}

// note takes one event: whatever may change a survey marks the names it concerns unscanned.
func (w *treeWatch) note(wd int32, mask uint32, entry string) {
	dir, known := w.dirOf[wd]
	all := false
	switch {
	case mask&syscall.IN_Q_OVERFLOW != 0: // events were lost
		all = true
	case mask&syscall.IN_IGNORED != 0: // the watch is gone (its directory removed)
		if known {
			if w.wdOf[dir] == wd {
				delete(w.wdOf, dir)
			}
			delete(w.dirOf, wd)
		}
		all = true
	case known && mask&syscall.IN_MOVE_SELF != 0:
		// Whatever is at its old path (or below it) now is another directory, which the next
		// scan must watch anew; the moved ones keep their watches (mapped again where a scan
		// walks them).
		for rel := range w.wdOf {
			if dir == "" || rel == dir || strings.HasPrefix(rel, dir+"/") {
				delete(w.wdOf, rel)
			}
		}
		all = true
	case !known:
		all = true
	case dir == ".git":
		all = entry == "HEAD"
	case mask&(syscall.IN_ISDIR|syscall.IN_DELETE_SELF|syscall.IN_MOVE_SELF) != 0:
		all = true // the tree's shape: a directory made, removed, moved
	case dir == "" && mask&(syscall.IN_CREATE|syscall.IN_DELETE|syscall.IN_MOVED_FROM|syscall.IN_MOVED_TO) != 0:
		all = true // the root's entries
	}
	for name := range w.clean {
		if all || name == entry {
			w.clean[name] = false
		}
	}
}
