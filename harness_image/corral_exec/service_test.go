package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startService serves a fresh service for root on a socket in a temporary directory.
func startService(t *testing.T, root string) (*Service, string) {
	t.Helper()
	r, err := NewRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	service := NewService(r)
	socket := filepath.Join(t.TempDir(), "exec.sock")
	listener, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	server := &http.Server{Handler: service.Handler()}
	go server.Serve(listener)
	t.Cleanup(func() { server.Close() })
	return service, socket
}

func client(socket string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		},
	}}
}

func post(t *testing.T, c *http.Client, path string, body any) (int, map[string]any) {
	t.Helper()
	data, _ := json.Marshal(body)
	resp, err := c.Post("http://exec"+path, "application/json", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

// execEvents runs a command and collects its NDJSON events.
func execEvents(t *testing.T, c *http.Client, body map[string]any) ([]map[string]any, string) {
	t.Helper()
	data, _ := json.Marshal(body)
	resp, err := c.Post("http://exec/v1/exec", "application/json", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		text, _ := io.ReadAll(resp.Body)
		t.Fatalf("exec answered %d: %s", resp.StatusCode, text)
	}
	var events []map[string]any
	var output bytes.Buffer
	scanner := bufio.NewScanner(resp.Body)
	for scanner.Scan() {
		var ev map[string]any
		if err := json.Unmarshal(scanner.Bytes(), &ev); err != nil {
			t.Fatal(err)
		}
		if ev["type"] == "output" {
			var chunk []byte
			_ = json.Unmarshal([]byte(strconv.Quote(ev["data"].(string))), &chunk)
			output.Write(chunk)
		}
		events = append(events, ev)
	}
	return events, output.String()
}

// dead says whether pid is gone (or a zombie nobody has reaped yet).
func dead(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return len(fields) > 0 && fields[0] == "Z"
}

func waitDead(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !dead(pid) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("process %d is still alive", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestTimeoutKillsTheWholeGroup(t *testing.T) {
	root := t.TempDir()
	_, socket := startService(t, root)
	started := time.Now()
	events, output := execEvents(t, client(socket), map[string]any{
		"argv":           []string{"/bin/sh", "-c", "sleep 300 & echo $!; sleep 300"},
		"timeoutSeconds": 0.5,
	})
	if time.Since(started) > 5*time.Second {
		t.Fatalf("the timeout did not end the command: %s", time.Since(started))
	}
	last := events[len(events)-1]
	if last["type"] != "exit" || last["timedOut"] != true || last["exitCode"] != float64(-9) {
		t.Fatalf("last event %v", last)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(output))
	if err != nil {
		t.Fatalf("no grandchild pid in %q", output)
	}
	waitDead(t, pid)
}

func TestClientDisconnectKillsTheWholeGroup(t *testing.T) {
	root := t.TempDir()
	_, socket := startService(t, root)
	conn, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	body := `{"argv":["/bin/sh","-c","sleep 300 & echo $!; wait"],"timeoutSeconds":60}`
	fmt.Fprintf(conn, "POST /v1/exec HTTP/1.1\r\nHost: exec\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadBytes('\n')
	if err != nil {
		t.Fatal(err)
	}
	var ev struct{ Data []byte }
	if err := json.Unmarshal(line, &ev); err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(ev.Data)))
	if err != nil {
		t.Fatalf("no grandchild pid in %q", ev.Data)
	}
	if dead(pid) {
		t.Fatal("the grandchild died before the caller went away")
	}
	conn.Close()
	waitDead(t, pid)
}

func TestChildEnvironmentIsScrubbed(t *testing.T) {
	t.Setenv("CORRAL_WIRE_TOKEN_FILE", "/secret/token")
	t.Setenv("CORRAL_ANYTHING", "x")
	t.Setenv("ANTHROPIC_API_KEY", "sk-secret")
	t.Setenv("ANTHROPIC_BASE_URL", "http://custodian")
	t.Setenv("KEPT_VARIABLE", "kept")
	_, socket := startService(t, t.TempDir())
	_, output := execEvents(t, client(socket), map[string]any{"argv": []string{"env"}})
	for _, hidden := range []string{"CORRAL_", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "sk-secret"} {
		if strings.Contains(output, hidden) {
			t.Errorf("the child saw %s:\n%s", hidden, output)
		}
	}
	if !strings.Contains(output, "KEPT_VARIABLE=kept") {
		t.Errorf("an ordinary variable was lost:\n%s", output)
	}
}

func TestOutputIsHeldToItsHeadAndTail(t *testing.T) {
	_, socket := startService(t, t.TempDir())
	events, output := execEvents(t, client(socket), map[string]any{
		"argv":      []string{"/bin/sh", "-c", "printf start; head -c 3000000 /dev/zero | tr '\\0' x; printf end"},
		"keepBytes": 1000,
	})
	var cut float64
	for _, ev := range events {
		if ev["type"] == "cut" {
			cut = ev["bytes"].(float64)
		}
	}
	if cut != 3000008-1000 || len(output) != 1000 || !strings.HasPrefix(output, "start") || !strings.HasSuffix(output, "end") {
		t.Fatalf("cut %v, output of %d bytes", cut, len(output))
	}
}

func TestExecCwdAndExitCode(t *testing.T) {
	root := t.TempDir()
	os.Mkdir(filepath.Join(root, "sub"), 0o755)
	_, socket := startService(t, root)
	c := client(socket)
	events, output := execEvents(t, c, map[string]any{"argv": []string{"/bin/sh", "-c", "pwd; exit 4"}, "cwd": "sub"})
	real, _ := filepath.EvalSymlinks(root)
	if output != real+"/sub\n" || events[len(events)-1]["exitCode"] != float64(4) {
		t.Fatalf("output %q, events %v", output, events)
	}
	status, answer := post(t, c, "/v1/exec", map[string]any{"argv": []string{"pwd"}, "cwd": "../"})
	if status != 403 || answer["error"] != "outside" {
		t.Fatalf("a cwd outside the root: %d %v", status, answer)
	}
	status, answer = post(t, c, "/v1/exec", map[string]any{"argv": []string{"no-such-program-here"}})
	if status != 404 || answer["error"] != "no_program" {
		t.Fatalf("a missing program: %d %v", status, answer)
	}
}

func TestFileEndpointsRefuseEscapes(t *testing.T) {
	base := t.TempDir()
	root, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
	os.Mkdir(root, 0o755)
	os.Mkdir(outside, 0o755)
	os.WriteFile(filepath.Join(outside, "secret.txt"), []byte("TOP SECRET\n"), 0o644)
	os.Symlink(outside, filepath.Join(root, "link-out"))
	_, socket := startService(t, root)
	c := client(socket)
	for _, path := range []string{"../outside/secret.txt", "link-out/secret.txt", outside + "/secret.txt"} {
		for _, endpoint := range []string{"/v1/files/read", "/v1/files/get"} {
			status, answer := post(t, c, endpoint, map[string]any{"path": path})
			if status != 403 || answer["error"] != "outside" {
				t.Errorf("%s %s: %d %v", endpoint, path, status, answer)
			}
		}
		status, _ := post(t, c, "/v1/files/put", map[string]any{"path": path, "content": "pwned"})
		if status != 403 {
			t.Errorf("put %s: %d", path, status)
		}
	}
	if data, _ := os.ReadFile(filepath.Join(outside, "secret.txt")); string(data) != "TOP SECRET\n" {
		t.Fatal("a write escaped the root")
	}
	status, answer := post(t, c, "/v1/files/put", map[string]any{"path": "new/dir/f.txt", "content": "made"})
	if status != 200 || answer["path"] != "new/dir/f.txt" {
		t.Fatalf("put inside: %d %v", status, answer)
	}
	_, answer = post(t, c, "/v1/files/glob", map[string]any{"pattern": "**/*"})
	if fmt.Sprint(answer["matches"]) != "[new new/dir new/dir/f.txt]" {
		t.Fatalf("glob: %v", answer)
	}
}

func TestInstallCopiesItselfReadOnly(t *testing.T) {
	dest := filepath.Join(t.TempDir(), "bin")
	t.Setenv("PATH", "") // no rg to copy: only the binary itself
	for range 2 {        // a second install replaces the first
		if err := install(dest); err != nil {
			t.Fatal(err)
		}
	}
	info, err := os.Stat(filepath.Join(dest, "corral-exec"))
	if err != nil || info.Mode().Perm() != 0o555 {
		t.Fatalf("installed binary: %v %v", info, err)
	}
	if _, err := os.Stat(filepath.Join(dest, "rg")); err == nil {
		t.Fatal("rg was copied though none was on PATH")
	}
}
