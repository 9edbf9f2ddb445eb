"""The custodian: the sandbox pod's second container, which holds every credential.

The harness container runs the agent's tools, so anything it can read the agent can read. The
custodian keeps the model key, the git credentials and the pod's only service-account token,
and offers the harness (and, unavoidably, the agent's shell) three narrow doors: a model proxy
with a budget, the Menu of control tools, and `git push` to the session's own branch. Every rule
is enforced here, in pure functions (`rules`, `budget`), because the caller cannot be trusted.
"""
