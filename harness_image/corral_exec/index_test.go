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

// A root with many subtrees is walked by several goroutines: the matches and the kept listings
// must be those of one sequential walk, before and after changes deep in any subtree.
func TestIndexWalksManySubtreesLikeOneWalk(t *testing.T) {
	root, _ := filepath.EvalSymlinks(t.TempDir())
	want := []string{"AGENTS.md"}
	os.WriteFile(filepath.Join(root, "AGENTS.md"), []byte("root"), 0o644)
	for i := range 3 * scanWorkers {
		dir := filepath.Join(root, "pkg"+string(rune('a'+i)), "mod", "deep")
		os.MkdirAll(dir, 0o755)
		if i%2 == 0 {
			rel := "pkg" + string(rune('a'+i)) + "/mod/deep/AGENTS.md"
			os.WriteFile(filepath.Join(root, rel), []byte(rel), 0o644)
			want = append(want, rel)
		}
	}
	old := time.Now().Add(-10 * time.Minute)
	filepath.Walk(root, func(path string, info os.FileInfo, err error) error {
		return os.Chtimes(path, old, old)
	})
	index := &treeIndex{root: root, name: "AGENTS.md", dirs: map[string]*listing{}}
	check := func(when string, want []string) {
		t.Helper()
		var got []string
		for _, m := range index.scan() {
			got = append(got, m.Rel)
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("%s: %v, want %v", when, got, want)
		}
		// Every directory is kept once: 1 root + 3 per subtree.
		if len(index.dirs) != 1+3*3*scanWorkers {
			t.Fatalf("%s: %d listings kept", when, len(index.dirs))
		}
	}
	check("first scan", want)
	check("unchanged", want)
	os.WriteFile(filepath.Join(root, "pkgb/mod/deep/AGENTS.md"), []byte("new"), 0o644)
	os.Remove(filepath.Join(root, "pkga/mod/deep/AGENTS.md"))
	changed := slices.DeleteFunc(slices.Clone(want), func(s string) bool { return s == "pkga/mod/deep/AGENTS.md" })
	check("after changes", append(changed, "pkgb/mod/deep/AGENTS.md"))
}
