package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// stdoutRun runs a command through /v1/exec/stdout: its stdout bytes and its exit event.
func stdoutRun(t *testing.T, c *http.Client, body map[string]any) ([]byte, map[string]any) {
	t.Helper()
	data, _ := json.Marshal(body)
	resp, err := c.Post("http://exec/v1/exec/stdout", "application/json", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		text, _ := io.ReadAll(resp.Body)
		t.Fatalf("exec/stdout answered %d: %s", resp.StatusCode, text)
	}
	var stdout bytes.Buffer
	var exit map[string]any
	scanner := bufio.NewScanner(resp.Body)
	scanner.Buffer(make([]byte, 1<<20), 1<<20)
	for scanner.Scan() {
		var ev struct {
			Type string `json:"type"`
			Data []byte `json:"data"`
		}
		if err := json.Unmarshal(scanner.Bytes(), &ev); err != nil {
			t.Fatal(err)
		}
		switch ev.Type {
		case "stdout":
			if exit != nil {
				t.Fatal("stdout after the exit event")
			}
			stdout.Write(ev.Data)
		case "exit":
			_ = json.Unmarshal(scanner.Bytes(), &exit)
		default:
			t.Fatalf("unexpected event %s", scanner.Text())
		}
	}
	if err := scanner.Err(); err != nil {
		t.Fatal(err)
	}
	if exit == nil {
		t.Fatal("the stream ended without its exit event")
	}
	return stdout.Bytes(), exit
}

func decoded(t *testing.T, value any) string {
	t.Helper()
	s, _ := value.(string)
	var out []byte
	if err := json.Unmarshal([]byte(strconv.Quote(s)), &out); err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func TestStdoutComesBackByteForByteAndStderrApart(t *testing.T) {
	root := t.TempDir()
	_, socket := startService(t, root)
	// Bytes no text encoding would keep: NUL, invalid UTF-8, CR, every value 0..255.
	script := `printf '\000\377\376\r\n'; i=0; while [ $i -lt 256 ]; do printf "\\$(printf %o $i)"; i=$((i+1)); done; echo oops >&2; exit 3`
	stdout, exit := stdoutRun(t, client(socket), map[string]any{"argv": []string{"/bin/sh", "-c", script}})
	want := []byte{0, 0xff, 0xfe, '\r', '\n'}
	for i := 0; i < 256; i++ {
		want = append(want, byte(i))
	}
	if !bytes.Equal(stdout, want) {
		t.Fatalf("stdout %q, want %q", stdout, want)
	}
	if exit["exitCode"] != float64(3) || exit["overflow"] != false || exit["timedOut"] != false {
		t.Fatalf("exit %v", exit)
	}
	if exit["bytes"] != float64(len(want)) {
		t.Fatalf("bytes %v, want %d", exit["bytes"], len(want))
	}
	if got := decoded(t, exit["stderr"]); got != "oops\n" {
		t.Fatalf("stderr %q", got)
	}
}

func TestStdoutBeyondTheCapKillsTheCommandAndSaysOverflow(t *testing.T) {
	root := t.TempDir()
	_, socket := startService(t, root)
	started := time.Now()
	// Without end: only the cap stops it. The grandchild's pid goes to stderr.
	stdout, exit := stdoutRun(t, client(socket), map[string]any{
		"argv":     []string{"/bin/sh", "-c", "sleep 300 & echo $! >&2; yes corral"},
		"maxBytes": 100_000,
	})
	if time.Since(started) > 10*time.Second {
		t.Fatalf("the cap did not end the command: %s", time.Since(started))
	}
	if exit["overflow"] != true || exit["exitCode"] != float64(-9) {
		t.Fatalf("exit %v", exit)
	}
	if len(stdout) > 100_000 || exit["bytes"] != float64(len(stdout)) {
		t.Fatalf("%d bytes came, the exit says %v; the cap is 100000", len(stdout), exit["bytes"])
	}
	pid, err := strconv.Atoi(strings.TrimSpace(decoded(t, exit["stderr"])))
	if err != nil {
		t.Fatalf("no grandchild pid in %v", exit["stderr"])
	}
	waitDead(t, pid)
}

func TestStdoutKeepsOnlyTheTailOfALongStderr(t *testing.T) {
	root := t.TempDir()
	_, socket := startService(t, root)
	_, exit := stdoutRun(t, client(socket), map[string]any{
		"argv": []string{"/bin/sh", "-c", "i=0; while [ $i -lt 3000 ]; do echo line-$i >&2; i=$((i+1)); done"},
	})
	stderr := decoded(t, exit["stderr"])
	if len(stderr) != stderrKeep || !strings.HasSuffix(stderr, "line-2999\n") {
		t.Fatalf("stderr kept %d bytes ending %q", len(stderr), stderr[max(0, len(stderr)-20):])
	}
}

func TestStdoutRefusesAWorkingDirectoryOutsideTheRoot(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	_, socket := startService(t, root)
	status, answer := post(t, client(socket), "/v1/exec/stdout", map[string]any{
		"argv": []string{"/bin/true"}, "cwd": base,
	})
	if status != http.StatusForbidden || answer["error"] != "outside" {
		t.Fatalf("%d %v", status, answer)
	}
	status, answer = post(t, client(socket), "/v1/exec/stdout", map[string]any{
		"argv": []string{"/bin/true"}, "keepBytes": 5,
	})
	if status != http.StatusBadRequest || answer["error"] != "bad_request" {
		t.Fatalf("an unknown field: %d %v", status, answer)
	}
}

func TestStdoutOfAGitBundleIsAValidBundle(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatal("git is needed")
	}
	root := t.TempDir()
	for _, args := range [][]string{
		{"init", "-q"},
		{"-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "one"},
	} {
		cmd := exec.Command("git", args...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	_, socket := startService(t, root)
	stdout, exit := stdoutRun(t, client(socket), map[string]any{
		"argv": []string{"git", "bundle", "create", "-", "HEAD"},
	})
	if exit["exitCode"] != float64(0) {
		t.Fatalf("exit %v", exit)
	}
	file := filepath.Join(t.TempDir(), "b.bundle")
	if err := os.WriteFile(file, stdout, 0o600); err != nil {
		t.Fatal(err)
	}
	verify := exec.Command("git", "bundle", "verify", file)
	verify.Dir = root
	if out, err := verify.CombinedOutput(); err != nil {
		t.Fatalf("git bundle verify: %v %s", err, out)
	}
}
