//go:build !linux

package main

// Without inotify every check scans (watch_linux.go).
type treeWatch struct{}

func newTreeWatch(string) *treeWatch { return nil }

func (w *treeWatch) unchanged(string) bool { return false }

func (w *treeWatch) beforeScan(string) {}

func (w *treeWatch) afterScan(string, []string) {}
