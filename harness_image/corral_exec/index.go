package main

// The tree index behind /v1/files/find: every regular file of one name under the root, found
// again cheaply. A directory whose mtime has not changed since it was listed is not listed
// again (creating, removing or renaming an entry changes its directory's mtime), unless it was
// listed within racyWindow of its last change: the filesystem's clock is coarse, so a change in
// the same tick could keep the mtime. The harness's in-process workspace keeps the same rules
// (corral_harness/context/instructions.py, NamedFileIndex).

import (
	"sync"
	"time"
)

// A directory changed this recently is listed again even when its mtime looks unchanged.
const racyWindow = 2 * time.Second

type listing struct {
	mtimeNs int64
	trusted bool // listed at least racyWindow after its last change
	subdirs []string
	has     bool // holds an entry of the index's name that was a regular file
}

type treeIndex struct {
	mu   sync.Mutex
	root string
	name string
	dirs map[string]*listing // by path relative to the root ("" for the root)
}

type match struct {
	Rel, Full string
	Size      int64
	MtimeNs   int64
}

// briefStat is what a scan needs of an lstat: the kind, the size and the mtime.
type briefStat struct {
	kind    int
	size    int64
	mtimeNs int64
}

const (
	kindOther = iota
	kindDir
	kindRegular
)

// scan walks the tree (.git and symlinked directories skipped) and answers every match.
func (t *treeIndex) scan() []match {
	matches, _ := t.scanNoting()
	return matches
}

// scanNoting is scan, also saying whether the root's own listing could have changed since the
// last scan (it was listed again, or could not be kept).
func (t *treeIndex) scanNoting() ([]match, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rootBefore := t.dirs[""]
	root := t.newWalk(time.Now().UnixNano(), []string{""})
	root.step() // the root alone: its subdirectories are what the walkers share out
	subtrees := root.stack
	walks := []*walk{root}
	if len(subtrees) < 2*scanWorkers {
		root.run()
	} else {
		// A scan runs after every command, on the step's critical path, and is nearly all
		// stats: the root's subtrees are walked by a few goroutines at once (each with its
		// own results, merged below), so a second core shortens it.
		root.stack = nil
		var wg sync.WaitGroup
		for i := range scanWorkers {
			var share []string
			for j := i; j < len(subtrees); j += scanWorkers {
				share = append(share, subtrees[j])
			}
			w := t.newWalk(root.now, share)
			walks = append(walks, w)
			wg.Add(1)
			go func() {
				defer wg.Done()
				w.run()
			}()
		}
		wg.Wait()
	}
	dirs := make(map[string]*listing, len(t.dirs))
	matches := []match{}
	for _, w := range walks {
		for rel, entry := range w.dirs {
			dirs[rel] = entry
		}
		matches = append(matches, w.matches...)
	}
	t.dirs = dirs
	return matches, rootBefore == nil || dirs[""] != rootBefore
}

// scanWorkers is how many goroutines walk a large tree's subtrees at once.
const scanWorkers = 4

// walk is one goroutine's part of a scan: it reads the previous listings (t.dirs, not written
// during a scan) and keeps what it finds to itself.
type walk struct {
	t       *treeIndex
	now     int64
	stack   []string
	dirs    map[string]*listing
	matches []match
	buf     []byte
}

func (t *treeIndex) newWalk(now int64, stack []string) *walk {
	return &walk{t: t, now: now, stack: stack, dirs: map[string]*listing{}, buf: make([]byte, 64<<10)}
}

func (w *walk) run() {
	for len(w.stack) > 0 {
		w.step()
	}
}

// step visits the directory on top of the stack: lists it again only when it may have changed,
// pushes its subdirectories and notes its match.
func (w *walk) step() {
	t := w.t
	rel := w.stack[len(w.stack)-1]
	w.stack = w.stack[:len(w.stack)-1]
	full := t.root
	if rel != "" {
		full = t.root + "/" + rel
	}
	st, ok := lstatBrief(full)
	if !ok || st.kind != kindDir {
		return
	}
	mtime := st.mtimeNs
	entry := t.dirs[rel]
	if entry == nil || !entry.trusted || entry.mtimeNs != mtime {
		subdirs, has, err := listDir(full, t.name, w.buf)
		if err != nil {
			return
		}
		entry = &listing{mtimeNs: mtime, trusted: mtime < w.now-int64(racyWindow), subdirs: subdirs, has: has}
	}
	w.dirs[rel] = entry
	for _, sub := range entry.subdirs {
		if rel == "" {
			w.stack = append(w.stack, sub)
		} else {
			w.stack = append(w.stack, rel+"/"+sub)
		}
	}
	if entry.has {
		file := full + "/" + t.name
		if fst, ok := lstatBrief(file); ok && fst.kind == kindRegular {
			childRel := t.name
			if rel != "" {
				childRel = rel + "/" + t.name
			}
			w.matches = append(w.matches, match{childRel, file, fst.size, fst.mtimeNs})
		}
	}
}

// dirNames are the directories the last scan walked, relative to the root.
func (t *treeIndex) dirNames() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	names := make([]string, 0, len(t.dirs))
	for rel := range t.dirs {
		names = append(names, rel)
	}
	return names
}

// indexFor answers the service's index of name, made on first use.
func (s *Service) indexFor(name string) *treeIndex {
	s.indexesMu.Lock()
	defer s.indexesMu.Unlock()
	if s.indexes == nil {
		s.indexes = map[string]*treeIndex{}
	}
	index := s.indexes[name]
	if index == nil {
		index = &treeIndex{root: s.Root.Path, name: name, dirs: map[string]*listing{}}
		s.indexes[name] = index
	}
	return index
}
