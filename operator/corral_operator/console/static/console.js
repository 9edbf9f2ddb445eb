// Corral console: the live parts of a session page. The page reads fine without this script;
// it adds the turn's stream (Server-Sent Events), a status refresh, and decisions without a
// page load. No framework, no build step.
"use strict";

(function () {
  const boot = document.getElementById("boot");
  if (!boot) return;
  const { namespace, session } = JSON.parse(boot.textContent);
  const base = `/api/v1/namespaces/${encodeURIComponent(namespace)}/sessions/${encodeURIComponent(session)}`;
  const stream = document.getElementById("stream");
  const streamState = document.getElementById("stream-state");
  const toolItems = new Map();

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function add(node) {
    stream.appendChild(node);
    node.scrollIntoView({ block: "nearest" });
  }

  function render(ev) {
    switch (ev.type) {
      case "message": {
        for (const block of ev.content || []) {
          if (block.type === "text" && block.text) {
            const li = el("li", `msg role-${ev.role || "assistant"}`);
            li.appendChild(el("span", "who", ev.role || "assistant"));
            li.appendChild(el("div", "text", block.text));
            add(li);
          }
        }
        break;
      }
      case "tool_start": {
        const li = el("li", "tool");
        li.dataset.tool = ev.name;
        li.appendChild(el("span", "who", "tool"));
        li.appendChild(el("code", "call", `${ev.name} ${JSON.stringify(ev.input || {})}`));
        toolItems.set(ev.toolUseId, li);
        add(li);
        break;
      }
      case "tool_end": {
        const li = toolItems.get(ev.toolUseId) || el("li", "tool");
        const out = el("pre", ev.isError ? "result error" : "result", ev.result || "");
        li.appendChild(out);
        if (!li.parentNode) add(li);
        break;
      }
      case "tool_blocked":
        add(el("li", "blocked", `${ev.name}: ${ev.outcome} — ${ev.reason || ""}`));
        break;
      case "approval_requested":
        add(el("li", "asked", `waiting for a person: approval ${ev.approvalId} (${ev.name})`));
        refresh();
        break;
      case "settled": {
        const r = ev.receipt || {};
        const cost = ev.usage && ev.usage.cost !== undefined ? ` · $${Number(ev.usage.cost).toFixed(4)}` : "";
        add(el("li", `settled status-${ev.status}`,
          `turn settled ${ev.status}${ev.error ? ` (${ev.error.type})` : ""}` +
          `${r.outcome ? ` · ${r.outcome}` : ""}${r.route ? ` · route ${r.route}` : ""}${cost}`));
        refresh();
        break;
      }
      case "phase":
        add(el("li", "phase-step", `phase ${ev.phase}${ev.detail ? `: ${ev.detail}` : ""}`));
        break;
      default:
        break;
    }
  }

  function connect() {
    const source = new EventSource(`${base}/events`);
    source.addEventListener("wire", (m) => render(JSON.parse(m.data)));
    source.addEventListener("state", (m) => {
      const s = JSON.parse(m.data).state;
      streamState.textContent = s;
      // A finished session's turn is a record (its pod's, or the archive's): never "live".
      streamState.dataset.state = s === "live" ? "live" : (s === "archived" || s === "finished") ? "ended" : "waiting";
    });
    source.addEventListener("end", (m) => {
      streamState.textContent = JSON.parse(m.data).reason;
      streamState.dataset.state = "ended";
      source.close();
      refresh();
    });
  }

  async function refresh() {
    const answer = await fetch(base, { headers: { Accept: "application/json" } });
    if (!answer.ok) return;
    const view = await answer.json();
    for (const [id, html] of Object.entries(view.fragments)) {
      const node = document.getElementById(id);
      if (node && node.innerHTML !== html) replaceKeepingReasons(node, html);
    }
    wireDecisions();
    // The session ended: what the stream shows from now on is its record, not a live turn.
    if (view.finished && streamState.dataset.state === "live") {
      streamState.textContent = "finished";
      streamState.dataset.state = "ended";
    }
    refreshChanges(view.delivered || "");
  }

  // A fragment is redrawn every 2 s (ages tick): a reason a person is typing into an Approval's
  // form, and the caret in it, must survive the redraw, or the decision goes without it.
  function replaceKeepingReasons(node, html) {
    const typed = new Map();
    let focused = null;
    for (const input of node.querySelectorAll("form.decide input[name=reason]")) {
      const key = input.form.dataset.approval;
      if (input.value) typed.set(key, input.value);
      if (document.activeElement === input) {
        focused = { key, start: input.selectionStart, end: input.selectionEnd };
      }
    }
    node.innerHTML = html;
    for (const input of node.querySelectorAll("form.decide input[name=reason]")) {
      const key = input.form.dataset.approval;
      if (typed.has(key)) input.value = typed.get(key);
      if (focused && focused.key === key) {
        input.focus();
        input.setSelectionRange(focused.start, focused.end);
      }
    }
  }

  // The Changes are read from git once per delivered revision (the server keeps them): again
  // only when a turn delivers a new one, or when the page could not wait for them.
  let changesLoading = false;
  async function refreshChanges(delivered) {
    const section = document.getElementById("changes");
    if (!section || changesLoading) return;
    if (section.dataset.revision === delivered && !section.dataset.pending) return;
    changesLoading = true;
    try {
      const answer = await fetch(`${base}/changes`, { headers: { Accept: "application/json" } });
      if (!answer.ok) {
        // Not asked again every 2 s: the next delivered revision, or a reload, tries again.
        section.dataset.revision = delivered;
        delete section.dataset.pending;
        return;
      }
      const found = await answer.json();
      const fresh = document.createElement("div");
      fresh.innerHTML = found.html;
      section.replaceWith(fresh.firstElementChild);
    } finally {
      changesLoading = false;
    }
  }

  // Decisions go to the JSON API; the console writes them with your own credentials.
  function wireDecisions() {
    for (const form of document.querySelectorAll("form.decide")) {
      if (form.dataset.wired) continue;
      form.dataset.wired = "1";
      form.addEventListener("submit", async (e) => {
        e.preventDefault();
        const decision = e.submitter ? e.submitter.value : "Approved";
        const reason = form.querySelector("input[name=reason]").value;
        const url = `/api/v1/namespaces/${encodeURIComponent(form.dataset.namespace)}` +
          `/approvals/${encodeURIComponent(form.dataset.approval)}/decision`;
        const answer = await fetch(url, {
          method: "POST",
          headers: { "Content-Type": "application/json" },
          body: JSON.stringify({ decision, reason }),
        });
        if (!answer.ok) {
          const body = await answer.json().catch(() => ({}));
          form.appendChild(el("span", "refused", body.reason || `refused (${answer.status})`));
        }
        refresh();
      });
    }
  }

  wireDecisions();
  connect();
  setInterval(refresh, 2000);
})();
