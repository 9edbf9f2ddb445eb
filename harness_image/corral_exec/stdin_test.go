package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// stdinRun runs a command through /v1/exec/stdin with `input` as its stdin: the answer.
func stdinRun(t *testing.T, c *http.Client, head map[string]any, input io.Reader) (int, map[string]any) {
	t.Helper()
	line, _ := json.Marshal(head)
	body := io.MultiReader(bytes.NewReader(append(line, '\n')), input)
	resp, err := c.Post("http://exec/v1/exec/stdin", "application/octet-stream", body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var answer map[string]any
	data, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(data, &answer); err != nil {
		t.Fatalf("answer %q: %v", data, err)
	}
	return resp.StatusCode, answer
}

func TestStdinReachesTheCommandByteForByte(t *testing.T) {
	root := t.TempDir()
	_, socket := startService(t, root)
	input := make([]byte, 0, 3<<20)
	for i := 0; len(input) < 3<<20; i++ {
		input = append(input, byte(i), byte(i>>8), 0, 0xff)
	}
	status, answer := stdinRun(t, client(socket), map[string]any{
		"argv": []string{"/bin/sh", "-c", "cat > got.bin; echo done; exit 4"},
	}, bytes.NewReader(input))
	if status != 200 || answer["exitCode"] != float64(4) || answer["overflow"] != false {
		t.Fatalf("%d %v", status, answer)
	}
	if answer["bytes"] != float64(len(input)) || decoded(t, answer["output"]) != "done\n" {
		t.Fatalf("answer %v", answer)
	}
	got, err := os.ReadFile(filepath.Join(root, "got.bin"))
	if err != nil || !bytes.Equal(got, input) {
		t.Fatalf("the command read %d bytes (%v), want %d", len(got), err, len(input))
	}
}

func TestStdinBeyondTheCapKillsTheGroupAndSaysOverflow(t *testing.T) {
	root := t.TempDir()
	_, socket := startService(t, root)
	started := time.Now()
	endless := io.MultiReader(bytes.NewReader(bytes.Repeat([]byte("x"), 1<<20)), neverEnding{})
	status, answer := stdinRun(t, client(socket), map[string]any{
		"argv":     []string{"/bin/sh", "-c", "sleep 300 & echo $!; cat > /dev/null"},
		"maxBytes": 100_000,
	}, endless)
	if time.Since(started) > 10*time.Second {
		t.Fatalf("the cap did not end the command: %s", time.Since(started))
	}
	if status != 200 || answer["overflow"] != true || answer["bytes"] != float64(100_000) {
		t.Fatalf("%d %v", status, answer)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(decoded(t, answer["output"])))
	if err != nil {
		t.Fatalf("no grandchild pid in %v", answer["output"])
	}
	waitDead(t, pid)
}

func TestStdinRefusesABodyWithoutItsHeadLine(t *testing.T) {
	root := t.TempDir()
	_, socket := startService(t, root)
	resp, err := client(socket).Post("http://exec/v1/exec/stdin", "application/octet-stream",
		strings.NewReader(`{"argv":["/bin/true"]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("answered %d", resp.StatusCode)
	}
}

type neverEnding struct{}

func (neverEnding) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'y'
	}
	return len(p), nil
}
