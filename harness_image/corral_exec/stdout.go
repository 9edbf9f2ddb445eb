package main

// POST /v1/exec/stdout: one command whose standard output is data, not text for the model (a
// git bundle the harness forwards to the custodian). Stdout streams back as it comes, every
// byte, up to maxBytes; stderr is kept apart (its last stderrKeep bytes, for the reason of a
// failure). More than maxBytes of stdout kills the whole group and says so ("overflow"), so
// neither side ever holds more than the cap. Events, NDJSON:
//
//	{"type":"stdout","data":base64}* {"type":"exit","exitCode":N,"timedOut":b,"overflow":b,
//	 "bytes":N,"stderr":base64}
//
// The framing is the exec stream's (base64 in NDJSON): the harness reads it with the same
// client, chunk by chunk, and a failed command is told apart from a complete one by its exit
// event, which a raw body could only carry in a trailer.

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"time"
)

const (
	defaultStdoutMax = 64 << 20
	stdoutChunk      = 256 << 10
	stderrKeep       = 8 << 10
)

type stdoutRequest struct {
	Argv           []string `json:"argv"`
	Cwd            string   `json:"cwd"`
	TimeoutSeconds float64  `json:"timeoutSeconds"`
	MaxBytes       int64    `json:"maxBytes"`
}

type stdoutEvent struct {
	Type     string `json:"type"`
	Data     []byte `json:"data,omitempty"`
	ExitCode *int   `json:"exitCode,omitempty"`
	TimedOut *bool  `json:"timedOut,omitempty"`
	Overflow *bool  `json:"overflow,omitempty"`
	Bytes    *int64 `json:"bytes,omitempty"`
	Stderr   []byte `json:"stderr,omitempty"`
}

func (s *Service) execStdout(w http.ResponseWriter, r *http.Request) {
	q, apiErr := readBody(r)
	if apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	var req stdoutRequest
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
	err := runForStdout(r.Context(), program, req, dir, s.Env, timeout, newEventStream(w))
	failBeforeStreaming(w, req.Argv[0], err)
}

// runForStdout starts the command and streams its stdout; an error before the start is
// returned (and nothing is sent), after the start every outcome is an exit event.
func runForStdout(ctx context.Context, program string, req stdoutRequest, dir string, env []string, timeout time.Duration, out *eventStream) error {
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer stdoutR.Close()
	stderrR, stderrW, err := os.Pipe()
	if err != nil {
		stdoutW.Close()
		return err
	}
	defer stderrR.Close()
	cmd := &exec.Cmd{
		Path: program, Args: req.Argv, Dir: dir, Env: env,
		Stdout: stdoutW, Stderr: stderrW,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	err = startChild(cmd)
	stdoutW.Close()
	stderrW.Close()
	if err != nil {
		return err
	}
	pid := cmd.Process.Pid
	defer childDone(pid)

	stderrDone := make(chan []byte, 1)
	go func() {
		var tail []byte
		buf := make([]byte, 4<<10)
		for {
			n, err := stderrR.Read(buf)
			if n > 0 {
				tail = append(tail, buf[:n]...)
				if extra := len(tail) - stderrKeep; extra > 0 {
					tail = append(tail[:0], tail[extra:]...)
				}
			}
			if err != nil {
				break
			}
		}
		stderrDone <- tail
	}()

	finished := make(chan struct{})
	timedOut := make(chan struct{})
	stop := func() {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		// A process that left the group may still hold a pipe: stop reading soon anyway.
		deadline := time.Now().Add(2 * time.Second)
		_ = stdoutR.SetReadDeadline(deadline)
		_ = stderrR.SetReadDeadline(deadline)
	}
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

	var sent int64
	overflow := false
	buf := make([]byte, stdoutChunk)
	for {
		n, err := stdoutR.Read(buf)
		if n > 0 {
			if sent+int64(n) > req.MaxBytes {
				overflow = true
				stop()
				break
			}
			sent += int64(n)
			out.write(stdoutEvent{Type: "stdout", Data: buf[:n]}, false)
		}
		if err != nil {
			break
		}
	}
	waitErr := cmd.Wait()
	close(finished)
	stderr := <-stderrDone

	code, timed := exitOutcome(cmd, waitErr, timedOut)
	out.write(stdoutEvent{
		Type: "exit", ExitCode: &code, TimedOut: &timed, Overflow: &overflow, Bytes: &sent,
		Stderr: stderr,
	}, true)
	return nil
}
