package main

// POST /v1/exec: one command in its own process group, stdin /dev/null, stdout and stderr
// merged. Its output streams back as NDJSON: the head as it comes, then (when more than
// keepBytes came) a "cut" event and the tail, then "exit". The whole group is killed when the
// timeout passes and when the caller goes away (the harness aborted the turn).

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

type execRequest struct {
	Argv           []string `json:"argv"`
	Cwd            string   `json:"cwd"`
	TimeoutSeconds float64  `json:"timeoutSeconds"`
	KeepBytes      int      `json:"keepBytes"`
}

type execEvent struct {
	Type     string `json:"type"`
	Data     []byte `json:"data,omitempty"` // base64: the bytes as the command wrote them
	Bytes    int64  `json:"bytes,omitempty"`
	ExitCode *int   `json:"exitCode,omitempty"`
	TimedOut *bool  `json:"timedOut,omitempty"`
	// With exit: the survey generations after the command (generation.go), by file name.
	Surveys map[string]uint64 `json:"surveys,omitempty"`
}

// childEnv is the service's environment without anything naming Corral or the model: the
// commands the agent runs see none of it.
func childEnv(environ []string) []string {
	out := []string{}
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "CORRAL_") || name == "ANTHROPIC_API_KEY" || name == "ANTHROPIC_BASE_URL" {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// lookPath finds a program on the service's PATH, then beside this executable (where
// `corral-exec install` puts rg).
func (s *Service) lookPath(name string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	if found, err := exec.LookPath(name); err == nil {
		return found, nil
	}
	if s.Self != "" {
		beside := filepath.Join(filepath.Dir(s.Self), name)
		if info, err := os.Stat(beside); err == nil && !info.IsDir() && info.Mode()&0o111 != 0 {
			return beside, nil
		}
	}
	return "", exec.ErrNotFound
}

// commandTarget checks what every command call names: a program, a working directory inside
// the root, a timeout; it returns the program's path, the directory's real path and the
// timeout, or the refusal to answer with.
func (s *Service) commandTarget(q request, argv []string, cwd string, timeoutSeconds float64) (string, string, time.Duration, *apiError) {
	if len(argv) == 0 || argv[0] == "" || q.suspect {
		return "", "", 0, badRequest("argv must name a program, in valid UTF-8")
	}
	if timeoutSeconds <= 0 {
		timeoutSeconds = 120
	}
	timeoutSeconds = min(timeoutSeconds, 24*60*60)
	if cwd == "" {
		cwd = "."
	}
	dir, apiErr := s.inside(q, cwd)
	if apiErr != nil {
		return "", "", 0, apiErr
	}
	if dir.Kind != KindDir {
		return "", "", 0, &apiError{http.StatusConflict, "not_dir", "the working directory is not a directory"}
	}
	program, err := s.lookPath(argv[0])
	if err != nil {
		return "", "", 0, noProgram(argv[0])
	}
	return program, dir.Real, time.Duration(timeoutSeconds * float64(time.Second)), nil
}

func noProgram(name string) *apiError {
	return &apiError{http.StatusNotFound, "no_program", name + ": program not found"}
}

// failBeforeStreaming answers a command call that streamed nothing yet as a plain JSON error.
func failBeforeStreaming(w http.ResponseWriter, name string, err error) {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		writeAPIError(w, noProgram(name))
	case err != nil:
		writeAPIError(w, osError(err))
	}
}

func writeAPIError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.Status, map[string]string{"error": e.Kind, "reason": e.Reason})
}

func (s *Service) exec(w http.ResponseWriter, r *http.Request) {
	q, apiErr := readBody(r)
	if apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	var req execRequest
	if apiErr := q.decode(&req); apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	program, dir, timeout, apiErr := s.commandTarget(q, req.Argv, req.Cwd, req.TimeoutSeconds)
	if apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	if req.KeepBytes <= 0 {
		req.KeepBytes = 1_000_000
	}
	err := runCommand(r.Context(), command{
		Path: program, Argv: req.Argv, Dir: dir, Env: s.Env, Timeout: timeout, Keep: req.KeepBytes,
		AfterExit: s.generationsAfterCommand,
	}, newEventStream(w))
	failBeforeStreaming(w, req.Argv[0], err)
}

type command struct {
	Path    string
	Argv    []string
	Dir     string
	Env     []string
	Timeout time.Duration
	Keep    int
	// AfterExit is asked, once the command has exited, for the exit event's survey generations.
	AfterExit func() map[string]uint64
}

// eventStream writes NDJSON events. Output is flushed a moment after it is written (a quick
// command's output and exit then go out in one write, one wake-up for the harness); the exit
// event is flushed at once.
type eventStream struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
	pending *time.Timer // a flush of written output, due soon
}

const flushDelay = 5 * time.Millisecond

func newEventStream(w http.ResponseWriter) *eventStream {
	return &eventStream{w: w, rc: http.NewResponseController(w)}
}

func (e *eventStream) send(ev execEvent) { e.write(ev, ev.Type == "exit") }

// write sends one event; the last (final) is flushed at once.
func (e *eventStream) write(ev any, final bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.started {
		e.w.Header().Set("Content-Type", "application/x-ndjson")
		e.w.WriteHeader(http.StatusOK)
		e.started = true
	}
	data, _ := json.Marshal(ev)
	_, _ = e.w.Write(append(data, '\n'))
	if final {
		if e.pending != nil {
			e.pending.Stop()
			e.pending = nil
		}
		_ = e.rc.Flush()
		return
	}
	if e.pending == nil {
		e.pending = time.AfterFunc(flushDelay, func() {
			e.mu.Lock()
			defer e.mu.Unlock()
			if e.pending != nil {
				e.pending = nil
				_ = e.rc.Flush()
			}
		})
	}
}

// runCommand starts the command and streams its events; an error before the start is returned
// (and nothing is sent), after the start every outcome is an exit event.
func runCommand(ctx context.Context, c command, out *eventStream) error {
	reader, writer, err := os.Pipe()
	if err != nil {
		return err
	}
	defer reader.Close()
	cmd := &exec.Cmd{
		Path:        c.Path,
		Args:        c.Argv,
		Dir:         c.Dir,
		Env:         c.Env,
		Stdout:      writer,
		Stderr:      writer,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	if err := startChild(cmd); err != nil {
		writer.Close()
		return err
	}
	writer.Close()
	pid := cmd.Process.Pid
	defer childDone(pid)

	finished := make(chan struct{})
	timedOut := make(chan struct{})
	go func() {
		timer := time.NewTimer(c.Timeout)
		defer timer.Stop()
		select {
		case <-finished:
			return
		case <-timer.C:
			close(timedOut)
		case <-ctx.Done():
		}
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		// A process that left the group may still hold the pipe: stop reading soon anyway.
		_ = reader.SetReadDeadline(time.Now().Add(2 * time.Second))
	}()

	kept := newHeadTail(c.Keep)
	buf := make([]byte, 64<<10)
	for {
		n, err := reader.Read(buf)
		if n > 0 {
			if head := kept.add(buf[:n]); len(head) > 0 {
				out.send(execEvent{Type: "output", Data: head})
			}
		}
		if err != nil {
			break
		}
	}
	waitErr := cmd.Wait()
	close(finished)

	code, timed := exitOutcome(cmd, waitErr, timedOut)
	if kept.dropped > 0 {
		out.send(execEvent{Type: "cut", Bytes: kept.dropped})
	}
	if len(kept.tail) > 0 {
		out.send(execEvent{Type: "output", Data: kept.tail})
	}
	var surveys map[string]uint64
	if c.AfterExit != nil {
		surveys = c.AfterExit()
	}
	out.send(execEvent{Type: "exit", ExitCode: &code, TimedOut: &timed, Surveys: surveys})
	return nil
}

// headTail holds the first and the last half of keep bytes and counts what fell between.
type headTail struct {
	half    int
	head    int
	tail    []byte
	dropped int64
}

func newHeadTail(keep int) *headTail { return &headTail{half: max(keep/2, 1)} }

// add takes a chunk and answers the part of it that belongs to the head (sent at once).
func (h *headTail) add(chunk []byte) []byte {
	var head []byte
	if room := h.half - h.head; room > 0 {
		head = chunk[:min(room, len(chunk))]
		h.head += len(head)
		chunk = chunk[len(head):]
	}
	h.tail = append(h.tail, chunk...)
	if extra := len(h.tail) - h.half; extra > 0 {
		h.dropped += int64(extra)
		h.tail = append(h.tail[:0], h.tail[extra:]...)
	}
	return head
}

// exitOutcome is how a waited-for command ended: its exit status, -N when signal N killed it,
// -1 when it could not be waited for, and -9 with timed set when its timeout killed it.
func exitOutcome(cmd *exec.Cmd, waitErr error, timedOut <-chan struct{}) (int, bool) {
	code := 0
	if status, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
		if status.Signaled() {
			code = -int(status.Signal())
		} else {
			code = status.ExitStatus()
		}
	} else if waitErr != nil && !errors.As(waitErr, new(*exec.ExitError)) {
		code = -1
	}
	select {
	case <-timedOut:
		return -9, true
	default:
		return code, false
	}
}
