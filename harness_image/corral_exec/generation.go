package main

// The survey's change signal. The harness reads the tree's instruction files, the root's
// entries and .git/HEAD before a model call (/v1/files/survey) and caches what it read; after
// a command it must know whether any of that changed. Each survey name keeps a generation: a
// counter that moves whenever a scan sees a different answer (a file of that name added,
// removed or with another size or mtime, another set of root entries, another HEAD), and also
// whenever a matching file was changed within racyWindow (its fingerprint cannot be trusted
// yet, so "unchanged" is never claimed for it). The exec endpoint scans every name surveyed so
// far once the command has exited and puts the generations into its exit event; a survey
// naming the generation its caller holds (`since`) is answered "unchanged" without the files.

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type surveyRequest struct {
	findRequest
	Since uint64 `json:"since"` // the generation the caller's copy was read at; 0: none
}

// surveyScan is one scan of what a survey answers.
type surveyScan struct {
	matches    []match
	entries    []map[string]string
	head       *string
	generation uint64
}

// scanSurvey scans name's files, the root's entries and .git/HEAD, and answers them with the
// generation they belong to. The root is listed again only when the index listed it again
// (its mtime moved, or it changed too recently to trust), and HEAD is read again only when its
// lstat differs or is too recent: after most commands a scan is the index's stats alone.
func (s *Service) scanSurvey(q request, name string) surveyScan {
	s.scans.Add(1)
	watch := s.treeWatch()
	watch.beforeScan(name)
	index := s.indexFor(name)
	matches, rootRelisted := index.scanNoting()
	defer watch.afterScan(name, index.dirNames())
	s.generationsMu.Lock()
	last := s.lastSurvey[name]
	s.generationsMu.Unlock()

	entries := last.entries
	if rootRelisted || entries == nil {
		var apiErr *apiError
		if entries, apiErr = s.listDir(q, "."); apiErr != nil {
			entries = []map[string]string{}
		}
	}
	headStat, headTrusted := s.headStat()
	head := last.head
	if !headTrusted || !last.headTrusted || headStat != last.headStat {
		head = nil
		if text, apiErr := s.getText(q, ".git/HEAD", 4096); apiErr == nil {
			head = &text
		}
	}
	s.generationsMu.Lock()
	if s.lastSurvey == nil {
		s.lastSurvey = map[string]surveyParts{}
	}
	s.lastSurvey[name] = surveyParts{entries, head, headStat, headTrusted}
	s.generationsMu.Unlock()

	scan := surveyScan{matches: matches, entries: entries, head: head}
	scan.generation = s.observe(name, scan)
	return scan
}

// surveyParts is what the last scan read besides the matches, kept to be reused.
type surveyParts struct {
	entries     []map[string]string
	head        *string
	headStat    fileStat
	headTrusted bool // changed at least racyWindow before it was read
}

type fileStat struct {
	ino, size, mtimeNs int64
	regular            bool
}

// headStat is .git/HEAD's lstat, and whether it is old enough to trust.
func (s *Service) headStat() (fileStat, bool) {
	info, err := os.Lstat(s.Root.Path + "/.git/HEAD")
	if err != nil {
		return fileStat{}, false
	}
	st := fileStat{size: info.Size(), mtimeNs: info.ModTime().UnixNano(), regular: info.Mode().IsRegular()}
	if sys, ok := info.Sys().(*syscall.Stat_t); ok {
		st.ino = int64(sys.Ino)
	}
	return st, st.regular && st.mtimeNs < time.Now().Add(-racyWindow).UnixNano()
}

// observe answers the generation of a scan: the previous one when nothing differs from the last
// scan of name (and no match is too recent to trust), else a new one.
func (s *Service) observe(name string, scan surveyScan) uint64 {
	racyAfter := time.Now().Add(-racyWindow).UnixNano()
	racy := false
	var sig strings.Builder
	matches := slices.Clone(scan.matches)
	slices.SortFunc(matches, func(a, b match) int { return strings.Compare(a.Rel, b.Rel) })
	for _, m := range matches {
		racy = racy || m.MtimeNs >= racyAfter
		sig.WriteString(m.Rel + "\x00" + strconv.FormatInt(m.Size, 10) + "\x00" + strconv.FormatInt(m.MtimeNs, 10) + "\n")
	}
	sig.WriteString("\x01")
	entries := make([]string, 0, len(scan.entries))
	for _, e := range scan.entries {
		entries = append(entries, e["name"]+"\x00"+e["kind"])
	}
	slices.Sort(entries)
	sig.WriteString(strings.Join(entries, "\n"))
	sig.WriteString("\x01")
	if scan.head != nil {
		sig.WriteString("head:" + *scan.head)
	}
	signature := sig.String()

	s.generationsMu.Lock()
	defer s.generationsMu.Unlock()
	if s.generations == nil {
		s.generations = map[string]*surveyGeneration{}
	}
	g := s.generations[name]
	if g == nil {
		// Numbered from this process's start (in microseconds, exact as a JSON double): a
		// restarted service never hands out a number a harness holds from before.
		g = &surveyGeneration{number: uint64(s.started.UnixMicro())}
		s.generations[name] = g
	}
	if racy || !g.seen || g.signature != signature {
		g.number++
		g.signature, g.seen = signature, true
	}
	return g.number
}

type surveyGeneration struct {
	number    uint64
	seen      bool
	signature string
}

// generationsAfterCommand scans every name surveyed so far: what a command left behind.
func (s *Service) generationsAfterCommand() map[string]uint64 {
	s.generationsMu.Lock()
	names := make([]string, 0, len(s.generations))
	for name := range s.generations {
		names = append(names, name)
	}
	s.generationsMu.Unlock()
	if len(names) == 0 {
		return nil
	}
	out := make(map[string]uint64, len(names))
	for _, name := range names {
		if s.treeWatch().unchanged(name) {
			s.generationsMu.Lock()
			out[name] = s.generations[name].number
			s.generationsMu.Unlock()
			continue
		}
		out[name] = s.scanSurvey(request{}, name).generation
	}
	return out
}

// treeWatch is the service's inotify watch of the tree (nil without inotify), made at first use.
func (s *Service) treeWatch() *treeWatch {
	s.watchOnce.Do(func() { s.watch = newTreeWatch(s.Root.Path) })
	return s.watch
}
