package main

// The tree index behind /v1/files/find: every regular file of one name under the root, found
// again cheaply. A directory whose mtime has not changed since it was listed is not listed
// again (creating, removing or renaming an entry changes its directory's mtime), unless it was
// listed within racyWindow of its last change: the filesystem's clock is coarse, so a change in
// the same tick could keep the mtime. The harness's in-process workspace keeps the same rules
// (corral_harness/context/instructions.py, NamedFileIndex).

import (
	"os"
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
	now := time.Now().UnixNano()
	dirs := make(map[string]*listing, len(t.dirs))
	matches := []match{}
	stack := []string{""}
	buf := make([]byte, 64<<10)
	for len(stack) > 0 {
		rel := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		full := t.root
		if rel != "" {
			full = t.root + "/" + rel
		}
		info, err := os.Lstat(full)
		if err != nil || !info.IsDir() {
			continue
		}
		mtime := info.ModTime().UnixNano()
		entry := t.dirs[rel]
		if entry == nil || !entry.trusted || entry.mtimeNs != mtime {
			subdirs, has, err := listDir(full, t.name, buf)
			if err != nil {
				continue
			}
			entry = &listing{mtimeNs: mtime, trusted: mtime < now-int64(racyWindow), subdirs: subdirs, has: has}
		}
		dirs[rel] = entry
		for _, sub := range entry.subdirs {
			if rel == "" {
				stack = append(stack, sub)
			} else {
				stack = append(stack, rel+"/"+sub)
			}
		}
		if entry.has {
			file := full + "/" + t.name
			if info, err := os.Lstat(file); err == nil && info.Mode().IsRegular() {
				childRel := t.name
				if rel != "" {
					childRel = rel + "/" + t.name
				}
				matches = append(matches, match{childRel, file, info.Size(), info.ModTime().UnixNano()})
			}
		}
	}
	t.dirs = dirs
	return matches, rootBefore == nil || dirs[""] != rootBefore
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
