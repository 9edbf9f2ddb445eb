package main

// POST /v1/exec/stdin: one command whose standard input is data (a work-in-progress git
// bundle the operator kept from an earlier pod of the Session, unbundled into the workspace's
// repository). The body is one line of JSON, {argv, cwd, timeoutSeconds, maxBytes}, then the
// bytes for stdin, at most maxBytes of them: more kills the whole group and says so
// ("overflow"). The answer is one JSON object once the command has exited:
//
//	{"exitCode":N,"timedOut":b,"overflow":b,"bytes":N,"output":base64}
//
// where output is the last outputKeep bytes of stdout and stderr together (for the reason of
// a failure). The command runs as every command here does: the tools uid, its own group.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"time"
	"unicode/utf8"
)

const (
	stdinHeadMax = 64 << 10
	outputKeep   = 8 << 10
)

type stdinAnswer struct {
	ExitCode int    `json:"exitCode"`
	TimedOut bool   `json:"timedOut"`
	Overflow bool   `json:"overflow"`
	Bytes    int64  `json:"bytes"`
	Output   []byte `json:"output"`
}

// tailBuffer keeps the last outputKeep bytes written to it.
type tailBuffer struct{ data []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.data = append(t.data, p...)
	if extra := len(t.data) - outputKeep; extra > 0 {
		t.data = append(t.data[:0], t.data[extra:]...)
	}
	return len(p), nil
}

func (s *Service) execStdin(w http.ResponseWriter, r *http.Request) {
	body := bufio.NewReaderSize(r.Body, stdinHeadMax)
	head, err := body.ReadSlice('\n')
	if err != nil {
		writeAPIError(w, badRequest("the body must start with one line of JSON: %v", err))
		return
	}
	q := request{body: head, suspect: !utf8.Valid(head) || hasLoneSurrogate(head)}
	var req stdoutRequest // the same fields: argv, cwd, timeoutSeconds, maxBytes
	if apiErr := q.decode(&req); apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	program, dir, timeout, apiErr := s.commandTarget(q, req.Argv, req.Cwd, req.TimeoutSeconds)
	if apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	if req.MaxBytes <= 0 {
		req.MaxBytes = defaultStdoutMax
	}
	answer, err := runWithStdin(r.Context(), program, req, dir, s.Env, timeout, body)
	if err != nil {
		failBeforeStreaming(w, req.Argv[0], err)
		return
	}
	data, _ := json.Marshal(answer)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(data)
}

// runWithStdin starts the command and copies `input` into its stdin, at most req.MaxBytes;
// an error before the start is returned, after it every outcome is in the answer.
func runWithStdin(ctx context.Context, program string, req stdoutRequest, dir string, env []string, timeout time.Duration, input io.Reader) (stdinAnswer, error) {
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return stdinAnswer{}, err
	}
	output := &tailBuffer{}
	cmd := &exec.Cmd{
		Path: program, Args: req.Argv, Dir: dir, Env: env,
		Stdin: stdinR, Stdout: output, Stderr: output,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	err = startChild(cmd)
	stdinR.Close()
	if err != nil {
		stdinW.Close()
		return stdinAnswer{}, err
	}
	pid := cmd.Process.Pid
	defer childDone(pid)

	finished := make(chan struct{})
	timedOut := make(chan struct{})
	stop := func() { _ = syscall.Kill(-pid, syscall.SIGKILL) }
	go func() {
		timer := time.NewTimer(timeout)
		defer timer.Stop()
		select {
		case <-finished:
			return
		case <-timer.C:
			close(timedOut)
		case <-ctx.Done():
		}
		stop()
	}()

	copied, copyErr := io.Copy(stdinW, io.LimitReader(input, req.MaxBytes+1))
	overflow := copied > req.MaxBytes
	if overflow || (copyErr != nil && !errors.Is(copyErr, syscall.EPIPE)) {
		stop()
	}
	stdinW.Close()
	waitErr := cmd.Wait()
	close(finished)

	code, timed := exitOutcome(cmd, waitErr, timedOut)
	if overflow {
		copied = req.MaxBytes
	}
	return stdinAnswer{ExitCode: code, TimedOut: timed, Overflow: overflow, Bytes: copied, Output: output.data}, nil
}
