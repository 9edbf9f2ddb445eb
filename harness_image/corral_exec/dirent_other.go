//go:build !linux

package main

import "os"

// listDir: the subdirectories (symlinks not followed; .git left out) and whether a regular
// file called name is there.
func listDir(dir, name string, _ []byte) ([]string, bool, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, false, err
	}
	var subdirs []string
	has := false
	for _, entry := range entries {
		switch {
		case entry.IsDir():
			if entry.Name() != ".git" {
				subdirs = append(subdirs, entry.Name())
			}
		case entry.Type().IsRegular() && entry.Name() == name:
			has = true
		}
	}
	return subdirs, has, nil
}

// lstatBrief: the kind, size and mtime of path, not following a symlink.
func lstatBrief(path string) (briefStat, bool) {
	info, err := os.Lstat(path)
	if err != nil {
		return briefStat{}, false
	}
	kind := kindOther
	switch {
	case info.IsDir():
		kind = kindDir
	case info.Mode().IsRegular():
		kind = kindRegular
	}
	return briefStat{kind, info.Size(), info.ModTime().UnixNano()}, true
}
