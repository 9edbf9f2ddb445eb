package main

// The HTTP side: JSON in, JSON (or NDJSON for exec) out, errors as {"error": kind, "reason"}.
// The harness turns kinds into the words the model reads; reasons are for people and logs.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"
)

const maxRequestBytes = 64 << 20

type apiError struct {
	Status int
	Kind   string
	Reason string
}

func (e *apiError) Error() string { return e.Kind + ": " + e.Reason }

func badRequest(format string, args ...any) *apiError {
	return &apiError{http.StatusBadRequest, "bad_request", fmt.Sprintf(format, args...)}
}

func refusal(verdict Verdict, path string) *apiError {
	if verdict == Outside {
		return &apiError{http.StatusForbidden, "outside", fmt.Sprintf("path %q is outside the granted root", path)}
	}
	return &apiError{http.StatusForbidden, "uncertain", fmt.Sprintf("path %q cannot be resolved with certainty inside the granted root", path)}
}

// osError names an operating-system failure by the errno text, the same words Python's
// os.strerror gives (lower-cased), so both backends say the same thing.
func osError(err error) *apiError {
	var api *apiError
	if errors.As(err, &api) {
		return api
	}
	if errors.Is(err, errOutside) {
		return &apiError{http.StatusForbidden, "outside", err.Error()}
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if errno == syscall.ENOENT {
			return &apiError{http.StatusNotFound, "missing", errno.Error()}
		}
		return &apiError{http.StatusUnprocessableEntity, "io", errno.Error()}
	}
	if errors.Is(err, fs.ErrNotExist) {
		return &apiError{http.StatusNotFound, "missing", "no such file or directory"}
	}
	return &apiError{http.StatusUnprocessableEntity, "io", err.Error()}
}

// Service answers one granted root.
type Service struct {
	Root  *Root
	Env   []string // the children's environment, scrubbed once at start
	Shell string
	Self  string // this executable, whose directory is searched for helper programs

	indexesMu sync.Mutex
	indexes   map[string]*treeIndex // find's tree indexes, by file name

	generationsMu sync.Mutex
	generations   map[string]*surveyGeneration // the survey's change signal, by file name
	lastSurvey    map[string]surveyParts       // the root's entries and HEAD, by file name
	started       time.Time

	watchOnce sync.Once
	watch     *treeWatch   // what changed since the last scans, from inotify (watch_linux.go)
	scans     atomic.Int64 // survey scans so far (the tests count them)
}

func NewService(root *Root) *Service {
	self, _ := os.Executable()
	shell := "/bin/sh"
	if _, err := os.Stat("/bin/bash"); err == nil {
		shell = "/bin/bash"
	}
	return &Service{Root: root, Env: childEnv(os.Environ()), Shell: shell, Self: self, started: time.Now()}
}

func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("POST /v1/exec", s.exec)
	mux.HandleFunc("POST /v1/exec/stdout", s.execStdout)
	mux.HandleFunc("POST /v1/exec/stdin", s.execStdin)
	mux.Handle("POST /v1/files/resolve", jsonHandler(s.resolve))
	mux.Handle("POST /v1/files/read", jsonHandler(s.read))
	mux.Handle("POST /v1/files/get", jsonHandler(s.get))
	mux.Handle("POST /v1/files/put", jsonHandler(s.put))
	mux.Handle("POST /v1/files/glob", jsonHandler(s.glob))
	mux.Handle("POST /v1/files/find", jsonHandler(s.find))
	mux.Handle("POST /v1/files/list", jsonHandler(s.list))
	mux.Handle("POST /v1/files/survey", jsonHandler(s.survey))
	return mux
}

func (s *Service) healthz(w http.ResponseWriter, r *http.Request) {
	rg, _ := s.lookPath("rg")
	writeJSON(w, http.StatusOK, map[string]any{
		"ok": true, "root": s.Root.Path, "shell": s.Shell, "ripgrep": rg,
	})
}

// request is the decoded body and whether its text was trustworthy: invalid UTF-8 or a lone
// surrogate escape makes every path in it uncertain.
type request struct {
	body    []byte
	suspect bool
}

func (q request) decode(into any) *apiError {
	dec := json.NewDecoder(bytesReader(q.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		return badRequest("invalid JSON body: %v", err)
	}
	return nil
}

func readBody(r *http.Request) (request, *apiError) {
	// Read to the end: the server then watches the connection, and a client that goes away
	// cancels the request's context (which kills a running command).
	body, err := io.ReadAll(io.LimitReader(r.Body, maxRequestBytes+1))
	if err != nil {
		return request{}, badRequest("reading the body: %v", err)
	}
	if len(body) > maxRequestBytes {
		return request{}, &apiError{http.StatusRequestEntityTooLarge, "too_large", "the request body is too large"}
	}
	return request{body: body, suspect: !utf8.Valid(body) || hasLoneSurrogate(body)}, nil
}

func jsonHandler(handle func(request) (any, *apiError)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q, apiErr := readBody(r)
		if apiErr == nil {
			var answer any
			answer, apiErr = handle(q)
			if apiErr == nil {
				writeJSON(w, http.StatusOK, answer)
				return
			}
		}
		writeJSON(w, apiErr.Status, map[string]string{"error": apiErr.Kind, "reason": apiErr.Reason})
	})
}

func writeJSON(w http.ResponseWriter, status int, value any) {
	data, err := json.Marshal(value)
	if err != nil {
		status = http.StatusInternalServerError
		data = []byte(`{"error":"internal","reason":"the answer could not be encoded"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

// hasLoneSurrogate finds a \uD800-\uDFFF escape that is not half of a pair: JSON decoding would
// quietly turn it into U+FFFD, and a path that is not what the caller meant is uncertain.
func hasLoneSurrogate(body []byte) bool {
	hex := func(i int) (rune, bool) {
		if i+6 > len(body) || body[i] != '\\' || body[i+1] != 'u' {
			return 0, false
		}
		var v rune
		for _, c := range body[i+2 : i+6] {
			v <<= 4
			switch {
			case c >= '0' && c <= '9':
				v |= rune(c - '0')
			case c >= 'a' && c <= 'f':
				v |= rune(c-'a') + 10
			case c >= 'A' && c <= 'F':
				v |= rune(c-'A') + 10
			default:
				return 0, false
			}
		}
		return v, true
	}
	for i := 0; i < len(body); i++ {
		if body[i] != '\\' {
			continue
		}
		v, ok := hex(i)
		if !ok {
			i++ // skip the escaped character (it may be a backslash)
			continue
		}
		switch {
		case v >= 0xD800 && v <= 0xDBFF:
			low, ok := hex(i + 6)
			if !ok || low < 0xDC00 || low > 0xDFFF {
				return true
			}
			i += 11
		case v >= 0xDC00 && v <= 0xDFFF:
			return true
		default:
			i += 5
		}
	}
	return false
}

// Serve listens on a Unix socket (mode 0666: the socket's directory is the boundary) until the
// listener fails.
func Serve(socket string, service *Service) error {
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		return err
	}
	if err := os.Remove(socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the stale socket %s: %w", socket, err)
	}
	listener, err := net.Listen("unix", shortSocketPath(socket))
	if err != nil {
		return err
	}
	if err := os.Chmod(socket, 0o666); err != nil {
		listener.Close()
		return err
	}
	server := &http.Server{Handler: service.Handler(), ReadHeaderTimeout: 30 * time.Second}
	return server.Serve(listener)
}

// sunPathMax is the room for a socket path in struct sockaddr_un, terminating NUL included.
const sunPathMax = 108

// shortSocketPath names a socket whose path is too long for sockaddr_un through an open
// handle on its directory (/proc/self/fd/N/NAME). A pod's own path is short; the local node's
// host paths of a volume can pass the limit. The directory handle stays open for the life of
// the process, which is what keeps the name valid.
func shortSocketPath(socket string) string {
	if len(socket) < sunPathMax {
		return socket
	}
	dir, err := os.Open(filepath.Dir(socket))
	if err != nil {
		return socket // Listen reports the real problem
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(socket))
}
