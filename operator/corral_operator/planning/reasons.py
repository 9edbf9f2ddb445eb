"""The one vocabulary of a Session's condition reasons (Ready, Progressing, Succeeded, Failed).

Every reason the operator writes on a Session is named here; docs/vocabulary.md tables them.
Besides these, Progressing carries `Turn<N>InFlight` while a turn runs and the phase name
(Pending, Running, WaitingForHuman, WaitingForChildren) otherwise.
"""

from __future__ import annotations

# Ready: the sandbox.
SANDBOX_PENDING = "SandboxPending"  # the pod is not created yet
SANDBOX_STARTING = "SandboxStarting"  # waiting for the harness to be ready
SANDBOX_READY = "SandboxReady"  # the harness is serving
SANDBOX_RELEASED = "SandboxReleased"  # the pod was removed
SANDBOX_KEPT = "SandboxKept"  # the pod stays after the end (keepSandbox)
SANDBOX_REFUSED = "SandboxRefused"  # the API server refused a sandbox object; retried

# Progressing while the session cannot start yet.
CREATING_SANDBOX = "CreatingSandbox"
SANDBOX_CONFLICT = "SandboxConflict"  # objects of an earlier Session of this name are going
AGENT_NOT_FOUND = "AgentNotFound"  # its Agent, or an ancestor's, does not exist (yet)
AGENT_NOT_READY = "AgentNotReady"  # its Agent is not valid

# Succeeded / Failed: how the session ended.
COMPLETED = "Completed"
EVALUATION_PASSED = "EvaluationPassed"
EVALUATION_FAILED = "EvaluationFailed"
STOPPED = "Stopped"
TURN_FAILED = "TurnFailed"
TURN_ABORTED = "TurnAborted"
TURN_RUNAWAY = "TurnRunaway"  # the runaway watch stopped a turn (docs/ledger.md)
FAILED = "Failed"  # failed, no more specific reason known
INVALID_SPEC = "InvalidSpec"  # the spec cannot work (names the field)
OBJECT_IN_THE_WAY = "ObjectInTheWay"  # a Secret, policy or pod with the sandbox's name is not its
SANDBOX_LOST = "SandboxLost"  # the pod went away mid-session (and it does not resume)
BUDGET_EXCEEDED = "BudgetExceeded"  # the custodian's record says the budget is spent
TURN_LIMIT_REACHED = "TurnLimitReached"  # no turn left (its own cap, or its parent's)

# Delivered (docs/delivery.md): how the last turn's work reached the session's branch; also
# Failed's reason when a session that would have succeeded could not deliver its work.
DELIVERED = "Delivered"  # the turn's commit was pushed
NOTHING_TO_DELIVER = "NothingToDeliver"  # the turn changed nothing since the last push
DELIVERY_FAILED = "DeliveryFailed"  # the push was refused or failed
NO_REMOTE = "NoRemote"  # the repo is not a remote the custodian pushes to (a local path)

# Frozen (a Freeze holds the session; docs/freeze.md), and Progressing while it holds.
FROZEN = "Frozen"  # a Freeze in force holds it: nothing is admitted, a turn in flight is aborted
THAWED = "Thawed"  # the freeze was lifted (deleted or `frozen: false`)

# Archived (docs/history.md): the transcript and receipts kept before the sandbox pod went.
ARCHIVED = "Archived"  # written to the archive
ARCHIVE_FAILED = "ArchiveFailed"  # not written by the deadline; the pod went anyway
HISTORY_TOO_LARGE = "HistoryTooLarge"  # over --max-history-bytes: the record alone is archived

# Resumed (docs/turns.md, "A lost pod"): the Session continues in a new pod after its pod was
# lost; the reason says how it was lost, and Progressing says Resuming until the new pod serves.
RESUMING = "Resuming"
POD_DELETED = "PodDeleted"  # the pod was deleted (by a person, a drain's eviction, the GC)
POD_EVICTED = "PodEvicted"  # the kubelet evicted it (node pressure)
NODE_LOST = "NodeLost"  # its node stopped answering
# The operator drained the pod: its harness speaks a wire version this operator cannot drive
# (docs/operations.md, "Upgrade"); the new pod runs the operator's own sandbox image.
VERSION_SKEW = "VersionSkew"

# Suspended (docs/turns.md, "Suspend and resume"): spec.suspend parks the Session; the reason
# says where it stands, and Progressing carries the same reason while it holds.
SUSPENDING = "Suspending"  # its turn in flight ends first (suspendMode), then its pod goes
SUSPENDED = "Suspended"  # parked: archived, no pod (or, without an archive, its pod kept idle)
UNSUSPENDED = "Unsuspended"  # spec.suspend is false again: it resumes in a new pod
