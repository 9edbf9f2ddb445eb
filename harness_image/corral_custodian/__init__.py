"""The custodian: the sandbox pod's third container, which holds every credential.

The agent's commands run in the tools container and can reach the custodian's port over the pod
network, so the custodian trusts no caller. It answers only the harness's pod-local credential
(and the operator's wire token on a port of its own, for its usage record), and behind that
still enforces every rule itself: a model proxy holding the key, with the Agent's model,
max_tokens, concurrency, size and a reserved budget; the Menu of control tools under the
Agent's allow/deny lists, caps and approvals; and `git push` to the session's own branch from a
mirror of its own. The decisions are pure functions (`rules`, `budget`, `model_rules`, `menu`).
"""
