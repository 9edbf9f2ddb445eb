//go:build linux

package main

import (
	"os"
	"path/filepath"
	"testing"
)

// After a command that touched nothing a survey reads, the exit event's generation comes from
// the watch alone (no scan); every change that matters, made by a command or by anyone else
// between commands, still moves it.
func TestTheWatchSparesScansAndMissesNoChange(t *testing.T) {
	root := oldTree(t, map[string]string{
		"AGENTS.md": "root rules\n", "pkg/AGENTS.md": "pkg rules\n", "pkg/deep/code.py": "x = 1\n",
		".git/HEAD": "ref: refs/heads/main\n",
	})
	service, socket := startService(t, root)
	c := client(socket)
	status, first := post(t, c, "/v1/files/survey", map[string]any{"name": "AGENTS.md"})
	if status != 200 {
		t.Fatalf("survey answered %d", status)
	}
	g := generationOf(t, first)
	after := func(script string) float64 {
		t.Helper()
		events, output := execEvents(t, c, map[string]any{"argv": []string{"/bin/sh", "-c", script}})
		exit := events[len(events)-1]
		if exit["exitCode"].(float64) != 0 {
			t.Fatalf("%q failed: %s", script, output)
		}
		return exit["surveys"].(map[string]any)["AGENTS.md"].(float64)
	}
	// The first command scans once more: the watches were added after the survey's listing.
	if after("true") != g {
		t.Fatal("nothing changed")
	}
	scans := service.scans.Load()
	for _, script := range []string{"true", "echo y > pkg/deep/code.py", "echo z > pkg/deep/new.txt; rm pkg/deep/new.txt"} {
		if after(script) != g {
			t.Fatalf("%q changed no survey, yet moved the generation", script)
		}
	}
	if got := service.scans.Load() - scans; got != 0 {
		t.Fatalf("%d scans after commands that changed nothing a survey reads", got)
	}

	// A change made between commands, by someone else: the next command's exit reports it.
	os.WriteFile(filepath.Join(root, "pkg", "AGENTS.md"), []byte("edited by a person\n"), 0o644)
	next := after("true")
	if next == g {
		t.Fatal("an AGENTS.md edited between commands kept the generation")
	}
	g = next
	// A directory moved away and another made in its place: the new one is watched too.
	next = after("mv pkg moved && mkdir -p pkg/deep && echo new > pkg/deep/AGENTS.md")
	if next == g {
		t.Fatal("a moved directory kept the generation")
	}
	g = next
	for range 3 { // settle: the replaced directory's watch is mended by the scans this causes
		g = after("true")
	}
	os.WriteFile(filepath.Join(root, "pkg", "deep", "AGENTS.md"), []byte("edited again\n"), 0o644)
	if after("true") == g {
		t.Fatal("an edit in a directory made in place of a moved one kept the generation")
	}
}
