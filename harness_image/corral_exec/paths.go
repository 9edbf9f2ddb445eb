package main

// The granted root: the same checks, in meaning, as corral_harness/paths.py. Symlinks and `..`
// are resolved before the check; a path with NUL or invalid UTF-8, or one whose final location
// hangs on a dangling symlink, is uncertain.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"
)

type Verdict string

const (
	Inside    Verdict = "inside"
	Outside   Verdict = "outside"
	Uncertain Verdict = "uncertain"
)

// Kind of what a resolved path names now.
type Kind string

const (
	KindFile    Kind = "file"
	KindDir     Kind = "dir"
	KindOther   Kind = "other"
	KindMissing Kind = "missing"
)

// Root is a granted root, held as its real path.
type Root struct {
	Path string
}

func NewRoot(path string) (*Root, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, fmt.Errorf("granted root %q: %w", path, err)
	}
	info, err := os.Stat(real)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return nil, fmt.Errorf("granted root %q is not a directory", path)
	}
	return &Root{Path: real}, nil
}

// Resolved is a path after the check.
type Resolved struct {
	Verdict Verdict
	Real    string // the real path, when inside
	Rel     string // relative to the root, "." for the root itself
	Kind    Kind
}

// candidate is the path as given, made absolute against the root, with empty and "." parts
// dropped but ".." kept: pathlib's view of it, which the probe below walks.
func (r *Root) candidate(path string) []string {
	full := path
	if !strings.HasPrefix(path, "/") {
		full = r.Path + "/" + path
	}
	parts := []string{}
	for _, part := range strings.Split(full, "/") {
		if part != "" && part != "." {
			parts = append(parts, part)
		}
	}
	return parts
}

func joinParts(parts []string) string {
	return "/" + strings.Join(parts, "/")
}

func (r *Root) within(path string) bool {
	return path == r.Path || r.Path == "/" || strings.HasPrefix(path, r.Path+"/")
}

// Classify says whether path, resolved, stays inside the root.
func (r *Root) Classify(path string) Verdict {
	if strings.ContainsRune(path, 0) || !utf8.ValidString(path) {
		return Uncertain
	}
	parts := r.candidate(path)
	if !r.within(realpath(joinParts(parts))) {
		return Outside
	}
	// realpath resolves what exists; a dangling symlink on the way leaves doubt.
	for {
		probe := joinParts(parts)
		if _, err := os.Stat(probe); err == nil {
			break
		}
		if info, err := os.Lstat(probe); err == nil && info.Mode()&os.ModeSymlink != 0 {
			return Uncertain
		}
		if len(parts) == 0 {
			break
		}
		parts = parts[:len(parts)-1]
	}
	return Inside
}

// Resolve checks path and, when it is inside, gives its real path and what it names.
func (r *Root) Resolve(path string) Resolved {
	verdict := r.Classify(path)
	if verdict != Inside {
		return Resolved{Verdict: verdict, Kind: KindMissing}
	}
	real := realpath(joinParts(r.candidate(path)))
	return Resolved{Verdict: Inside, Real: real, Rel: r.Rel(real), Kind: kindOf(real)}
}

// Rel is real relative to the root ("." for the root).
func (r *Root) Rel(real string) string {
	if real == r.Path {
		return "."
	}
	if r.Path == "/" {
		return strings.TrimPrefix(real, "/")
	}
	return strings.TrimPrefix(real, r.Path+"/")
}

func kindOf(real string) Kind {
	info, err := os.Stat(real)
	switch {
	case err != nil:
		return KindMissing
	case info.IsDir():
		return KindDir
	case info.Mode().IsRegular():
		return KindFile
	default:
		return KindOther
	}
}

// realpath is Python's os.path.realpath (not strict): symlinks of the parts that exist are
// resolved, missing parts are taken as written, and a symlink loop is left unresolved.
func realpath(path string) string {
	resolved, _ := joinRealpath("", path, map[string]*string{})
	return filepath.Clean(resolved)
}

func joinRealpath(path, rest string, seen map[string]*string) (string, bool) {
	if strings.HasPrefix(rest, "/") {
		rest = rest[1:]
		path = "/"
	}
	for rest != "" {
		var name string
		name, rest, _ = strings.Cut(rest, "/")
		if name == "" || name == "." {
			continue
		}
		if name == ".." {
			if path != "" {
				var base string
				path, base = splitPath(path)
				if base == ".." {
					path = joinPath(joinPath(path, ".."), "..")
				}
			} else {
				path = ".."
			}
			continue
		}
		next := joinPath(path, name)
		info, err := os.Lstat(next)
		if err != nil || info.Mode()&os.ModeSymlink == 0 {
			path = next
			continue
		}
		if cached, ok := seen[next]; ok {
			if cached != nil {
				path = *cached
				continue
			}
			return joinPath(next, rest), false // a symlink loop
		}
		seen[next] = nil
		target, err := os.Readlink(next)
		if err != nil {
			path = next
			continue
		}
		var ok bool
		path, ok = joinRealpath(path, target, seen)
		if !ok {
			return joinPath(path, rest), false
		}
		resolved := path
		seen[next] = &resolved
	}
	return path, true
}

func joinPath(dir, name string) string {
	if dir == "" || strings.HasSuffix(dir, "/") {
		return dir + name
	}
	return dir + "/" + name
}

func splitPath(path string) (string, string) {
	i := strings.LastIndex(path, "/")
	head, tail := path[:i+1], path[i+1:]
	if trimmed := strings.TrimRight(head, "/"); trimmed != "" {
		head = trimmed
	}
	return head, tail
}

// openInside opens a resolved path without following a final symlink and checks, on the open
// descriptor, that the file really is inside: a part swapped for a symlink after the check
// cannot lead the open out of the root.
func (r *Root) openInside(real string, flag int, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(real, flag|noFollow, perm)
	if err != nil {
		return nil, err
	}
	if opened, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd())); err == nil {
		if !r.within(opened) {
			f.Close()
			return nil, errOutside
		}
	}
	return f, nil
}

var errOutside = errors.New("the path left the granted root")
