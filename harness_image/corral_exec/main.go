// corral-exec: the sandbox's tools service. It runs the agent's working tools (files and
// commands) in the tools container, under that container's uid, for the harness, which reaches
// it over a Unix socket on a volume shared by the two containers only. The harness never opens
// a workspace path itself; it asks here, and words the answers for the model itself.
//
//	corral-exec serve --socket PATH --root GRANTED_ROOT
//	corral-exec install DEST   (copies itself, and rg when on PATH, into DEST, mode 0555)
//
// HTTP/1.1, JSON bodies; an error is 4xx {"error": kind, "reason": text}, kinds: bad_request,
// outside, uncertain, missing, not_file, not_dir, is_dir, not_text, too_large, no_program,
// bad_pattern, io. Paths are relative to the root or absolute, checked as
// corral_harness/paths.py does (symlinks and ".." resolved first; NUL, invalid UTF-8 or a
// dangling symlink on the way: uncertain).
//
//	GET  /healthz                -> {ok, root, shell, ripgrep}
//	POST /v1/exec                {argv, cwd, timeoutSeconds, keepBytes} -> NDJSON:
//	                             {"type":"output","data":base64}* [{"type":"cut","bytes":N}
//	                             {"type":"output",...}] {"type":"exit","exitCode":N,"timedOut":b,
//	                             "surveys":{name: generation}} (after the command: generation.go)
//	POST /v1/exec/stdout         {argv, cwd, timeoutSeconds, maxBytes} -> NDJSON (stdout.go):
//	                             {"type":"stdout","data":base64}* {"type":"exit","exitCode":N,
//	                             "timedOut":b,"overflow":b,"bytes":N,"stderr":base64}
//	POST /v1/exec/stdin          {argv, cwd, timeoutSeconds, maxBytes}\n + stdin bytes (stdin.go)
//	                             -> {exitCode, timedOut, overflow, bytes, output: base64}
//	POST /v1/files/resolve       {path} -> {verdict, path, kind}
//	POST /v1/files/read          {path, offset, limit, maxBytes} -> {path, lines, more, clipped}
//	POST /v1/files/get           {path, maxBytes} -> {content}            (valid UTF-8 only)
//	POST /v1/files/put           {path, content} -> {path, bytes}
//	POST /v1/files/glob          {path, pattern, max} -> {matches, more}
//	POST /v1/files/find          {name, known, maxBytes} -> {files: [{path, content|null, size, mtimeNs}]}
//	POST /v1/files/list          {path} -> {entries: [{name, kind}]}
//	POST /v1/files/survey        {name, known, maxBytes, since?} -> {files, entries, gitHead, generation}
//	                             or, when since is the generation, {unchanged: true, generation}
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "install":
		if len(os.Args) != 3 {
			usage()
		}
		err = install(os.Args[2])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "corral-exec:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: corral-exec serve --socket PATH --root GRANTED_ROOT\n       corral-exec install DEST")
	os.Exit(2)
}

func serve(args []string) error {
	flags := flag.NewFlagSet("serve", flag.ExitOnError)
	socket := flags.String("socket", "", "the Unix socket to listen on")
	rootPath := flags.String("root", "", "the granted root")
	_ = flags.Parse(args)
	if *socket == "" || *rootPath == "" {
		return errors.New("serve needs --socket and --root")
	}
	root, err := NewRoot(*rootPath)
	if err != nil {
		return err
	}
	reapOrphans()
	return Serve(*socket, NewService(root))
}

// install copies this binary (and rg, when it is on PATH) into dest, so an init container can
// put them on a shared volume for a toolchain image that has neither.
func install(dest string) error {
	if err := os.MkdirAll(dest, 0o755); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if err := copyExecutable(self, filepath.Join(dest, "corral-exec")); err != nil {
		return err
	}
	if rg, err := exec.LookPath("rg"); err == nil {
		return copyExecutable(rg, filepath.Join(dest, "rg"))
	}
	return nil
}

func copyExecutable(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	tmp := to + ".tmp"
	dst, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	if err := dst.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o555); err != nil {
		return err
	}
	return os.Rename(tmp, to)
}
