package main

// Glob patterns with the meaning of Python 3.11's pathlib (and of the harness's in-process
// glob, which implements the same rules): components match with fnmatch (`*` also matches a
// leading dot), `**` alone is this directory and every subdirectory (symlinked directories not
// descended), a trailing `/` keeps directories only. Matches come back relative to the root,
// sorted by their components; any under .git or whose real path leaves the root are left out.

import (
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
)

func (r *Root) Glob(base, pattern string, limit int) ([]string, bool, *apiError) {
	dirsOnly := strings.HasSuffix(pattern, "/")
	parts := []string{}
	for _, part := range strings.Split(pattern, "/") {
		if part != "" && part != "." {
			parts = append(parts, part)
		}
	}
	if len(parts) == 0 {
		return nil, false, badRequest("the glob pattern is empty")
	}
	matchers := make([]*regexp.Regexp, len(parts))
	for i, part := range parts {
		if part != "**" && strings.ContainsAny(part, "*?[") {
			re, err := fnmatchRegexp(part)
			if err != nil {
				return nil, false, &apiError{http.StatusBadRequest, "bad_pattern", err.Error()}
			}
			matchers[i] = re
		}
	}
	baseRel := []string{}
	if rel := r.Rel(base); rel != "." {
		baseRel = strings.Split(rel, "/")
	}
	seen := map[string][]string{}
	var selectFrom func(i int, dir string, rel []string)
	selectFrom = func(i int, dir string, rel []string) {
		if i == len(parts) {
			if dirsOnly && !isDir(dir) {
				return
			}
			seen[strings.Join(rel, "/")] = rel
			return
		}
		part, dirOnly := parts[i], i < len(parts)-1 || dirsOnly
		switch {
		case part == "**":
			eachDirectory(dir, rel, func(sub string, subRel []string) { selectFrom(i+1, sub, subRel) })
		case matchers[i] == nil:
			next := dir + "/" + part
			if (dirOnly && isDir(next)) || (!dirOnly && exists(next)) {
				selectFrom(i+1, next, appendCopy(rel, part))
			}
		default:
			entries, err := os.ReadDir(dir)
			if err != nil {
				return
			}
			for _, entry := range entries {
				next := dir + "/" + entry.Name()
				if dirOnly && !entryIsDir(entry, next) {
					continue
				}
				if matchers[i].MatchString(entry.Name()) {
					selectFrom(i+1, next, appendCopy(rel, entry.Name()))
				}
			}
		}
	}
	selectFrom(0, strings.TrimRight(base, "/"), baseRel)

	found := [][]string{}
	for _, rel := range seen {
		if slices.Contains(rel, ".git") || !r.within(realpath(joinParts(append(r.candidate(""), rel...)))) {
			continue
		}
		found = append(found, rel)
	}
	slices.SortFunc(found, func(a, b []string) int { return slices.Compare(a, b) })
	more := len(found) > limit
	if more {
		found = found[:limit]
	}
	out := make([]string, len(found))
	for i, rel := range found {
		out[i] = strings.Join(rel, "/")
		if out[i] == "" {
			out[i] = "."
		}
	}
	return out, more, nil
}

func appendCopy(rel []string, name string) []string {
	return append(slices.Clip(rel), name)
}

// eachDirectory visits dir and, depth first, every directory below it that is not a symlink.
func eachDirectory(dir string, rel []string, visit func(string, []string)) {
	visit(dir, rel)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, entry := range entries {
		next := dir + "/" + entry.Name()
		if entry.Type()&os.ModeSymlink == 0 && entryIsDir(entry, next) {
			eachDirectory(next, appendCopy(rel, entry.Name()), visit)
		}
	}
}

func entryIsDir(entry os.DirEntry, full string) bool {
	if entry.Type()&os.ModeSymlink != 0 {
		return isDir(full)
	}
	return entry.IsDir()
}

func isDir(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.IsDir()
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// fnmatchRegexp is Python's fnmatch.translate for one path component.
func fnmatchRegexp(pattern string) (*regexp.Regexp, error) {
	var b strings.Builder
	b.WriteString(`^(?s:`)
	runes := []rune(pattern)
	star := false
	for i := 0; i < len(runes); {
		c := runes[i]
		i++
		if c == '*' {
			if !star {
				b.WriteString(`.*`)
			}
			star = true
			continue
		}
		star = false
		switch c {
		case '?':
			b.WriteString(`.`)
		case '[':
			j := i
			if j < len(runes) && runes[j] == '!' {
				j++
			}
			if j < len(runes) && runes[j] == ']' {
				j++
			}
			for j < len(runes) && runes[j] != ']' {
				j++
			}
			if j >= len(runes) {
				b.WriteString(`\[`)
				continue
			}
			set := strings.ReplaceAll(string(runes[i:j]), `\`, `\\`)
			i = j + 1
			switch {
			case set == "":
				b.WriteString(`[^\x00-\x{10FFFF}]`) // an empty set matches nothing
			case set == "!":
				b.WriteString(`.`)
			default:
				if set[0] == '!' {
					set = "^" + set[1:]
				} else if set[0] == '^' || set[0] == '[' {
					set = `\` + set
				}
				b.WriteString("[" + set + "]")
			}
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString(`)$`)
	return regexp.Compile(b.String())
}
