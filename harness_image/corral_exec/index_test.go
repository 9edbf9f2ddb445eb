package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestIndexFindsChangesInOldDirectories(t *testing.T) {
	root, _ := filepath.EvalSymlinks(t.TempDir())
	for _, dir := range []string{"a/b", "c", ".git", "d"} {
		os.MkdirAll(filepath.Join(root, dir), 0o755)
	}
	for _, file := range []string{"AGENTS.md", "a/b/AGENTS.md", ".git/AGENTS.md", "c/other.md"} {
		os.WriteFile(filepath.Join(root, file), []byte(file), 0o644)
	}
	os.Symlink(filepath.Join(root, "a"), filepath.Join(root, "link"))
	old := time.Now().Add(-10 * time.Minute)
	filepath.Walk(root, func(path string, info os.FileInfo, err error) error {
		return os.Chtimes(path, old, old)
	})
	index := &treeIndex{root: root, name: "AGENTS.md", dirs: map[string]*listing{}}
	rels := func() []string {
		var out []string
		for _, m := range index.scan() {
			out = append(out, m.Rel)
		}
		slices.Sort(out)
		return out
	}
	if got := rels(); !slices.Equal(got, []string{"AGENTS.md", "a/b/AGENTS.md"}) {
		t.Fatalf("first scan: %v", got)
	}
	if !index.dirs["a/b"].trusted {
		t.Fatal("an old directory's listing should be trusted")
	}
	os.WriteFile(filepath.Join(root, "c", "AGENTS.md"), []byte("new"), 0o644)
	os.Remove(filepath.Join(root, "a", "b", "AGENTS.md"))
	if got := rels(); !slices.Equal(got, []string{"AGENTS.md", "c/AGENTS.md"}) {
		t.Fatalf("after changes: %v", got)
	}
	if index.dirs["c"].trusted {
		t.Fatal("a directory listed right after it changed must be listed again next time")
	}
}
