package main

import (
	"os"
	"path/filepath"
	"testing"
)

func layout(t *testing.T) (*Root, string) {
	t.Helper()
	base, _ := filepath.EvalSymlinks(t.TempDir())
	root, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
	for _, dir := range []string{root, outside, filepath.Join(root, "sub")} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(outside, "secret.txt"), []byte("secret"), 0o644)
	os.WriteFile(filepath.Join(root, "inside.txt"), []byte("ok"), 0o644)
	os.Symlink(outside, filepath.Join(root, "link-out"))
	os.Symlink(filepath.Join(outside, "secret.txt"), filepath.Join(root, "secret-link"))
	os.Symlink(filepath.Join(root, "sub"), filepath.Join(root, "link-in"))
	os.Symlink(filepath.Join(root, "not-yet", "dir"), filepath.Join(root, "dangling"))
	os.Symlink("loop-b", filepath.Join(root, "loop-a"))
	os.Symlink("loop-a", filepath.Join(root, "loop-b"))
	r, err := NewRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	return r, outside
}

func TestClassify(t *testing.T) {
	r, outside := layout(t)
	cases := map[string]Verdict{
		"inside.txt":                   Inside,
		".":                            Inside,
		"":                             Inside,
		"sub/../inside.txt":            Inside,
		"new/file.txt":                 Inside,
		"link-in/x.txt":                Inside,
		r.Path + "/inside.txt":         Inside,
		"../outside/secret.txt":        Outside,
		"sub/../../outside/secret.txt": Outside,
		"link-out/secret.txt":          Outside,
		"secret-link":                  Outside,
		outside + "/secret.txt":        Outside,
		"/etc/passwd":                  Outside,
		"dangling/file.txt":            Uncertain,
		"dangling":                     Uncertain,
		"loop-a/x":                     Uncertain,
		"bad\x00name":                  Uncertain,
		"bad\xffname":                  Uncertain,
	}
	for path, want := range cases {
		if got := r.Classify(path); got != want {
			t.Errorf("Classify(%q) = %s, want %s", path, got, want)
		}
	}
}

func TestResolveGivesTheRealRelativePathAndKind(t *testing.T) {
	r, _ := layout(t)
	for path, want := range map[string]Resolved{
		"link-in":    {Verdict: Inside, Rel: "sub", Kind: KindDir},
		"inside.txt": {Verdict: Inside, Rel: "inside.txt", Kind: KindFile},
		"nothing":    {Verdict: Inside, Rel: "nothing", Kind: KindMissing},
		".":          {Verdict: Inside, Rel: ".", Kind: KindDir},
	} {
		got := r.Resolve(path)
		got.Real = ""
		if got != want {
			t.Errorf("Resolve(%q) = %+v, want %+v", path, got, want)
		}
	}
}

func TestLoneSurrogateEscapesAreSuspect(t *testing.T) {
	for body, want := range map[string]bool{
		`{"path":"a\udc80"}`:       true,
		`{"path":"a\ud800b"}`:      true,
		`{"path":"a\ud83d\ude00"}`: false,
		`{"path":"a\\udc80"}`:      false,
		`{"path":"plain \u00e9"}`:  false,
	} {
		if got := hasLoneSurrogate([]byte(body)); got != want {
			t.Errorf("hasLoneSurrogate(%s) = %v", body, got)
		}
	}
}

func TestFnmatch(t *testing.T) {
	for _, c := range []struct {
		pattern, name string
		want          bool
	}{
		{"*.py", "a.py", true}, {"*.py", ".hidden.py", true}, {"*.py", "a.pyc", false},
		{"?.txt", "a.txt", true}, {"[ab].go", "b.go", true}, {"[!ab].go", "b.go", false},
		{"[!ab].go", "c.go", true}, {"[]].x", "].x", true}, {"a[", "a[", true}, {"A*", "a", false},
	} {
		re, err := fnmatchRegexp(c.pattern)
		if err != nil {
			t.Fatal(err)
		}
		if got := re.MatchString(c.name); got != c.want {
			t.Errorf("%q ~ %q = %v", c.pattern, c.name, got)
		}
	}
}
