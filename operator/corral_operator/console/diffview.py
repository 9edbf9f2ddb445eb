"""A Session's changes as HTML, the way a pull request shows them: each turn with its revision,
its files (status, lines added and removed) and its patch coloured line by line on the server
(no script, no highlighter library). Pure: `changes.read_changes`'s record in, escaped HTML out.
"""

from __future__ import annotations

import re
from html import escape
from typing import Any

Obj = dict[str, Any]

_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")
# Header lines worth showing (a rename, a mode, a binary file); the rest (index, ---, +++)
# repeat what the file's heading says.
_NOTES = ("new file mode", "deleted file mode", "old mode", "new mode", "rename from",
          "rename to", "copy from", "copy to", "Binary files", "similarity index")  # fmt: skip
MAX_LINES_SHOWN = 4000  # patch lines rendered over a whole page; the rest are counted
_STATUS = {"A": "added", "M": "modified", "D": "deleted", "R": "renamed", "C": "copied",
           "T": "type changed"}  # fmt: skip


def _sentence(text: str) -> str:
    text = text.strip()
    if not text:
        return text
    return text[0].upper() + text[1:] + ("" if text.endswith((".", "?", "!")) else ".")


def _e(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def _short(sha: object) -> str:
    return _e(str(sha or "")[:12])


def split_patch(patch: str) -> list[list[str]]:
    """The patch's lines, one list per file (each starts at its `diff --git` line)."""
    files: list[list[str]] = []
    for line in patch.split("\n"):
        if line.startswith("diff --git "):
            files.append([line])
        elif files:
            files[-1].append(line)
    if files and files[-1] and files[-1][-1] == "":
        files[-1].pop()  # the patch's final newline
    return files


def _rows(lines: list[str], budget: list[int]) -> str:
    """One file's patch as table rows: hunk headings, then each line with its old and new line
    numbers, coloured by kind. `budget` is the lines still to render on the page."""
    rows: list[str] = []
    old = new = 0
    in_hunk = False
    for line in lines[1:]:
        if budget[0] <= 0:
            rows.append('<tr class="d-more"><td colspan="3">… more lines not shown</td></tr>')
            break
        hunk = _HUNK.match(line)
        if hunk:
            in_hunk = True
            old, new = int(hunk.group(1)), int(hunk.group(2))
            rows.append(f'<tr class="d-hunk"><td></td><td></td><td>{_e(line)}</td></tr>')
        elif not in_hunk:
            if line.startswith(_NOTES):
                rows.append(f'<tr class="d-note"><td></td><td></td><td>{_e(line)}</td></tr>')
            continue
        elif line.startswith("+"):
            rows.append(f'<tr class="d-add"><td></td><td>{new}</td><td>{_e(line)}</td></tr>')
            new += 1
        elif line.startswith("-"):
            rows.append(f'<tr class="d-del"><td>{old}</td><td></td><td>{_e(line)}</td></tr>')
            old += 1
        elif line.startswith("\\"):
            rows.append(f'<tr class="d-note"><td></td><td></td><td>{_e(line)}</td></tr>')
        else:
            rows.append(f'<tr class="d-ctx"><td>{old}</td><td>{new}</td><td>{_e(line)}</td></tr>')
            old += 1
            new += 1
        budget[0] -= 1
    return "".join(rows)


def _counts(f: Obj) -> str:
    if f.get("binary"):
        return '<span class="muted">binary</span>'
    return f'<span class="n-add">+{int(f.get("added") or 0)}</span> ' + (
        f'<span class="n-del">&minus;{int(f.get("removed") or 0)}</span>'
    )


def _path(f: Obj) -> str:
    if f.get("oldPath"):
        return f"{_e(f['oldPath'])} → {_e(f.get('path'))}"
    return _e(f.get("path"))


def _file(f: Obj, lines: list[str] | None, budget: list[int]) -> str:
    status = str(f.get("status") or "M")
    head = (
        f'<div class="file-head"><span class="fstat fstat-{_e(status)}" '
        f'title="{_e(_STATUS.get(status, status))}">{_e(status)}</span> '
        f"<code>{_path(f)}</code> {_counts(f)}</div>"
    )
    if lines is None:
        body = '<p class="muted">patch not shown (over the size the console reads)</p>'
    else:
        rows = _rows(lines, budget)
        body = (
            f'<div class="diff-scroll"><table class="diff">{rows}</table></div>'
            if rows
            else '<p class="muted">no textual change</p>'
        )
    return f'<div class="file" data-path="{_e(f.get("path"))}">{head}{body}</div>'


def _turn_label(turn: Obj, turn_of: dict[str, int]) -> str:
    submission = turn.get("submission")
    if submission and submission in turn_of:
        label = f"Turn {turn_of[submission]}"
    elif submission:
        label = f"Submission {_e(submission)}"
    else:
        label = "The agent's own commits"
    return label


def turn_html(turn: Obj, turn_of: dict[str, int], session: str, budget: list[int]) -> str:
    files = list(turn.get("files") or [])
    patches = split_patch(str(turn.get("patch") or ""))
    shown = "".join(
        _file(f, patches[i] if i < len(patches) else None, budget) for i, f in enumerate(files)
    )
    more = int(turn.get("moreFiles") or 0)
    if more:
        shown += f'<p class="muted">… and {more} more files</p>'
    if turn.get("patchTruncated"):
        shown += '<p class="muted">The patch is cut at the size the console reads.</p>'
    other = turn.get("session")
    elsewhere = f" · from session {_e(other)}" if other and other != session else ""
    commits = "".join(
        f"<li><code>{_short(c.get('sha'))}</code> {_e(c.get('subject'))}</li>"
        for c in turn.get("commits") or []
    )
    listing = "".join(
        f'<li><span class="fstat fstat-{_e(f.get("status"))}">{_e(f.get("status"))}</span> '
        f"<code>{_path(f)}</code> {_counts(f)}</li>"
        for f in files
    )
    return (
        f'<details class="turn" open data-revision="{_e(turn.get("revision"))}">'
        f"<summary><b>{_turn_label(turn, turn_of)}</b> "
        f'<code class="rev">{_short(turn.get("revision"))}</code> · {len(files) + more} '
        f"file{'s' if len(files) + more != 1 else ''} · "
        f'<span class="n-add">+{int(turn.get("added") or 0)}</span> '
        f'<span class="n-del">&minus;{int(turn.get("removed") or 0)}</span>{elsewhere}</summary>'
        f'<ul class="commits">{commits}</ul><ul class="files">{listing}</ul>{shown}</details>'
    )


def changes_html(changes: Obj | None, turn_of: dict[str, int], session: str) -> str:
    """The Changes section's content: why there is nothing to show, or every turn's work."""
    if changes is None:
        return '<p class="empty">This console does not read delivered changes.</p>'
    if changes.get("pending"):
        return '<p class="empty" data-pending="true">Reading the delivered changes…</p>'
    where = ""
    if changes.get("remote"):
        branch = f" · branch <code>{_e(changes['branch'])}</code>" if changes.get("branch") else ""
        where = f'<p class="where">from <code>{_e(changes["remote"])}</code>{branch}</p>'
    if changes.get("unavailable"):
        return f'{where}<p class="empty">{_e(_sentence(str(changes["unavailable"])))}</p>'
    turns = list(changes.get("turns") or [])
    head = (
        f'{where}<p class="where">base <code>{_short(changes.get("base"))}</code> → delivered '
        f'<code class="rev">{_short(changes.get("revision"))}</code></p>'
    )
    if not turns:
        return head + '<p class="empty">No commit between the base and the delivered revision.</p>'
    notes = []
    if changes.get("olderTurns"):
        notes.append(f"{int(changes['olderTurns'])} earlier turns are not shown")
    if changes.get("note"):
        notes.append(str(changes["note"]))
    note = "".join(f'<p class="muted">{_e(n)}.</p>' for n in notes)
    budget = [MAX_LINES_SHOWN]
    return head + note + "".join(turn_html(t, turn_of, session, budget) for t in turns)
