"""The scripted model: an Anthropic-compatible Messages API server that replays a script.

Run it with `python -m corral_dev.scripted --port N --script FILE`, or in a test process
with `serve_in_thread(ScriptedModel(script))`. It answers `POST /v1/messages` (streaming and
not), tells conversations apart by `metadata.user_id` (the harness sends the conversation id),
and records every request: `GET /_requests[?conversation=ID]` lists them (body and a few
headers, and the usage it was billed), `DELETE /_requests` clears them; `DELETE /_cache`
empties its prompt cache. `POST /_script` loads more script at run time (same format, JSON;
conversations it names restart from their first reply; `?replace=1` replaces everything). A
request whose tool_use ids lack a tool_result in the next message is refused with 400, as the
real provider does.

A tool of the devtools, in neither image: the tests, the benchmarks, `make dev-cluster` and
`corral run` without a model key start it (the published wheel carries corral_dev).

Script format (YAML or JSON)::

    default:                 # replies for every conversation not named below
      - text: "Hello from the scripted model."
    conversations:
      demo-1:                # replies in order, one per model request of this conversation
                             # (a key with * ? [ is a glob: boss-child-????? matches any
                             # child Session the custodian names from boss)
        - thinking: "I will look first."
          text: "Listing files."
          tool_use: {name: bash, input: {command: "ls"}}
        - when: {tool_result_contains: "README"}   # a check on the request...
          text: "There is a README."
          otherwise: {text: "No README here."}     # ...and the reply when it fails
        - {tool_use: {name: bash, input: {command: "echo step"}}, repeat: 20}
        - fault: {status: 529, type: overloaded_error}          # HTTP error before content
        - fault: {error_event: true, after_blocks: 1}           # error event mid-stream
          text: "partial answer"
        - {fault: {silence: 5}, text: "late"}                   # silence before content
        - {fault: {truncate: true, after_blocks: 1}, text: "a"} # stream closes early
        - {text: "slowly", event_delay: 0.2, delay: 0.5}        # slow stream, slow start
        - "a plain string is a text reply"
        - classify: {understood: "...", done: "...", clear: true, route: oneTool}
        - plan: [{title: "run the tests", check: {exitCode: 0}}]   # the planner opens a plan
        - plan_edit: {step: 1, title: "...", check: {token: OK}}   # ...or replans a step

A reply holds blocks in the order thinking, text, tool_use(s) (`tool_uses: [...]` for
several), or an explicit `content: [{type: text|thinking|tool_use, ...}]` list; `stop_reason`
defaults to tool_use when a tool_use is present, else end_turn. Usage is estimated (a quarter
of the JSON's length) and split as the provider's prompt cache splits it: every request's
marked prefixes (`cache_control`) are written to a cache of the server's own, and a later
request that starts with one is billed a cache read for it (`_cache.py`). A reply's `usage`
overrides the estimate (naming one of the input side's fields names them all: the others are 0).
Checks: tool_result_contains, last_user_contains, system_contains, tools_include; a failing
check without `otherwise` answers 400. `after_blocks: k` puts a fault after the first k content
blocks. When a conversation's replies run out, the model answers a short text saying so.

`classify`, `plan` and `plan_edit` are shorthands for the tool calls of the turn's scheduler
(the classifier's `classify`, the planner's `plan_open` and `plan_edit_step`; docs/turns.md):
they take the reply's place in the conversation's order like any other reply.
"""

from ._script import Fault, Reply, Script, ScriptError, load_script, parse_script
from ._server import EXHAUSTED, RunningServer, ScriptedModel, serve_in_thread

__all__ = [
    "EXHAUSTED",
    "Fault",
    "Reply",
    "RunningServer",
    "Script",
    "ScriptError",
    "ScriptedModel",
    "load_script",
    "parse_script",
    "serve_in_thread",
]
