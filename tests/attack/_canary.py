"""The canary sweep: search everything a party without a credential can read for the attack
suite's canary credentials, in every form the custodian's redactor knows.

The attack suite's Sessions hold canary credentials (a model key, a git credential, a hook
secret, a memory DSN: random, distinctive values per run). No text any of them can produce may
carry one out of the custodian, so after each attack test, and once after the whole suite, the
sweep reads:

- the model's requests (the scripted model records every request body and a few headers; the
  model key in the `x-api-key`/`authorization` header is the one place it belongs);
- every object of Corral's six kinds, Events, Pods (termination messages included) and
  ConfigMaps in every namespace, whole;
- the local node's files that anyone but the custodian reads: every container's log (the
  custodian's too: `kubectl logs -c custodian` needs no credential), and of each pod the
  workspace, the tools' and the harness's /tmp and state, and the containers' homes (not the
  custodian's); symlinks are never followed, so a link the agent planted to a secret file is
  not counted as the secret;
- the operators' logs, their consoles (pages and JSON API, the live turn's stream included,
  as a viewer of the namespace) and the archive directory;
- every object (`git cat-file --batch-all-objects`, unreachable ones included), every ref and
  every file of each git repository under the test repositories' root (the remotes).

The forms come from the product (`corral_custodian._secrets.encodings`), so the sweep and the
redactor read one list; each form is also searched as it appears inside a JSON string and in
HTML. Large inputs are filtered with `grep -F` (one pass for all forms) before they are read
in Python for the findings' details.
"""

from __future__ import annotations

import base64
import html
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, quote_plus, unquote, urlsplit

import httpx

from corral_custodian._secrets import encodings
from corral_dev.controlplane import ControlPlane

MODEL_KEY = "model-key"
GIT_CREDENTIAL = "git-credential"
HOOK_SECRET = "hook-secret"
MEMORY_DSN = "memory-dsn"

# The kinds a party without a credential may read, one `kubectl get` for all of them.
KUBE_KINDS = ",".join(
    [
        "pods",
        "events",
        "configmaps",
        *(
            f"{plural}.corral.dev"
            for plural in ("agents", "sessions", "approvals", "evidences", "goals", "freezes")
        ),
    ]
)
# A pod's volumes and homes that belong to a party holding no credential.
POD_VOLUMES = ("workspace", "tools-tmp", "harness-tmp", "state")
NOT_HOMES = ("custodian",)
# The model key belongs in these headers of a model request, and nowhere else.
MODEL_KEY_HEADERS = ("x-api-key", "authorization")
CONTEXT = 40
GREP_ABOVE = 256 * 1024  # bytes: above this, `grep -F` filters before Python looks
CONSOLE_STREAM_SECONDS = 2.0


# ------------------------------------------------------------------------------ the canaries


@dataclass(frozen=True)
class Canary:
    """One credential: `name` (model-key, git-credential...), `value` as configured (a key, a
    credential-store line, a DSN), and `pairs`: `user:password` logins inside it, searched in
    every form as the redactor registers them (`user:password@`, HTTP Basic)."""

    name: str
    value: str
    secret: str  # the part that is the secret (the token of a credential line, a password)
    pairs: tuple[str, ...] = ()

    @classmethod
    def plain(cls, name: str, value: str) -> Canary:
        """A canary that is a secret as a whole (a key, a token)."""
        return cls(name, value, value)

    def values(self) -> list[str]:
        return list(dict.fromkeys([self.value, self.secret, *self.pairs]))


def login_canary(name: str, url: str) -> Canary:
    """A canary whose value is a URL with a login (`https://user:token@host`, a DSN)."""
    parts = urlsplit(url)
    user, password = unquote(parts.username or ""), unquote(parts.password or "")
    if not password:
        raise ValueError(f"{name}: {url!r} holds no password")
    pairs = (f"{user}:{password}", f"{quote(user, safe='')}:{quote(password, safe='')}")
    return Canary(name, url, password, tuple(dict.fromkeys(pairs)))


@dataclass(frozen=True)
class Form:
    """One text to search for: a form of a canary the product's `encodings` gives (named by
    `encoding`), or that form as it reads in a context (`variant`: inside a JSON string, in
    HTML)."""

    canary: str
    encoding: str
    text: str
    variant: str = ""
    base: str = ""  # the form `encodings` gave, of which `text` is the variant


def _b64_inner(raw: bytes, offset: int, encode: Callable[[bytes], bytes]) -> str:
    encoded = encode(b"\0" * offset + raw).decode("ascii")
    first = -(-8 * offset // 6)
    last = 8 * (offset + len(raw)) // 6
    return encoded[first:last]


def encoding_labels(value: str) -> dict[str, str]:
    """The name of each form of `value` this module can tell, for the findings; the forms
    themselves come from the product's `encodings`."""
    raw = value.encode()
    labels: dict[str, str] = {}

    def add(label: str, *forms: str) -> None:
        for form in forms:
            labels.setdefault(form, label)

    add("plain", value)
    for name, encode in (("base64", base64.b64encode), ("base64url", base64.urlsafe_b64encode)):
        full = encode(raw).decode()
        add(name, full, full.rstrip("="))
        for offset in range(3):
            add(
                f"{name} inside a longer text (alignment {offset})", _b64_inner(raw, offset, encode)
            )
    add("url-encoded", quote(value, safe=""), quote(value), quote_plus(value, safe=""))
    add("url-encoded", quote_plus(value))
    for form in list(labels):
        if labels[form] == "url-encoded" and "%" in form:
            parts = form.split("%")
            add("url-encoded", parts[0] + "".join("%" + p[:2].lower() + p[2:] for p in parts[1:]))
    add("hex", raw.hex())
    add("hex (upper-case)", raw.hex().upper())
    escaped = "".join(f"\\u{ord(c):04x}" for c in value)
    add("json \\u escapes", escaped)
    add("json \\u escapes (upper-case)", escaped.upper().replace("\\U", "\\u"))
    add("json string", json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1])
    for form, label in list(labels.items()):
        add(f"{label} (JSON-quoted)", json.dumps(form)[1:-1])
    return labels


def forms_of(canaries: Iterable[Canary]) -> list[Form]:
    """Every form of every canary, as the redactor knows them, each also as it reads inside a
    JSON string and in HTML (a text may stand for several: one form's JSON-quoted variant can
    be another form of the product's list)."""
    found: dict[tuple[str, str], Form] = {}
    for canary in canaries:
        for value in canary.values():
            labels = encoding_labels(value)
            kind = "" if value == canary.secret else (
                " of user:password" if value in canary.pairs else " of the whole value"
            )  # fmt: skip
            for index, form in enumerate(encodings(value)):
                label = labels.get(form, f"encodings()[{index}]") + kind
                variants = [
                    (form, ""),
                    (json.dumps(form)[1:-1], "in a JSON string"),
                    (html.escape(form), "in HTML"),
                ]
                for text, variant in variants:
                    if len(text) >= 8:
                        found.setdefault(
                            (text, form), Form(canary.name, label, text, variant, form)
                        )
    return list(found.values())


# ------------------------------------------------------------------------------- the scanner


@dataclass(frozen=True)
class Finding:
    where: str
    canary: str
    encoding: str
    context: str
    variant: str = ""
    form: str = ""  # the form of `encodings` found (in its variant)

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.where, self.canary, self.form, self.variant)

    def __str__(self) -> str:
        how = f"{self.encoding}, {self.variant}" if self.variant else self.encoding
        return f"{self.where}: {self.canary} ({how}) in ...{self.context}..."


class Scanner:
    """Finds forms in bytes, in files and in directory trees."""

    def __init__(self, forms: list[Form]) -> None:
        if not forms:
            raise ValueError("no canary forms to search for")
        self.forms = forms
        self._needles = [(f, f.text.encode()) for f in forms]
        handle, name = tempfile.mkstemp(prefix="corral-canary-", suffix=".forms")
        with os.fdopen(handle, "wb") as out:
            out.write(b"\n".join(n for _, n in self._needles) + b"\n")
        self.patterns = Path(name)

    def close(self) -> None:
        self.patterns.unlink(missing_ok=True)

    def _grep(self, *args: str, data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            ["grep", "-F", "-a", "-f", str(self.patterns), *args],
            input=data,
            capture_output=True,
            check=False,
        )

    def maybe(self, data: bytes) -> bool:
        """Whether any form may be in `data` (grep for large data, exact)."""
        if len(data) <= GREP_ABOVE:
            return any(needle in data for _, needle in self._needles)
        return self._grep("-q", data=data).returncode == 0

    def scan(
        self, where: str, data: bytes, *, allowed: Callable[[Form], bool] | None = None
    ) -> list[Finding]:
        if not data or not self.maybe(data):
            return []
        found = []
        for form, needle in self._needles:
            at = data.find(needle)
            if at < 0 or (allowed is not None and allowed(form)):
                continue
            before = data[max(0, at - CONTEXT) : at]
            after = data[at + len(needle) : at + len(needle) + CONTEXT]
            context = (before + needle + after).decode("latin-1").replace("\n", "\\n")
            found.append(
                Finding(where, form.canary, form.encoding, context, form.variant, form.base)
            )
        return found

    def files_with_forms(
        self, roots: list[Path], *, exclude_dirs: tuple[str, ...] = ()
    ) -> list[Path]:
        """Regular files under `roots` (never through a symlink) holding any form."""
        present = [str(r) for r in roots if r.is_dir() and not r.is_symlink()]
        if not present:
            return []
        args = ["-r", "-l", "-D", "skip", "--no-messages"]
        args += [f"--exclude-dir={d}" for d in exclude_dirs]
        done = self._grep(*args, "--", *present)
        # 2: some file could not be read (a pod's file went meanwhile); the rest was read.
        if done.returncode not in (0, 1, 2):
            raise RuntimeError(f"grep failed: {done.stderr.decode(errors='replace')}")
        return [Path(line) for line in done.stdout.decode(errors="surrogateescape").splitlines()]

    def scan_file(self, path: Path, where: str | None = None) -> list[Finding]:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return []  # gone since grep saw it, or a symlink: not read
        with os.fdopen(fd, "rb") as f:
            data = f.read()
        return self.scan(where or f"file {path}", data)


# ---------------------------------------------------------------------------- what is read


@dataclass
class Console:
    """An operator's console, read as `token` (a viewer of `namespace`); `url()` is None
    once its operator stopped."""

    url: Callable[[], str | None]
    token: str
    namespace: str


@dataclass
class Places:
    """Everything the sweep reads; fixtures add operators' logs and consoles as they start."""

    control_plane: ControlPlane | None
    node_workdir: Path | None = None
    repos: list[Path] = field(default_factory=list)  # roots holding the git remotes
    model_urls: list[str] = field(default_factory=list)
    archives: list[Path] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)  # operators' logs
    consoles: list[Console] = field(default_factory=list)


class Sweep:
    """One set of canaries over one set of places. `run()` returns every finding;
    `new_findings()` those not reported by an earlier call (one leak fails one test)."""

    def __init__(self, canaries: list[Canary], places: Places) -> None:
        self.canaries = canaries
        self.places = places
        self.scanner = Scanner(forms_of(canaries))
        self._reported: set[tuple[str, str, str, str]] = set()
        self._models_seen: dict[str, int] = {}
        self.last_seconds = 0.0
        # What the last run read, by kind of place (items, or bytes for the consoles), so a
        # test can tell a sweep that read nothing from one that found nothing.
        self.read: dict[str, int] = {}

    def close(self) -> None:
        self.scanner.close()

    def new_findings(self) -> list[Finding]:
        fresh = []
        for finding in self.run(incremental=True):
            if finding.key not in self._reported:
                self._reported.add(finding.key)
                fresh.append(finding)
        return fresh

    def run(self, *, incremental: bool = False) -> list[Finding]:
        started = time.monotonic()
        self.read = dict.fromkeys(
            ("model requests", "kube objects", "node roots", "operator logs", "archive roots",
             "console bytes", "console stream bytes", "git repositories"), 0,
        )  # fmt: skip
        found: list[Finding] = []
        found += self._model_requests(incremental)
        found += self._kube_objects()
        found += self._node_files()
        found += self._plain_files()
        found += self._archives()
        found += self._consoles()
        found += self._git_remotes()
        self.last_seconds = time.monotonic() - started
        unique = {f.key: f for f in found}
        return list(unique.values())

    # --------------------------------------------------------------------------- the model

    def _model_requests(self, incremental: bool) -> list[Finding]:
        found: list[Finding] = []
        model_key_forms = {f.text for f in self.scanner.forms if f.canary == MODEL_KEY}
        for url in self.places.model_urls:
            answer = httpx.get(f"{url}/_requests", timeout=30)
            answer.raise_for_status()
            requests = answer.json()
            requests = requests["requests"] if isinstance(requests, dict) else requests
            start = self._models_seen.get(url, 0) if incremental else 0
            if start > len(requests):
                start = 0  # cleared meanwhile
            self._models_seen[url] = len(requests)
            self.read["model requests"] += len(requests) - start
            for index in range(start, len(requests)):
                request = requests[index]
                where = f"model request #{index} (conversation {request.get('conversation')!r})"
                body = json.dumps(request.get("body"), ensure_ascii=False).encode()
                found += self.scanner.scan(f"{where} body", body)
                for header, value in (request.get("headers") or {}).items():
                    exempt = header.lower() in MODEL_KEY_HEADERS
                    found += self.scanner.scan(
                        f"{where} header {header}",
                        str(value).encode(),
                        allowed=(lambda f: f.text in model_key_forms) if exempt else None,
                    )
        return found

    # --------------------------------------------------------------------- the API server

    def _kube_objects(self) -> list[Finding]:
        if self.places.control_plane is None:
            return []
        done = self.places.control_plane.kubectl(
            "get", KUBE_KINDS, "--all-namespaces", "-o", "json", timeout=120
        )
        # Read as parsed: kubectl's JSON writes `&`, `<` and `>` as \u escapes.
        items = json.loads(done.stdout).get("items") or []
        self.read["kube objects"] += len(items)
        if not self.scanner.maybe(json.dumps(items, ensure_ascii=False).encode()):
            return []
        found: list[Finding] = []
        for item in items:
            meta = item.get("metadata") or {}
            where = f"kube {item.get('kind')} {meta.get('namespace', '')}/{meta.get('name')}"
            found += self.scanner.scan(where, json.dumps(item, ensure_ascii=False).encode())
        return found

    # ------------------------------------------------------------------------- the node

    def node_roots(self) -> list[Path]:
        workdir = self.places.node_workdir
        if workdir is None:
            return []
        roots: list[Path] = []
        for pod in sorted((workdir / "pods").glob("*")):
            roots.append(pod / "logs")
            roots += [pod / "volumes" / v for v in POD_VOLUMES]
            homes = pod / "home"
            if homes.is_dir():
                roots += [h for h in sorted(homes.iterdir()) if h.name not in NOT_HOMES]
        return roots

    def _node_files(self) -> list[Finding]:
        found: list[Finding] = []
        roots = self.node_roots()
        self.read["node roots"] += sum(1 for r in roots if r.is_dir())
        for path in self.scanner.files_with_forms(roots):
            found += self.scanner.scan_file(path)
        return found

    def _plain_files(self) -> list[Finding]:
        found: list[Finding] = []
        for path in self.places.files:
            self.read["operator logs"] += path.is_file()
            found += self.scanner.scan_file(path)
        return found

    def _archives(self) -> list[Finding]:
        found: list[Finding] = []
        self.read["archive roots"] += sum(1 for r in self.places.archives if r.is_dir())
        for path in self.scanner.files_with_forms(self.places.archives):
            found += self.scanner.scan_file(path, f"archive {path}")
        return found

    # ---------------------------------------------------------------------- the consoles

    def _consoles(self) -> list[Finding]:
        found: list[Finding] = []
        for console in self.places.consoles:
            url = console.url()
            if url is not None:
                found += self._console(url, console)
        return found

    def _console(self, url: str, console: Console) -> list[Finding]:
        found: list[Finding] = []
        headers = {"Authorization": f"Bearer {console.token}"}
        with httpx.Client(base_url=url, headers=headers, timeout=30) as client:

            def read(path: str) -> httpx.Response:
                answer = client.get(path)
                self.read["console bytes"] += len(answer.content)
                found.extend(self.scanner.scan(f"console GET {path}", answer.content))
                return answer

            for path in ("/", "/approvals", "/goals", "/api/v1/approvals", "/api/v1/goals"):
                read(path)
            listed = read("/api/v1/sessions")
            names = [
                (s.get("metadata") or {}).get("name")
                for s in (listed.json().get("items") or [] if listed.status_code == 200 else [])
                if (s.get("metadata") or {}).get("namespace") == console.namespace
            ]
            for name in names:
                ns = console.namespace
                read(f"/ns/{ns}/sessions/{name}")
                read(f"/api/v1/namespaces/{ns}/sessions/{name}")
                events = f"/api/v1/namespaces/{ns}/sessions/{name}/events"
                streamed = _stream(client, events)
                self.read["console stream bytes"] += len(streamed)
                found.extend(self.scanner.scan(f"console GET {events}", streamed))
        return found

    # ----------------------------------------------------------------------- the remotes

    def git_dirs(self) -> list[Path]:
        found: list[Path] = []
        for root in self.places.repos:
            found += _git_dirs(root, depth=3)
        return found

    def _git_remotes(self) -> list[Finding]:
        found: list[Finding] = []
        # Every file of the repositories (config, refs, logs, working trees); objects are
        # compressed on disk, so git reads them out below.
        for path in self.scanner.files_with_forms(self.places.repos, exclude_dirs=("objects",)):
            found += self.scanner.scan_file(path, f"git file {path}")
        for git_dir in self.git_dirs():
            self.read["git repositories"] += 1
            found += self._git_dir(git_dir)
        return found

    def _git_dir(self, git_dir: Path) -> list[Finding]:
        def git(*args: str) -> bytes:
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_CONFIG_NOSYSTEM": "1",
                   "GIT_CONFIG_GLOBAL": os.devnull, "HOME": os.devnull}  # fmt: skip
            done = subprocess.run(
                ["git", "-c", f"safe.directory={git_dir}", "--git-dir", str(git_dir), *args],
                capture_output=True,
                check=False,
                env=env,
            )
            return done.stdout if done.returncode == 0 else b""

        found: list[Finding] = []
        refs = git("for-each-ref", "--format=%(refname) %(objectname) %(symref)")
        refs += b"\n" + git("symbolic-ref", "-q", "HEAD")
        found += self.scanner.scan(f"git {git_dir} refs", refs)
        objects = git("cat-file", "--batch-all-objects", "--batch", "--unordered")
        if self.scanner.maybe(objects):
            for sha, kind, content in _batch_objects(objects):
                found += self.scanner.scan(f"git {git_dir} {kind} {sha}", content)
        return found


def _stream(client: httpx.Client, path: str) -> bytes:
    """What an SSE endpoint sends within CONSOLE_STREAM_SECONDS (it ends sooner for a
    finished Session)."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + CONSOLE_STREAM_SECONDS
    try:
        with client.stream("GET", path, timeout=CONSOLE_STREAM_SECONDS) as answer:
            for chunk in answer.iter_bytes():
                chunks.append(chunk)
                if time.monotonic() > deadline or b"event: end" in chunk:
                    break
    except httpx.TimeoutException:
        pass  # a live turn with nothing new: what came is what is read
    return b"".join(chunks)


def _git_dirs(root: Path, depth: int) -> Iterator[Path]:
    if depth < 0 or not root.is_dir() or root.is_symlink():
        return
    if (root / "HEAD").is_file() and (root / "objects").is_dir():
        yield root
        return
    try:
        children = sorted(root.iterdir())
    except OSError:
        return
    for child in children:
        if child.name == ".git" and child.is_dir():
            yield child
        elif child.is_dir() and not child.is_symlink():
            yield from _git_dirs(child, depth - 1)


def _batch_objects(data: bytes) -> Iterator[tuple[str, str, bytes]]:
    """(sha, type, content) of each object in `git cat-file --batch` output."""
    at = 0
    while at < len(data):
        end = data.index(b"\n", at)
        header = data[at:end].split()
        if len(header) < 3 or header[1] == b"missing":
            at = end + 1
            continue
        size = int(header[2])
        yield header[0].decode(), header[1].decode(), data[end + 1 : end + 1 + size]
        at = end + 1 + size + 1


def report(findings: list[Finding], *, title: str) -> str:
    lines = [f"{title}: {len(findings)} finding(s)"]
    lines += [f"  - {f}" for f in sorted(findings, key=lambda f: (f.where, f.canary, f.encoding))]
    return "\n".join(lines)
