"""The `corral.dev/v1alpha1` kinds: Agent, Session, Goal, Evidence, Approval.

These pydantic models are the single source of truth: `make crds` derives the CRD schemas from
them, `corral run` validates local YAML with them, and the harness reads an Agent spec with them.
Constraints that span fields are CEL rules, so the API server enforces them too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from ._base import (
    AGE,
    ApiModel,
    Condition,
    KindInfo,
    PrinterColumn,
    Resource,
    cel,
    field_rules,
    with_rules,
)

ThinkingLevel = Literal["low", "medium", "high"]
LoopKind = Literal["auto", "reactive", "plan", "direct"]
SessionPhase = Literal[
    "Pending",
    "Running",
    "WaitingForHuman",
    "WaitingForChildren",
    "Succeeded",
    "Failed",
    "Stopped",
]
SettlementStatus = Literal["completed", "ended", "failed", "aborted"]

# Caps the model can never raise; an Agent may only lower them.
MAX_DEPTH_CAP = 3
MAX_CHILDREN_PER_TURN_CAP = 5
MAX_OUTPUT_TOKENS_CAP = 32000
MAX_TURNS_CAP = 1000

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
SHA_RULE = "self.matches('^[0-9a-f]{40}$')"
SHA_MESSAGE = "must be a full 40-character lowercase hexadecimal git commit SHA"
# git check-ref-format, the parts a CEL regex can state.
BRANCH_RULE = (
    "self.matches('^[A-Za-z0-9._/-]+$') && !self.startsWith('/') && !self.endsWith('/')"
    " && !self.endsWith('.lock') && !self.contains('..') && !self.contains('//')"
    " && !self.startsWith('-')"
)
BRANCH_MESSAGE = (
    "must be a valid git branch name: letters, digits, '.', '_', '-', '/', "
    "no '..' or '//', not starting with '/' or '-', not ending with '/' or '.lock'"
)


def _conditions() -> Any:
    return Field(
        default_factory=list,
        description="Standard conditions (Ready, Progressing, Succeeded, ...).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


# --------------------------------------------------------------------------------------- Agent


class ToolPolicy(ApiModel):
    """Which tools the model may call. Default deny; deny beats allow, even under `*`."""

    allow: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Tool name patterns the model may call; `*` and `?` are wildcards.",
    )
    deny: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Tool name patterns that are refused even when an allow pattern matches.",
    )


class Budget(ApiModel):
    """A spending cap. `tokens` counts input + output + cache writes; `costUSD` prices every
    token, cache reads included. Unset means no cap on that axis."""

    tokens: int | None = Field(
        default=None, ge=1, le=10_000_000_000, description="Tokens: input + output + cache writes."
    )
    cost_usd: float | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        alias="costUSD",
        description="Cost in USD at the model catalog's prices, cache reads included.",
    )


class AgentLimits(ApiModel):
    """Structural limits; each is capped and the model cannot raise any of them."""

    max_turns: int = Field(default=20, ge=1, le=MAX_TURNS_CAP, description="Turns per session.")
    max_depth: int = Field(
        default=MAX_DEPTH_CAP, ge=0, le=MAX_DEPTH_CAP, description="Depth of the child tree."
    )
    max_children_per_turn: int = Field(
        default=MAX_CHILDREN_PER_TURN_CAP,
        ge=0,
        le=MAX_CHILDREN_PER_TURN_CAP,
        description="New child sessions a parent may start in one turn.",
    )
    max_output_tokens: int = Field(
        default=MAX_OUTPUT_TOKENS_CAP,
        ge=1,
        le=MAX_OUTPUT_TOKENS_CAP,
        description="Soft cap on output tokens per model call.",
    )
    budget: Budget | None = Field(
        default=None,
        description="The cap for each Session of this Agent; a Session may only lower it.",
    )


class LayerBudgets(ApiModel):
    """Token budget for each context layer; unset layers use the harness defaults."""

    identity: int | None = Field(default=None, ge=0, le=1_000_000, description="Identity layer.")
    instruction_files: int | None = Field(
        default=None, ge=0, le=1_000_000, description="AGENTS.md files and instructions."
    )
    project_context: int | None = Field(
        default=None, ge=0, le=1_000_000, description="Project context."
    )
    business_rules: int | None = Field(
        default=None, ge=0, le=1_000_000, description="Business rules."
    )
    task_state: int | None = Field(default=None, ge=0, le=1_000_000, description="Task state.")


class ResourceList(ApiModel):
    cpu: str | None = Field(default=None, description="CPU quantity, e.g. 500m.")
    memory: str | None = Field(default=None, description="Memory quantity, e.g. 1Gi.")


class SandboxResources(ApiModel):
    requests: ResourceList | None = Field(default=None, description="Requested resources.")
    limits: ResourceList | None = Field(default=None, description="Resource limits.")


class EgressRule(ApiModel):
    """One destination the sandbox may reach."""

    cidr: str = Field(description="Destination CIDR, e.g. 10.0.0.0/8.", max_length=64)
    ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(
        default_factory=list, max_length=64, description="TCP ports; empty means all ports."
    )


class Sandbox(ApiModel):
    image: str | None = Field(
        default=None, description="Sandbox image; the operator's default when unset."
    )
    resources: SandboxResources | None = Field(default=None, description="Pod resources.")
    runtime_class_name: str | None = Field(
        default=None, description="RuntimeClass, e.g. gvisor or kata, for stronger isolation."
    )
    egress: list[EgressRule] = Field(
        default_factory=list, description="Egress allowlist; empty means no egress."
    )


class SecretKeyRef(ApiModel):
    name: str = Field(description="Secret name in the Agent's namespace.", pattern=DNS_LABEL)
    key: str = Field(description="Key within the Secret.", min_length=1)


class Credentials(ApiModel):
    """Secrets only the custodian container ever mounts."""

    model_secret_ref: SecretKeyRef | None = Field(default=None, description="The model API key.")
    git_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Git credentials for clone and push."
    )


class ChildPolicy(ApiModel):
    """Which Agents this orchestrator's children may run under; its own Agent otherwise."""

    agents: list[Annotated[str, Field(pattern=DNS_LABEL, max_length=253)]] = Field(
        default_factory=list,
        max_length=64,
        description="Agents (in this namespace) a child may name besides this one.",
    )


class LandingCheck(ApiModel):
    """The Evidence check a revision must Pass before push-to-land, merge or land."""

    name: str = Field(
        min_length=1, max_length=63, pattern=DNS_LABEL, description="Check name, e.g. unit-tests."
    )
    command: str = Field(min_length=1, max_length=65536, description="Command; exit 0 passes.")
    image: str | None = Field(
        default=None, max_length=1024, description="Image to run it in; the sandbox's otherwise."
    )
    egress: list[EgressRule] = Field(
        default_factory=list, description="Where the check's pod may connect; none by default."
    )


class Landing(ApiModel):
    check: LandingCheck | None = Field(
        default=None, description="Evidence that must Pass for a revision before it lands."
    )


class AgentSpec(ApiModel):
    """A reusable agent definition; re-read by every submission."""

    identity: str = Field(min_length=1, max_length=65536, description="The system prompt.")
    instructions: str = Field(
        default="", max_length=65536, description="Instructions above every AGENTS.md."
    )
    model: str = Field(min_length=1, max_length=128, description="Model name from the catalog.")
    thinking_level: ThinkingLevel = Field(default="medium", description="low, medium or high.")
    tools: ToolPolicy = Field(default_factory=ToolPolicy, description="Tool allow/deny policy.")
    loop: LoopKind = Field(
        default="auto", description="auto (the scheduler picks), reactive, plan or direct."
    )
    limits: AgentLimits = Field(default_factory=AgentLimits, description="Structural limits.")
    budgets: LayerBudgets = Field(
        default_factory=LayerBudgets, description="Token budget per context layer."
    )
    orchestrator: bool = Field(default=False, description="Only orchestrators may start children.")
    sandbox: Sandbox = Field(default_factory=Sandbox, description="Sandbox pod settings.")
    credentials: Credentials = Field(
        default_factory=Credentials, description="Secrets for the custodian."
    )
    children: ChildPolicy = Field(
        default_factory=ChildPolicy, description="Agents a child session may run under."
    )
    landing: Landing = Field(default_factory=Landing, description="The check before landing.")

    model_config = with_rules(
        cel(
            "!has(self.tools) || !has(self.tools.allow) || !has(self.tools.deny)"
            " || self.tools.allow.all(p, !(p in self.tools.deny))",
            "a tool pattern cannot be in both tools.allow and tools.deny",
            field_path=".tools",
        ),
        cel(
            "self.orchestrator || !has(self.limits) || !has(self.limits.maxDepth)"
            " || self.limits.maxDepth == 3",
            "limits.maxDepth only applies to orchestrators; set orchestrator: true",
            field_path=".limits.maxDepth",
        ),
    )


class AgentStatus(ApiModel):
    conditions: list[Condition] = _conditions()
    observed_generation: int | None = Field(default=None, description="Last generation seen.")


class Agent(Resource):
    """A reusable agent definition."""

    api_version: Literal["corral.dev/v1alpha1"] = "corral.dev/v1alpha1"
    kind: Literal["Agent"] = "Agent"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: AgentSpec
    status: AgentStatus | None = None

    info = KindInfo(
        kind="Agent",
        plural="agents",
        short_names=("ag",),
        description="A reusable coding-agent definition: identity, model, tools and limits.",
        columns=(
            PrinterColumn("Model", ".spec.model"),
            PrinterColumn("Loop", ".spec.loop"),
            PrinterColumn("Orchestrator", ".spec.orchestrator", "boolean"),
            PrinterColumn("Ready", '.status.conditions[?(@.type=="Ready")].status'),
            AGE,
        ),
    )


# ------------------------------------------------------------------------------------- Session


class Workspace(ApiModel):
    repo: str = Field(min_length=1, max_length=2048, description="Git URL or path to clone.")
    ref: str = Field(default="HEAD", max_length=255, description="Ref to check out.")
    branch: str | None = Field(
        default=None,
        max_length=255,
        description="The one branch this session may push to.",
        json_schema_extra=field_rules(cel(BRANCH_RULE, BRANCH_MESSAGE)),
    )
    granted_root: str = Field(
        default="/workspace",
        max_length=1024,
        description="The directory tree the agent's tools may touch: /workspace or below.",
        json_schema_extra=field_rules(
            cel(
                "(self == '/workspace' || self.startsWith('/workspace/'))"
                " && !self.contains('/../') && !self.endsWith('/..') && !self.contains('//')",
                "must be /workspace or a path below it, without '..' (the workspace volume is"
                " always mounted at /workspace)",
            )
        ),
    )


class ObjectRef(ApiModel):
    name: str = Field(min_length=1, max_length=253, description="Object name.")
    uid: str | None = Field(default=None, description="Object uid, when it must match.")


class SessionOverrides(ApiModel):
    model: str | None = Field(default=None, max_length=128, description="Model for this session.")
    thinking_level: ThinkingLevel | None = Field(default=None, description="low, medium or high.")


class EvaluationCriteria(ApiModel):
    """Exactly one test: a substring of the turn's answer, or a command's exit status."""

    substring: str | None = Field(
        default=None, min_length=1, description="Passes when the answer contains it."
    )
    command: str | None = Field(
        default=None, min_length=1, description="Passes when it exits 0 in the workspace."
    )

    model_config = with_rules(
        cel(
            "has(self.substring) != has(self.command)",
            "set exactly one of substring or command",
        )
    )


class Evaluation(ApiModel):
    """The evaluation guard: pass stops, fail gives another turn until the budget is spent."""

    criteria: EvaluationCriteria = Field(description="The test run after each turn.")
    turn_budget: int = Field(default=3, ge=1, le=100, description="Turns the guard may use.")


class Wake(ApiModel):
    """A one-shot wake: the session stays open until it fires or the session is stopped."""

    after_seconds: int = Field(ge=1, le=31_536_000, description="Seconds after the last turn.")
    message: str = Field(default="Wake up: continue the task.", description="Message on wake.")


class SessionSpec(ApiModel):
    agent_ref: str = Field(
        min_length=1, max_length=253, pattern=DNS_LABEL, description="Agent in this namespace."
    )
    task: str = Field(min_length=1, max_length=262144, description="The task message.")
    workspace: Workspace = Field(description="What to check out and where.")
    read_only: bool = Field(default=False, description="Refuse writes and command execution.")
    parent_ref: ObjectRef | None = Field(default=None, description="Parent session, for children.")
    overrides: SessionOverrides | None = Field(default=None, description="Per-session dials.")
    evaluation: Evaluation | None = Field(default=None, description="Evaluation guard.")
    keep_sandbox: bool = Field(default=False, description="Keep the pod after the session ends.")
    ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, le=31_536_000, description="Delete the Session this long after it ends."
    )
    wake: Wake | None = Field(default=None, description="One-shot wake.")
    budget: Budget | None = Field(
        default=None, description="Lowers the Agent's budget for this session (never raises it)."
    )
    landing: Landing | None = Field(
        default=None, description="Replaces the Agent's landing check for this session."
    )

    model_config = with_rules(
        cel(
            "!self.readOnly || !has(self.workspace.branch)",
            "a read-only session cannot have a branch to push to",
            field_path=".workspace.branch",
        ),
        cel(
            "self.agentRef == oldSelf.agentRef",
            "agentRef is immutable",
            field_path=".agentRef",
        ),
    )


class AdmissionLedger(ApiModel):
    """The turn in flight, so a restarted operator re-attaches instead of admitting twice."""

    stream_url: str = Field(description="Updates URL of the conversation.")
    offset: int = Field(ge=0, description="Offset to long-poll from.")
    submission_id: str = Field(description="Submission in flight.")
    turn: int = Field(default=0, ge=0, description="Turn number of the submission.")


class Usage(ApiModel):
    input_tokens: int = Field(default=0, ge=0, description="Input tokens.")
    output_tokens: int = Field(default=0, ge=0, description="Output tokens.")
    cache_read_tokens: int = Field(default=0, ge=0, description="Cache-read tokens.")
    cache_write_tokens: int = Field(default=0, ge=0, description="Cache-write tokens.")
    cost: float = Field(default=0.0, ge=0, description="Cost in USD.")


class SettlementRecord(ApiModel):
    submission_id: str = Field(description="The settled submission.")
    status: SettlementStatus = Field(description="completed, ended, failed or aborted.")
    error: str | None = Field(default=None, description="Error type and message, if any.")
    turn: int = Field(default=0, ge=0, description="Turn number.")


class ChildrenSummary(ApiModel):
    total: int = Field(default=0, ge=0)
    running: int = Field(default=0, ge=0)
    succeeded: int = Field(default=0, ge=0)
    failed: int = Field(default=0, ge=0)


class SessionStatus(ApiModel):
    phase: SessionPhase = Field(default="Pending", description="Lifecycle phase.")
    pod_name: str | None = Field(default=None, description="The sandbox pod.")
    turns: int = Field(default=0, ge=0, description="Turns settled so far.")
    ledger: AdmissionLedger | None = Field(default=None, description="Admission in flight.")
    last_settlement: SettlementRecord | None = Field(default=None, description="Last settlement.")
    usage: Usage = Field(default_factory=Usage, description="Usage summed over all turns.")
    children: ChildrenSummary = Field(default_factory=ChildrenSummary, description="Children.")
    evaluation_turns: int = Field(default=0, ge=0, description="Turns the guard has judged.")
    message: str | None = Field(default=None, description="Why the session is in this phase.")
    started_at: str | None = Field(default=None, description="When the first turn was admitted.")
    finished_at: str | None = Field(default=None, description="When the session ended.")
    conditions: list[Condition] = _conditions()
    observed_generation: int | None = Field(default=None, description="Last generation seen.")


class Session(Resource):
    """One agent session: a task, a workspace, and a sandbox pod that runs it."""

    api_version: Literal["corral.dev/v1alpha1"] = "corral.dev/v1alpha1"
    kind: Literal["Session"] = "Session"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: SessionSpec
    status: SessionStatus | None = None

    info = KindInfo(
        kind="Session",
        plural="sessions",
        short_names=("sess", "cs"),
        description="One agent session with its own sandbox pod.",
        columns=(
            PrinterColumn("Agent", ".spec.agentRef"),
            PrinterColumn("Phase", ".status.phase"),
            PrinterColumn("Turns", ".status.turns", "integer"),
            PrinterColumn("Pod", ".status.podName", priority=1),
            PrinterColumn("Cost", ".status.usage.cost", "number", priority=1),
            AGE,
        ),
    )


# ---------------------------------------------------------------------------------------- Goal


class SuccessCheck(ApiModel):
    name: str = Field(min_length=1, max_length=63, description="Check name for Evidence.")
    command: str = Field(min_length=1, description="Evidence command; exit 0 means success.")
    image: str | None = Field(default=None, description="Image to run it in.")


class SessionTemplate(ApiModel):
    spec: SessionSpec = Field(description="Spec of each wave's Session.")


class GoalSpec(ApiModel):
    description: str = Field(min_length=1, max_length=65536, description="The outcome wanted.")
    success: SuccessCheck = Field(description="Evidence check that says the goal is met.")
    session_template: SessionTemplate = Field(description="Template for each wave's session.")
    max_waves: int = Field(default=3, ge=1, le=50, description="Waves before the goal fails.")


class GoalStatus(ApiModel):
    waves: int = Field(default=0, ge=0, description="Waves run.")
    sessions: list[str] = Field(default_factory=list, description="Sessions started.")
    verdict: Literal["Pending", "Met", "Failed"] = Field(default="Pending", description="Verdict.")
    conditions: list[Condition] = _conditions()
    observed_generation: int | None = Field(default=None, description="Last generation seen.")


class Goal(Resource):
    api_version: Literal["corral.dev/v1alpha1"] = "corral.dev/v1alpha1"
    kind: Literal["Goal"] = "Goal"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: GoalSpec
    status: GoalStatus | None = None

    info = KindInfo(
        kind="Goal",
        plural="goals",
        short_names=("gl",),
        description="A durable outcome pursued over waves of sessions.",
        columns=(
            PrinterColumn("Waves", ".status.waves", "integer"),
            PrinterColumn("Verdict", ".status.verdict"),
            AGE,
        ),
    )


# ------------------------------------------------------------------------------------ Evidence


class EvidenceSpec(ApiModel):
    repo: str = Field(min_length=1, max_length=2048, description="Repository the check ran on.")
    revision: str = Field(
        description="Full commit SHA the verdict is bound to.",
        json_schema_extra=field_rules(cel(SHA_RULE, SHA_MESSAGE)),
    )
    check: str = Field(
        min_length=1, max_length=63, pattern=DNS_LABEL, description="Check name, e.g. unit-tests."
    )
    command: str = Field(min_length=1, max_length=65536, description="Command run at the revision.")
    image: str | None = Field(default=None, description="Image the check runs in.")
    definition_digest: str | None = Field(
        default=None,
        description="sha256 of the check's definition (command and image); a verdict counts"
        " only for the definition it ran.",
        json_schema_extra=field_rules(
            cel(
                "self.matches('^sha256:[0-9a-f]{64}$')",
                "must be 'sha256:' followed by 64 lowercase hex digits",
            )
        ),
    )
    egress: list[EgressRule] = Field(
        default_factory=list, description="Where the check's pod may connect; none by default."
    )

    model_config = with_rules(cel("self == oldSelf", "Evidence spec is immutable"))


class EvidenceStatus(ApiModel):
    verdict: Literal["Pending", "Pass", "Fail", "Error"] = Field(
        default="Pending", description="Pass, Fail or Error."
    )
    exit_code: int | None = Field(default=None, description="The command's exit code.")
    started: str | None = Field(default=None, description="When the check started.")
    finished: str | None = Field(default=None, description="When the check finished.")
    log_tail: str | None = Field(default=None, max_length=16384, description="End of the log.")
    pod_name: str | None = Field(default=None, description="The pod that ran the check.")
    conditions: list[Condition] = _conditions()
    observed_generation: int | None = Field(default=None, description="Last generation seen.")


class Evidence(Resource):
    api_version: Literal["corral.dev/v1alpha1"] = "corral.dev/v1alpha1"
    kind: Literal["Evidence"] = "Evidence"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: EvidenceSpec
    status: EvidenceStatus | None = None

    info = KindInfo(
        kind="Evidence",
        plural="evidences",
        short_names=("ev",),
        description="A check's verdict bound to a git revision; CI gates read it.",
        columns=(
            PrinterColumn("Revision", ".spec.revision"),
            PrinterColumn("Check", ".spec.check"),
            PrinterColumn("Verdict", ".status.verdict"),
            AGE,
        ),
    )


# ------------------------------------------------------------------------------------ Approval


class ApprovalAction(ApiModel):
    tool: str = Field(min_length=1, max_length=256, description="Tool name the model called.")
    arguments: str = Field(
        default="{}", max_length=262144, description="The call's arguments as canonical JSON."
    )
    digest: str = Field(
        description="sha256 of tool name and canonical arguments; the decision binds to it.",
        json_schema_extra=field_rules(
            cel(
                "self.matches('^sha256:[0-9a-f]{64}$')",
                "must be 'sha256:' followed by 64 lowercase hex digits",
            )
        ),
    )


class ApprovalSpec(ApiModel):
    session_ref: ObjectRef = Field(description="The session asking; name and uid must match.")
    action: ApprovalAction = Field(description="The exact call awaiting a decision.")
    reason: str = Field(default="", max_length=4096, description="Why the harness asked.")

    model_config = with_rules(
        cel("self == oldSelf", "Approval spec is immutable"),
        cel(
            "has(self.sessionRef.uid)",
            "sessionRef.uid is required so a decision binds to one session",
            field_path=".sessionRef.uid",
        ),
    )


class ApprovalStatus(ApiModel):
    decision: Literal["Pending", "Approved", "Denied"] = Field(
        default="Pending", description="Pending, Approved or Denied."
    )
    decided_by: str | None = Field(default=None, description="Who decided.")
    decided_at: str | None = Field(default=None, description="When.")
    comment: str | None = Field(default=None, max_length=4096, description="Why.")
    conditions: list[Condition] = _conditions()

    model_config = with_rules(
        cel(
            "!has(oldSelf.decision) || oldSelf.decision == 'Pending'"
            " || self.decision == oldSelf.decision",
            "a decision is final",
            field_path=".decision",
        )
    )


class Approval(Resource):
    api_version: Literal["corral.dev/v1alpha1"] = "corral.dev/v1alpha1"
    kind: Literal["Approval"] = "Approval"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: ApprovalSpec
    status: ApprovalStatus | None = None

    info = KindInfo(
        kind="Approval",
        plural="approvals",
        short_names=("apr",),
        description="A request for a human decision on one tool call.",
        columns=(
            PrinterColumn("Session", ".spec.sessionRef.name"),
            PrinterColumn("Action", ".spec.action.tool"),
            PrinterColumn("Decision", ".status.decision"),
            AGE,
        ),
    )


KINDS: tuple[type[Resource], ...] = (Agent, Session, Goal, Evidence, Approval)
KIND_BY_NAME: dict[str, type[Resource]] = {k.info.kind: k for k in KINDS}
