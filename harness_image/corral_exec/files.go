package main

// The file endpoints. Every path is checked against the granted root first, files are opened
// without following a last-moment symlink, and contents travel as they are on disk: the
// harness decodes and formats them (one place for the words the model reads).

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"unicode/utf8"
)

const noFollow = syscall.O_NOFOLLOW | syscall.O_CLOEXEC

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// inside checks a path that must be inside the root and names something.
func (s *Service) inside(q request, path string) (Resolved, *apiError) {
	if q.suspect {
		return Resolved{}, refusal(Uncertain, path)
	}
	res := s.Root.Resolve(path)
	if res.Verdict != Inside {
		return res, refusal(res.Verdict, path)
	}
	return res, nil
}

func (s *Service) existingFile(q request, path string) (Resolved, *apiError) {
	res, apiErr := s.inside(q, path)
	if apiErr != nil {
		return res, apiErr
	}
	switch res.Kind {
	case KindFile:
		return res, nil
	case KindMissing:
		return res, &apiError{http.StatusNotFound, "missing", "no such file or directory"}
	default:
		return res, &apiError{http.StatusConflict, "not_file", "not a regular file"}
	}
}

// ---------------------------------------------------------------------------------- resolve

type resolveRequest struct {
	Path string `json:"path"`
}

func (s *Service) resolve(q request) (any, *apiError) {
	var req resolveRequest
	if err := q.decode(&req); err != nil {
		return nil, err
	}
	res := Resolved{Verdict: Uncertain, Kind: KindMissing}
	if !q.suspect {
		res = s.Root.Resolve(req.Path)
	}
	return map[string]any{"verdict": res.Verdict, "path": res.Rel, "kind": res.Kind}, nil
}

// ---------------------------------------------------------------------------------- read

type readRequest struct {
	Path     string `json:"path"`
	Offset   int    `json:"offset"`
	Limit    int    `json:"limit"`
	MaxBytes int    `json:"maxBytes"`
}

// read answers a window of lines, streamed from the file so a huge file costs only the lines up
// to the window and one past it. Lines end at "\n"; a trailing "\r" is dropped.
func (s *Service) read(q request) (any, *apiError) {
	var req readRequest
	if err := q.decode(&req); err != nil {
		return nil, err
	}
	res, apiErr := s.existingFile(q, req.Path)
	if apiErr != nil {
		return nil, apiErr
	}
	offset, limit, maxBytes := max(req.Offset, 1), max(req.Limit, 1), req.MaxBytes
	if maxBytes <= 0 {
		maxBytes = 1 << 20
	}
	f, err := s.Root.openInside(res.Real, os.O_RDONLY, 0)
	if err != nil {
		return nil, osError(err)
	}
	defer f.Close()
	reader := bufio.NewReaderSize(f, 64<<10)
	lines := []string{}
	more, clipped, held := false, false, 0
	for number := 1; ; number++ {
		inWindow := number >= offset
		if inWindow && (len(lines) == limit || held >= maxBytes) {
			_, err := reader.Peek(1) // one more byte means one more line
			more = err == nil
			clipped = more && len(lines) < limit
			break
		}
		raw, err := readLine(reader, inWindow, maxBytes-held)
		if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, errLineClipped) {
			return nil, osError(err)
		}
		if inWindow && len(raw) > 0 {
			held += len(raw)
			lines = append(lines, string(bytes.TrimSuffix(bytes.TrimSuffix(raw, []byte("\n")), []byte("\r"))))
		}
		if errors.Is(err, errLineClipped) {
			more, clipped = true, true
			break
		}
		if errors.Is(err, io.EOF) {
			break
		}
	}
	return map[string]any{"path": res.Rel, "lines": lines, "more": more, "clipped": clipped}, nil
}

var errLineClipped = errors.New("line clipped")

// readLine reads through the next "\n"; it keeps the bytes only when asked, and at most room of
// them (then errLineClipped). At the end of the file it answers what is left and io.EOF.
func readLine(r *bufio.Reader, keep bool, room int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		if keep {
			if len(line)+len(chunk) > room {
				return append(line, chunk[:max(room-len(line), 0)]...), errLineClipped
			}
			line = append(line, chunk...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			return line, err
		}
		return line, nil
	}
}

// ---------------------------------------------------------------------------------- get

type getRequest struct {
	Path     string `json:"path"`
	MaxBytes int    `json:"maxBytes"`
}

func (s *Service) get(q request) (any, *apiError) {
	var req getRequest
	if err := q.decode(&req); err != nil {
		return nil, err
	}
	text, apiErr := s.getText(q, req.Path, req.MaxBytes)
	if apiErr != nil {
		return nil, apiErr
	}
	return map[string]any{"content": text}, nil
}

func (s *Service) getText(q request, path string, limit int) (string, *apiError) {
	res, apiErr := s.existingFile(q, path)
	if apiErr != nil {
		return "", apiErr
	}
	if limit <= 0 {
		limit = 10 << 20
	}
	f, err := s.Root.openInside(res.Real, os.O_RDONLY, 0)
	if err != nil {
		return "", osError(err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err != nil {
		return "", osError(err)
	}
	if len(data) > limit {
		return "", &apiError{http.StatusRequestEntityTooLarge, "too_large", "the file is larger than maxBytes"}
	}
	if !utf8.Valid(data) {
		return "", &apiError{http.StatusConflict, "not_text", "the file is not valid UTF-8"}
	}
	return string(data), nil
}

// ---------------------------------------------------------------------------------- put

type putRequest struct {
	Path    string `json:"path"`
	Content string `json:"content"`
}

func (s *Service) put(q request) (any, *apiError) {
	var req putRequest
	if err := q.decode(&req); err != nil {
		return nil, err
	}
	res, apiErr := s.inside(q, req.Path)
	if apiErr != nil {
		return nil, apiErr
	}
	switch res.Kind {
	case KindDir:
		return nil, &apiError{http.StatusConflict, "is_dir", "is a directory"}
	case KindOther: // a FIFO or a device: opening it could block or reach outside the tree
		return nil, &apiError{http.StatusConflict, "not_file", "not a regular file"}
	}
	if err := os.MkdirAll(filepath.Dir(res.Real), 0o777); err != nil {
		return nil, osError(err)
	}
	// The parent may have been created through a path that only now resolves; check again.
	res, apiErr = s.inside(q, res.Real)
	if apiErr != nil {
		return nil, apiErr
	}
	if res.Kind != KindFile && res.Kind != KindMissing {
		return nil, &apiError{http.StatusConflict, "not_file", "not a regular file"}
	}
	f, err := s.Root.openInside(res.Real, os.O_WRONLY|os.O_CREATE, 0o666)
	if err != nil {
		return nil, osError(err)
	}
	defer f.Close()
	if err := f.Truncate(0); err != nil {
		return nil, osError(err)
	}
	if _, err := io.WriteString(f, req.Content); err != nil {
		return nil, osError(err)
	}
	if err := f.Close(); err != nil {
		return nil, osError(err)
	}
	return map[string]any{"path": res.Rel, "bytes": len(req.Content)}, nil
}

// ---------------------------------------------------------------------------------- glob

type globRequest struct {
	Path    string `json:"path"`
	Pattern string `json:"pattern"`
	Max     int    `json:"max"`
}

func (s *Service) glob(q request) (any, *apiError) {
	var req globRequest
	if err := q.decode(&req); err != nil {
		return nil, err
	}
	if req.Path == "" {
		req.Path = "."
	}
	if strings.HasPrefix(req.Pattern, "/") || containsDotDot(req.Pattern) {
		return nil, badRequest("glob patterns are relative to the search path and may not use '..'")
	}
	res, apiErr := s.inside(q, req.Path)
	if apiErr != nil {
		return nil, apiErr
	}
	if req.Max <= 0 {
		req.Max = 1000
	}
	matches, more, err := s.Root.Glob(res.Real, req.Pattern, req.Max)
	if err != nil {
		return nil, err
	}
	return map[string]any{"matches": matches, "more": more}, nil
}

func containsDotDot(pattern string) bool {
	for _, part := range strings.Split(pattern, "/") {
		if part == ".." {
			return true
		}
	}
	return false
}

// ---------------------------------------------------------------------------------- find

type fingerprint struct {
	Size    int64 `json:"size"`
	MtimeNs int64 `json:"mtimeNs"`
}

type findRequest struct {
	Name     string                 `json:"name"`
	Known    map[string]fingerprint `json:"known"`
	MaxBytes int                    `json:"maxBytes"`
}

type foundFile struct {
	Path    string  `json:"path"`
	Content *string `json:"content"` // nil: unchanged since the caller's fingerprint
	Size    int64   `json:"size"`
	MtimeNs int64   `json:"mtimeNs"`
}

// find lists every regular file called name under the root, .git and symlinked directories
// skipped. A file whose fingerprint the caller already knows comes back without its content
// (the caller decides which fingerprints it may trust: it knows when it read them).
func (s *Service) find(q request) (any, *apiError) {
	var req findRequest
	if err := q.decode(&req); err != nil {
		return nil, err
	}
	files, apiErr := s.findFiles(q, req)
	if apiErr != nil {
		return nil, apiErr
	}
	return map[string]any{"files": files}, nil
}

func (s *Service) findFiles(q request, req findRequest) ([]foundFile, *apiError) {
	if apiErr := checkFindName(q, req.Name); apiErr != nil {
		return nil, apiErr
	}
	return s.readMatches(s.indexFor(req.Name).scan(), req), nil
}

func checkFindName(q request, name string) *apiError {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") || q.suspect {
		return badRequest("name must be a plain file name")
	}
	return nil
}

// readMatches answers the matches, each with its content unless the caller knows it.
func (s *Service) readMatches(matches []match, req findRequest) []foundFile {
	limit := req.MaxBytes
	if limit <= 0 {
		limit = 1 << 20
	}
	files := []foundFile{}
	for _, m := range matches {
		found := foundFile{Path: m.Rel, Size: m.Size, MtimeNs: m.MtimeNs}
		if known, ok := req.Known[m.Rel]; ok && known.Size == m.Size && known.MtimeNs == m.MtimeNs {
			files = append(files, found)
			continue
		}
		f, err := s.Root.openInside(m.Full, os.O_RDONLY, 0)
		if err != nil {
			continue
		}
		data, err := io.ReadAll(io.LimitReader(f, int64(limit)))
		f.Close()
		if err != nil {
			continue
		}
		text := string(data)
		found.Content = &text
		files = append(files, found)
	}
	return files
}

// ---------------------------------------------------------------------------------- survey

// survey is what the harness reads of the tree before each model call, in one round trip:
// find's answer, the root's entries and the text of .git/HEAD (null when there is none), with
// their generation (generation.go); when that is the caller's `since`, only
// {"unchanged": true, "generation"}.
func (s *Service) survey(q request) (any, *apiError) {
	var req surveyRequest
	if err := q.decode(&req); err != nil {
		return nil, err
	}
	if apiErr := checkFindName(q, req.Name); apiErr != nil {
		return nil, apiErr
	}
	scan := s.scanSurvey(q, req.Name)
	if req.Since != 0 && req.Since == scan.generation {
		return map[string]any{"unchanged": true, "generation": scan.generation}, nil
	}
	return map[string]any{
		"files":      s.readMatches(scan.matches, req.findRequest),
		"entries":    scan.entries,
		"gitHead":    scan.head,
		"generation": scan.generation,
	}, nil
}

// ---------------------------------------------------------------------------------- list

type listRequest struct {
	Path string `json:"path"`
}

func (s *Service) list(q request) (any, *apiError) {
	var req listRequest
	if err := q.decode(&req); err != nil {
		return nil, err
	}
	entries, apiErr := s.listDir(q, req.Path)
	if apiErr != nil {
		return nil, apiErr
	}
	return map[string]any{"entries": entries}, nil
}

func (s *Service) listDir(q request, path string) ([]map[string]string, *apiError) {
	if path == "" {
		path = "."
	}
	res, apiErr := s.inside(q, path)
	if apiErr != nil {
		return nil, apiErr
	}
	if res.Kind != KindDir {
		return nil, &apiError{http.StatusConflict, "not_dir", "not a directory"}
	}
	f, err := s.Root.openInside(res.Real, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return nil, osError(err)
	}
	entries, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		return nil, osError(err)
	}
	out := make([]map[string]string, 0, len(entries))
	for _, entry := range entries {
		kind := KindOther
		switch {
		case entry.IsDir():
			kind = KindDir
		case entry.Type().IsRegular():
			kind = KindFile
		}
		out = append(out, map[string]string{"name": entry.Name(), "kind": string(kind)})
	}
	return out, nil
}
