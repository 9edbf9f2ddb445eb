package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// oldTree writes files (path -> content) under a fresh root with mtimes long past the racy
// window, so that an unchanged tree can be answered "unchanged".
func oldTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root, _ := filepath.EvalSymlinks(t.TempDir())
	for rel, content := range files {
		path := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-time.Hour)
	filepath.Walk(root, func(path string, _ os.FileInfo, _ error) error {
		return os.Chtimes(path, old, old)
	})
	return root
}

func generationOf(t *testing.T, answer map[string]any) float64 {
	t.Helper()
	g, ok := answer["generation"].(float64)
	if !ok || g < 1 {
		t.Fatalf("no generation in %v", answer)
	}
	return g
}

func paths(answer map[string]any) []string {
	var out []string
	for _, f := range answer["files"].([]any) {
		out = append(out, f.(map[string]any)["path"].(string))
	}
	slices.Sort(out)
	return out
}

func TestSurveyGenerationFollowsWhatCommandsChange(t *testing.T) {
	root := oldTree(t, map[string]string{
		"AGENTS.md": "root rules\n", "pkg/AGENTS.md": "pkg rules\n", "pkg/code.py": "x = 1\n",
		".git/HEAD": "ref: refs/heads/main\n",
	})
	_, socket := startService(t, root)
	c := client(socket)
	survey := func(since float64) map[string]any {
		status, answer := post(t, c, "/v1/files/survey", map[string]any{"name": "AGENTS.md", "since": since})
		if status != 200 {
			t.Fatalf("survey answered %d: %v", status, answer)
		}
		return answer
	}
	// The generation a command's exit event reports for AGENTS.md.
	after := func(script string) float64 {
		t.Helper()
		events, output := execEvents(t, c, map[string]any{"argv": []string{"/bin/sh", "-c", script}})
		exit := events[len(events)-1]
		if exit["exitCode"].(float64) != 0 {
			t.Fatalf("%q failed: %s", script, output)
		}
		surveys, ok := exit["surveys"].(map[string]any)
		if !ok {
			t.Fatalf("no survey generations in the exit event %v", exit)
		}
		return surveys["AGENTS.md"].(float64)
	}

	events, _ := execEvents(t, c, map[string]any{"argv": []string{"/bin/true"}})
	if _, ok := events[len(events)-1]["surveys"]; ok {
		t.Fatal("a command before any survey should report no generations")
	}
	first := survey(0)
	g := generationOf(t, first)
	if got := paths(first); !slices.Equal(got, []string{"AGENTS.md", "pkg/AGENTS.md"}) {
		t.Fatalf("first survey: %v", got)
	}
	if again := survey(g); again["unchanged"] != true || generationOf(t, again) != g || again["files"] != nil {
		t.Fatalf("an unchanged tree should be answered unchanged, without files: %v", again)
	}
	if after("echo hello > pkg/code.py; touch -d @1 pkg/code.py") != g {
		t.Fatal("editing a file that is no AGENTS.md should keep the generation")
	}

	steps := []struct {
		script string
		want   []string // the survey's files after it; nil: the same as before
		head   string   // .git/HEAD after it, when it says
	}{
		{"mkdir -p new/deep && echo deep > new/deep/AGENTS.md && touch -d @1 new/deep/AGENTS.md",
			[]string{"AGENTS.md", "new/deep/AGENTS.md", "pkg/AGENTS.md"}, ""},
		{"echo 'pkg rules, longer now' > pkg/AGENTS.md && touch -d @1 pkg/AGENTS.md", nil, ""},
		{"touch -d @2 AGENTS.md", nil, ""}, // same size, another mtime
		{"rm pkg/AGENTS.md", []string{"AGENTS.md", "new/deep/AGENTS.md"}, ""},
		{"mv new renamed", []string{"AGENTS.md", "renamed/deep/AGENTS.md"}, ""},
		// The root's entries.
		{"touch -d @1 top-level.txt", nil, ""},
		// The branch, and again with the same size and mtime but another inode (git renames
		// its lockfile over HEAD).
		{"echo 'ref: refs/heads/other' > .git/HEAD; touch -d @1 .git/HEAD", nil, "ref: refs/heads/other\n"},
		{"printf 'ref: refs/heads/0ther\\n' > .git/HEAD.lock && touch -d @1 .git/HEAD.lock && mv .git/HEAD.lock .git/HEAD",
			nil, "ref: refs/heads/0ther\n"},
	}
	for _, step := range steps {
		next := after(step.script)
		if next == g {
			t.Fatalf("%q kept the generation %v", step.script, g)
		}
		answer := survey(g)
		if answer["unchanged"] == true || generationOf(t, answer) != next {
			t.Fatalf("after %q the survey since %v answered %v (want generation %v)", step.script, g, answer, next)
		}
		if head, _ := answer["gitHead"].(string); step.head != "" && head != step.head {
			t.Fatalf("after %q: HEAD %q, want %q", step.script, head, step.head)
		}
		if step.want != nil && !slices.Equal(paths(answer), step.want) {
			t.Fatalf("after %q: %v, want %v", step.script, paths(answer), step.want)
		}
		g = next
	}
	if after("true") != g {
		t.Fatal("a command that changes nothing should keep the generation")
	}
}

func TestSurveyIsNeverUnchangedWhileAFileIsRacy(t *testing.T) {
	root := oldTree(t, map[string]string{"AGENTS.md": "old\n"})
	os.WriteFile(filepath.Join(root, "AGENTS.md"), []byte("new\n"), 0o644) // same size, now
	_, socket := startService(t, root)
	c := client(socket)
	_, first := post(t, c, "/v1/files/survey", map[string]any{"name": "AGENTS.md"})
	g := generationOf(t, first)
	_, again := post(t, c, "/v1/files/survey", map[string]any{"name": "AGENTS.md", "since": g})
	if again["unchanged"] == true || generationOf(t, again) == g {
		t.Fatalf("a file changed within the racy window must be read again: %v", again)
	}
}
