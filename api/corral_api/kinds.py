"""The `corral.dev/v1alpha1` kinds: Agent, Session, Goal, Evidence, Approval, Freeze.

These pydantic models are the single source of truth: `make crds` derives the CRD schemas from
them, `corral run` validates local YAML with them, and the harness reads an Agent spec with them.
Constraints that span fields are CEL rules, so the API server enforces them too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, WithJsonSchema, field_validator, model_validator

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
from .hook_spec import AgentHooks
from .output_schema import MAX_OUTPUT_SCHEMA_BYTES, schema_problem
from .turnshape import (
    PLAN_LOOP_MESSAGE,
    ForcedPlan,
    LoopKind,
    PlanStatus,
    SchedulerSpec,
    loop_rule,
)

ThinkingLevel = Literal["low", "medium", "high"]
SessionPhase = Literal[
    "Pending",
    "Running",
    "WaitingForHuman",
    "WaitingForChildren",
    "WaitingForWake",
    "Suspended",
    "Succeeded",
    "Failed",
    "Stopped",
]
# The phases a Session never leaves.
FINAL_PHASES: frozenset[str] = frozenset({"Succeeded", "Failed", "Stopped"})
SettlementStatus = Literal["completed", "ended", "failed", "aborted"]
# How a suspended Session's turn in flight ends: it finishes first, or is aborted at once.
SuspendMode = Literal["afterTurn", "now"]
# What a drain may do to a Session's sandbox pod (docs/operations.md, "Drains").
DisruptionPolicy = Literal["allow", "whenIdle", "never"]
DEFAULT_DISRUPTION_WAIT_SECONDS = 900
DEFAULT_WIP_INTERVAL_SECONDS = 120

# Caps the model can never raise; an Agent may only lower them.
MAX_DEPTH_CAP = 3
MAX_CHILDREN_PER_TURN_CAP = 5
MAX_OUTPUT_TOKENS_CAP = 32000
MAX_TURNS_CAP = 1000
MAX_RESTARTS_CAP = 10
DEFAULT_MAX_RESTARTS = 3
# The runaway watch's per-turn caps (docs/ledger.md): the defaults, and the most an Agent may set.
DEFAULT_STEPS_PER_TURN = 200
MAX_STEPS_PER_TURN_CAP = 5000
DEFAULT_TOKENS_PER_TURN = 5_000_000
MAX_TOKENS_PER_TURN_CAP = 100_000_000
# How much of a turn's final answer a Session's status keeps (status.answer).
MAX_REPLIES = 100
ANSWER_LIMIT = 4000

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
# A branch-name pattern (Agent.spec.workspace.branches, Agent.spec.landing.targets): a short
# branch name where `*` matches a run without '/' and `**` a run that may contain '/'. The
# matcher is corral_common.branches; this is the syntax, which the API server checks too.
BRANCH_PATTERN_RULE = (
    "self.matches('^[A-Za-z0-9._/*-]+$') && !self.startsWith('/') && !self.endsWith('/')"
    " && !self.endsWith('.lock') && !self.contains('..') && !self.contains('//')"
    " && !self.startsWith('-') && !self.contains('***') && !self.startsWith('refs/')"
    " && self != 'HEAD'"
)
BRANCH_PATTERN_MESSAGE = (
    "must be a branch-name pattern: a short branch name (no refs/heads/, not HEAD) of letters,"
    " digits, '.', '_', '-', '/', where '*' matches a run without '/' and '**' a run that may"
    " contain '/'; no '..', '//' or '***', not starting with '/' or '-', not ending with '/'"
    " or '.lock'"
)
# What an Agent that names no spec.workspace.branches allows: the operator's default session
# branch `corral/<session>` and anything below `corral/`.
DEFAULT_SESSION_BRANCHES = ("corral/**",)
MAX_BRANCH_PATTERNS = 64
BranchPattern = Annotated[
    str,
    Field(
        min_length=1,
        max_length=255,
        json_schema_extra=field_rules(cel(BRANCH_PATTERN_RULE, BRANCH_PATTERN_MESSAGE)),
    ),
]


# A Session may replace its Agent's landing check, never where land may reach.
LANDING_TARGETS_RULE = "!has(self.landing) || !has(self.landing.targets)"
LANDING_TARGETS_MESSAGE = (
    "landing targets are set on the Agent only (Agent spec.landing.targets): a Session may "
    "replace its Agent's landing check, but never where land may reach"
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
    max_steps_per_turn: int = Field(
        default=DEFAULT_STEPS_PER_TURN,
        ge=1,
        le=MAX_STEPS_PER_TURN_CAP,
        description="The runaway watch: tool calls one turn may start; the next fails the turn "
        "`runaway` (docs/ledger.md).",
    )
    max_tokens_per_turn: int = Field(
        default=DEFAULT_TOKENS_PER_TURN,
        ge=1,
        le=MAX_TOKENS_PER_TURN_CAP,
        description="The runaway watch: tokens (input, output and cache writes, every model "
        "call) one turn may spend before it fails `runaway`.",
    )
    budget: Budget | None = Field(
        default=None,
        description="The cap for each Session of this Agent; a Session may only lower it.",
    )
    max_restarts: int = Field(
        default=DEFAULT_MAX_RESTARTS,
        ge=0,
        le=MAX_RESTARTS_CAP,
        description="How many times a Session whose sandbox pod is lost (deleted, evicted, its "
        "node gone) resumes in a new pod from its archived conversation and its delivered "
        "branch before it fails SandboxLost; 0 never resumes (docs/turns.md, \"A lost pod\").",
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


# A host rule's name: a DNS name (letters, digits, hyphens; IDNs in punycode) or an IPv4
# literal, optionally `*.` + a suffix; one trailing dot and upper case are allowed (the gateway
# compares names lower-cased, without the dot, in punycode).
EGRESS_HOST = (
    r"^(\*\.)?([A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?\.)*"
    r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?\.?$"
)
EgressMethod = Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class EgressRule(ApiModel):
    """One destination the sandbox may reach through the egress gateway (docs/egress.md):
    a host by name (exact, or `*.` + suffix) or a CIDR, on some ports, for some methods."""

    host: str | None = Field(
        default=None,
        max_length=253,
        pattern=EGRESS_HOST,
        description="Host name, exact (pypi.org) or a wildcard under a suffix (*.pypi.org: "
        "a.pypi.org, not pypi.org). Exactly one of host and cidr.",
    )
    cidr: str | None = Field(
        default=None,
        max_length=64,
        description="Destination CIDR, e.g. 203.0.113.0/24. Exactly one of host and cidr.",
    )
    ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(
        default_factory=list,
        max_length=64,
        description="TCP ports; empty means 443 for a host rule and every port for a cidr.",
    )
    methods: list[EgressMethod] = Field(
        default_factory=list,
        max_length=7,
        description="HTTP methods of plain (http://) requests; needs host. Empty: any method "
        "and TLS (CONNECT), whose method the gateway cannot see.",
    )

    model_config = with_rules(
        cel("has(self.host) != has(self.cidr)", "exactly one of host and cidr must be set"),
        cel(
            "!has(self.methods) || size(self.methods) == 0 || has(self.host)",
            "methods needs host: a cidr rule cannot name HTTP methods",
        ),
    )

    @model_validator(mode="after")
    def _one_destination(self) -> EgressRule:
        # The API server's CEL rules above, for a spec read from a file (corral run).
        if (self.host is None) == (self.cidr is None):
            raise ValueError("exactly one of host and cidr must be set")
        if self.methods and self.host is None:
            raise ValueError("methods needs host: a cidr rule cannot name HTTP methods")
        return self


class WarmPool(ApiModel):
    """Sandbox pods started ahead of demand for this Agent (docs/warm-pool.md)."""

    size: int = Field(
        ge=0,
        le=50,
        description="Pods kept started and ready for this Agent's Sessions; 0 keeps none. A "
        "Session adopts one (its identity is bound late) and never shares it.",
    )


class Disruption(ApiModel):
    """What a voluntary disruption (a drain, an eviction) may do to this Agent's sandbox pods:
    the operator holds a PodDisruptionBudget (minAvailable 1) for the pod while it must not go
    (docs/operations.md, "Drains")."""

    policy: DisruptionPolicy = Field(
        default="whenIdle",
        description="allow: never held; whenIdle: held while a turn is in flight, for at most "
        "maxWaitSeconds of each turn; never: held for the pod's whole life.",
    )
    max_wait_seconds: int = Field(
        default=DEFAULT_DISRUPTION_WAIT_SECONDS,
        ge=0,
        le=86_400,
        description="whenIdle: how long a turn in flight may hold off a drain before the "
        "budget is lifted and the pod may be evicted (the Session then resumes elsewhere).",
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
    warm_pool: WarmPool | None = Field(
        default=None, description="Pods kept ready ahead of demand; absent: every pod is cold."
    )
    # Optional, not defaulted in the schema: an Agent made before the field reads unchanged.
    disruption: Disruption | None = Field(
        default=None,
        description="Whether a drain waits for the turn in flight (absent: whenIdle, 900 s).",
    )

    def disruption_policy(self) -> Disruption:
        return self.disruption or Disruption()


class SecretKeyRef(ApiModel):
    name: str = Field(description="Secret name in the Agent's namespace.", pattern=DNS_LABEL)
    key: str = Field(description="Key within the Secret.", min_length=1)


class SecretRef(ApiModel):
    name: str = Field(description="Secret name in the Agent's namespace.", pattern=DNS_LABEL)


class Credentials(ApiModel):
    """Secrets only the custodian container ever mounts."""

    model_secret_ref: SecretKeyRef | None = Field(
        default=None, description="The model API key (anthropic and gateway providers)."
    )
    aws_secret_ref: SecretRef | None = Field(
        default=None,
        description="A bedrock provider's AWS key: a Secret with aws_access_key_id, "
        "aws_secret_access_key and optionally aws_session_token (docs/providers.md).",
    )
    gcp_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="A vertex provider's Google service-account key (JSON) (docs/providers.md).",
    )
    git_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Git credentials for clone and push."
    )
    hook_secret_ref: SecretRef | None = Field(
        default=None,
        description="Secret whose keys http hooks name in headers[].secretKey (custodian only).",
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
    targets: list[BranchPattern] | None = Field(
        default=None,
        max_length=MAX_BRANCH_PATTERNS,
        description="Agent only: the branches `land` may reach, as patterns of short branch "
        "names ('*' a run without '/', '**' a run that may contain '/'); none listed: land is "
        "refused. A Session cannot set them.",
    )


class AgentWorkspace(ApiModel):
    """Where this Agent's Sessions may push (docs/delivery.md)."""

    branches: list[BranchPattern] = Field(
        default_factory=lambda: list(DEFAULT_SESSION_BRANCHES),
        min_length=1,
        max_length=MAX_BRANCH_PATTERNS,
        description="The patterns a Session's branch (spec.workspace.branch, default "
        "corral/<session>) must match, against the short branch name: '*' matches a run "
        "without '/', '**' a run that may contain '/'. Default: [corral/**]. Every other "
        "branch is reached only by land.",
    )
    wip_interval_seconds: int | None = Field(
        default=None,
        ge=0,
        le=86_400,
        description="While a turn is in flight, how often the work in progress (the worktree "
        "beyond the delivered revision) is saved to the archive, never to the remote, so a pod "
        "lost mid-turn resumes with it (docs/turns.md, \"A lost pod\"); 0 saves none; absent: "
        f"{DEFAULT_WIP_INTERVAL_SECONDS}.",
    )

    def wip_interval(self) -> int:
        if self.wip_interval_seconds is None:
            return DEFAULT_WIP_INTERVAL_SECONDS
        return self.wip_interval_seconds


class AgentMemory(ApiModel):
    """Long-term memory that outlives the pod, kept by the custodian (docs/memory.md)."""

    enabled: bool = Field(
        default=True, description="Recall facts before each model call; offer the memory tools."
    )
    scope: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=r"^[^\x00-\x1f]+$",
        description="Which memory this Agent shares (default: the Agent's name). Never "
        "interpreted; the custodian confines it to the Session's namespace.",
    )
    extract_after_turn: bool = Field(
        default=False,
        description="After an accepted turn, store the answer's `Remember: <subject>: <fact>` "
        "lines as facts.",
    )


class AgentSpec(ApiModel):
    """A reusable agent definition; re-read by every submission."""

    identity: str = Field(min_length=1, max_length=65536, description="The system prompt.")
    instructions: str = Field(
        default="", max_length=65536, description="Instructions above every AGENTS.md."
    )
    model: str = Field(min_length=1, max_length=128, description="Model name from the catalog.")
    provider: str | None = Field(
        default=None,
        max_length=63,
        pattern=DNS_LABEL,
        description="Which of the platform's modelProviders the custodian sends model requests "
        "to (docs/providers.md); unset: the platform's default.",
    )
    thinking_level: ThinkingLevel = Field(default="medium", description="low, medium or high.")
    tools: ToolPolicy = Field(default_factory=ToolPolicy, description="Tool allow/deny policy.")
    loop: LoopKind = Field(
        default="auto",
        description="auto (the scheduler's classifier picks a route each turn), or a fixed "
        "route: direct, oneTool, checklist, reactive, investigate (docs/turns.md).",
    )
    scheduler: SchedulerSpec = Field(
        default_factory=SchedulerSpec, description="The classifier behind loop: auto."
    )
    limits: AgentLimits = Field(default_factory=AgentLimits, description="Structural limits.")
    budgets: LayerBudgets = Field(
        default_factory=LayerBudgets, description="Token budget per context layer."
    )
    orchestrator: bool = Field(default=False, description="Only orchestrators may start children.")
    workspace: AgentWorkspace = Field(
        default_factory=AgentWorkspace,
        description="The branches this Agent's Sessions may push to.",
    )
    sandbox: Sandbox = Field(default_factory=Sandbox, description="Sandbox pod settings.")
    credentials: Credentials = Field(
        default_factory=Credentials, description="Secrets for the custodian."
    )
    children: ChildPolicy = Field(
        default_factory=ChildPolicy, description="Agents a child session may run under."
    )
    landing: Landing = Field(
        default_factory=Landing, description="Where land may reach, and the check before it."
    )
    hooks: AgentHooks = Field(
        default_factory=AgentHooks,
        description="Hooks per phase: command or http handlers (docs/hooks.md).",
    )
    memory: AgentMemory | None = Field(
        default=None, description="Long-term memory across sessions; absent: none."
    )

    @field_validator("loop")
    @classmethod
    def _loop_is_not_plan(cls, value: str) -> str:
        if value == "plan":
            raise ValueError(PLAN_LOOP_MESSAGE)
        return value

    model_config = with_rules(
        loop_rule(),  # type: ignore[arg-type]
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
        cel(
            "!has(self.sandbox) || !has(self.sandbox.warmPool) || self.sandbox.warmPool.size == 0"
            " || !has(self.credentials) || !has(self.credentials.gitSecretRef)",
            "sandbox.warmPool cannot be used with credentials.gitSecretRef: a pooled pod checks "
            "out the repository without git credentials",
            field_path=".sandbox.warmPool",
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
        description="The one branch this session may push to (default corral/<session>); it "
        "must match its Agent's spec.workspace.branches and differ from the branch `ref` names.",
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
    loop: LoopKind | None = Field(
        default=None,
        description="The loop for this session over the Agent's; a child session gets its "
        "parent's loop and thinking level here (a forced plan is not inherited).",
    )

    @field_validator("loop")
    @classmethod
    def _loop_is_not_plan(cls, value: str | None) -> str | None:
        if value == "plan":
            raise ValueError(PLAN_LOOP_MESSAGE)
        return value

    model_config = with_rules(loop_rule())  # type: ignore[arg-type]


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
    message: str = Field(
        default="Wake up: continue the task.",
        min_length=1,
        max_length=262144,
        description="Admitted as the next turn when the wake fires (docs/wake.md).",
    )


# Free-form JSON in the CRD: the schema body and the answer are the user's, not Corral's. The
# API server checks that a schema is an object and bounds its top level; the Session model (and
# so the operator and `corral run`) checks it against the JSON Schema meta-schema and its size.
OutputSchema = Annotated[
    dict[str, Any],
    WithJsonSchema(
        {"type": "object", "maxProperties": 64, "x-kubernetes-preserve-unknown-fields": True}
    ),
]
StructuredOutput = Annotated[Any, WithJsonSchema({"x-kubernetes-preserve-unknown-fields": True})]


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
    # The two suspend fields are optional, not defaulted in the schema: a Session made before
    # them reads unchanged (docs/operations.md, "Upgrade").
    suspend: bool | None = Field(
        default=None,
        description="Park the Session: its turn in flight ends (suspendMode), its conversation "
        "is archived and its pod deleted (phase Suspended); false again resumes it in a new pod "
        "at the same point (docs/turns.md, \"Suspend and resume\").",
    )
    suspend_mode: SuspendMode | None = Field(
        default=None,
        description="afterTurn (absent: the default): the turn in flight finishes first; now: "
        "it is aborted and continues after the resume.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, le=31_536_000, description="Delete the Session this long after it ends."
    )
    wake: Wake | None = Field(default=None, description="One-shot wake.")
    budget: Budget | None = Field(
        default=None, description="Lowers the Agent's budget for this session (never raises it)."
    )
    landing: Landing | None = Field(
        default=None,
        description="Replaces the Agent's landing check for this session; the targets are "
        "the Agent's alone.",
    )
    output_schema: OutputSchema | None = Field(
        default=None,
        description="A JSON Schema (an object) the final answer must satisfy; the validated "
        f"answer lands in status.output (docs/structured-output.md). At most "
        f"{MAX_OUTPUT_SCHEMA_BYTES} bytes as JSON.",
    )
    plan: ForcedPlan | None = Field(
        default=None,
        description="A forced plan: a checklist every turn follows, each step with a machine "
        "check; with gate, a person approves it first (docs/turns.md).",
    )
    decide_then_act: bool = Field(
        default=False,
        description="The turn must decide its route before acting: without a working classifier"
        " it stops (classifier_unavailable) instead of falling back to the reactive loop.",
    )
    replies: list[Annotated[str, Field(min_length=1, max_length=16384)]] = Field(
        default_factory=list,
        max_length=MAX_REPLIES,
        description="A person's answers to the questions turns asked, in order; append with "
        "`corral reply SESSION TEXT` (docs/turns.md).",
        json_schema_extra=field_rules(
            cel("size(self) >= size(oldSelf)", "replies can only be appended")
        ),
    )

    @field_validator("output_schema")
    @classmethod
    def _output_schema_is_a_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        problem = None if value is None else schema_problem(value)
        if problem is not None:
            raise ValueError(f"outputSchema {problem}")
        return value

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
        cel(
            LANDING_TARGETS_RULE,
            LANDING_TARGETS_MESSAGE,
            field_path=".landing.targets",
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


TurnOutcome = Literal["success", "partial", "abstain", "handed_to_human"]


class LastTurn(ApiModel):
    """The last settled turn's ledger, summarised (the full receipt is the harness's turn
    record; docs/ledger.md)."""

    turn: int = Field(default=0, ge=0, description="Turn number.")
    route: str = Field(description="The route the turn took (reactive, direct, ...).")
    handler: str = Field(description="The handler that actually ran.")
    requested_loop: str | None = Field(default=None, description="The loop that was requested.")
    outcome: TurnOutcome = Field(description="success, partial, abstain or handed_to_human.")
    tools_run: int = Field(default=0, ge=0, description="Tool calls that ran.")
    tools_blocked: int = Field(default=0, ge=0, description="Tool calls that were blocked.")
    tokens: int = Field(default=0, ge=0, description="Tokens over every layer.")
    phase_path: list[str] = Field(
        default_factory=list, max_length=64, description="The phases the turn passed."
    )
    error_type: str | None = Field(default=None, description="Why it failed (e.g. runaway).")


class ChildrenSummary(ApiModel):
    total: int = Field(default=0, ge=0)
    running: int = Field(default=0, ge=0)
    succeeded: int = Field(default=0, ge=0)
    failed: int = Field(default=0, ge=0)


EGRESS_STATUS_HOSTS = 20  # hosts listed in status.egress; the rest are counted


class EgressHost(ApiModel):
    """One destination as the egress gateway decided it for one identity (docs/egress.md)."""

    host: str = Field(description="The name (or address) the connection asked for.")
    port: int = Field(ge=0, le=65535)
    identity: Literal["agent", "custodian"] = Field(
        description="agent: the tools container, no proxy credential; custodian: with it."
    )
    decision: Literal["allowed", "denied"]
    reason: str | None = Field(default=None, description="Why it was denied.")
    count: int = Field(default=0, ge=0, description="Connections and requests so decided.")
    bytes_up: int = Field(default=0, ge=0, description="Bytes sent to the destination.")
    bytes_down: int = Field(default=0, ge=0, description="Bytes received from it.")
    first_seen: str | None = Field(default=None, description="First decision (RFC 3339).")
    last_seen: str | None = Field(default=None, description="Last decision (RFC 3339).")


class EgressSummary(ApiModel):
    """What the sandbox's egress gateway allowed and denied, as the Session's loop last read
    it from every gateway replica."""

    allowed: int = Field(default=0, ge=0, description="Connections and requests allowed.")
    denied: int = Field(default=0, ge=0, description="Connections and requests denied.")
    hosts: list[EgressHost] = Field(
        default_factory=list,
        max_length=EGRESS_STATUS_HOSTS,
        description=f"At most {EGRESS_STATUS_HOSTS} destinations, denied first, then by count.",
    )
    more_hosts: int = Field(default=0, ge=0, description="Destinations not listed in hosts.")
    observed_at: str | None = Field(default=None, description="When the gateway was read.")


DeliveryState = Literal["Delivered", "NothingToDeliver", "Failed"]
WaitMode = Literal["all", "first", "quorum", "supervise"]


class Delivery(ApiModel):
    """What the custodian pushed of the session's work (docs/delivery.md)."""

    branch: str | None = Field(default=None, description="The session's own branch.")
    revision: str | None = Field(
        default=None,
        description="The last revision pushed to the branch (full SHA); kept when a later "
        "delivery failed or had nothing new.",
        json_schema_extra=field_rules(cel(SHA_RULE, SHA_MESSAGE)),
    )
    pushed_at: str | None = Field(default=None, description="When that revision was pushed.")
    state: DeliveryState = Field(description="How the last turn's delivery went.")
    message: str | None = Field(default=None, description="What happened, in a line.")


class WaitingFor(ApiModel):
    """The children a parent waits for, and how (docs/children.md)."""

    mode: WaitMode = Field(default="all", description="all, first, quorum or supervise.")
    quorum: int | None = Field(default=None, ge=1, description="For quorum: how many.")
    children: list[str] = Field(
        default_factory=list, description="The children waited for; empty: every child."
    )


class SessionStatus(ApiModel):
    phase: SessionPhase = Field(default="Pending", description="Lifecycle phase.")
    pod_name: str | None = Field(default=None, description="The sandbox pod.")
    turns: int = Field(default=0, ge=0, description="Turns settled so far.")
    ledger: AdmissionLedger | None = Field(default=None, description="Admission in flight.")
    last_settlement: SettlementRecord | None = Field(default=None, description="Last settlement.")
    last_turn: LastTurn | None = Field(
        default=None, description="The last settled turn's ledger: route, outcome, tools."
    )
    question: str | None = Field(
        default=None,
        max_length=ANSWER_LIMIT,
        description="While WaitingForHuman on a question: what the turn asked; answer with "
        "`corral reply` (spec.replies).",
    )
    replies_read: int = Field(
        default=0, ge=0, description="How many of spec.replies turns have started from."
    )
    plan: PlanStatus | None = Field(
        default=None, description="The plan and each step's verdict (docs/turns.md)."
    )
    usage: Usage = Field(default_factory=Usage, description="Usage summed over all turns.")
    children: ChildrenSummary = Field(default_factory=ChildrenSummary, description="Children.")
    delivery: Delivery | None = Field(
        default=None, description="The session's work as pushed to its branch."
    )
    waiting_for: WaitingFor | None = Field(
        default=None, description="While WaitingForChildren: which children, by which mode."
    )
    reported_children: list[str] = Field(
        default_factory=list,
        description="Children whose end was already reported into the conversation.",
    )
    evaluation_turns: int = Field(default=0, ge=0, description="Turns the guard has judged.")
    output: StructuredOutput = Field(
        default=None,
        description="The last accepted answer, validated against spec.outputSchema (JSON).",
    )
    freeze_interruptions: int = Field(
        default=0,
        ge=0,
        description="Turns a freeze interrupted; each continues under the same turn number, so"
        " none counts against a turn limit or the evaluation budget.",
    )
    restarts: int = Field(
        default=0,
        ge=0,
        description="How many times the Session resumed in a new sandbox pod after its pod was "
        "lost (the Resumed condition says why the last time).",
    )
    suspensions: int = Field(
        default=0,
        ge=0,
        description="How many times the Session was suspended (spec.suspend); each resume "
        "restores its conversation in a new pod.",
    )
    suspended_from: SessionPhase | None = Field(
        default=None,
        description="While Suspended: the phase the Session resumes in.",
    )
    resume_interruptions: int = Field(
        default=0,
        ge=0,
        description="Turns a lost pod interrupted; each is admitted again once under the same "
        "turn number (turn-<n>-resume-<k>), so none counts against a turn limit.",
    )
    message: str | None = Field(default=None, description="Why the session is in this phase.")
    answer: str | None = Field(
        default=None,
        max_length=ANSWER_LIMIT,
        description="The last settled turn's final answer (its end, at most "
        f"{ANSWER_LIMIT} characters); a Goal's next wave reads it (docs/goals.md).",
    )
    wake_at: str | None = Field(
        default=None,
        description="When the one-shot wake fires (RFC 3339); set while WaitingForWake and "
        "kept after it fired (docs/wake.md).",
    )
    woken_at: str | None = Field(
        default=None, description="When the one-shot wake fired; it fires once per Session."
    )
    started_at: str | None = Field(default=None, description="When the first turn was admitted.")
    finished_at: str | None = Field(default=None, description="When the session ended.")
    egress: EgressSummary | None = Field(
        default=None,
        description="The egress gateway's decisions for this Session's pod (docs/egress.md).",
    )
    conditions: list[Condition] = _conditions()
    observed_generation: int | None = Field(default=None, description="Last generation seen.")

    @property
    def restores_conversation(self) -> bool:
        """A new pod of this Session starts from its archived conversation and its delivered
        revision: it lost a pod, or it was suspended."""
        return self.restarts > 0 or self.suspensions > 0


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
            PrinterColumn("Restarts", ".status.restarts", "integer"),
            PrinterColumn("Outcome", ".status.lastTurn.outcome"),
            PrinterColumn("Pod", ".status.podName", priority=1),
            PrinterColumn("Cost", ".status.usage.cost", "number", priority=1),
            PrinterColumn("Revision", ".status.delivery.revision", priority=1),
            PrinterColumn("Frozen", '.status.conditions[?(@.type=="Frozen")].status'),
            PrinterColumn("Wakes", ".status.wakeAt"),
            AGE,
        ),
    )


# ---------------------------------------------------------------------------------------- Goal


class SuccessCheck(ApiModel):
    name: str = Field(
        min_length=1, max_length=63, pattern=DNS_LABEL, description="Check name for Evidence."
    )
    command: str = Field(
        min_length=1, max_length=65536, description="Evidence command; exit 0 means success."
    )
    image: str | None = Field(default=None, max_length=1024, description="Image to run it in.")


class SessionTemplate(ApiModel):
    spec: SessionSpec = Field(description="Spec of each wave's Session.")


class GoalSpec(ApiModel):
    description: str = Field(min_length=1, max_length=65536, description="The outcome wanted.")
    success: SuccessCheck = Field(description="Evidence check that says the goal is met.")
    session_template: SessionTemplate = Field(description="Template for each wave's session.")
    max_waves: int = Field(default=3, ge=1, le=50, description="Waves before the goal fails.")


WaveVerdict = Literal["Pending", "Pass", "Fail", "Error", "NoRevision"]


class GoalWave(ApiModel):
    """One wave of a Goal: its Session, the revision it pushed, and the check's verdict there."""

    wave: int = Field(ge=1, description="Wave number, from 1.")
    session: str = Field(description="The wave's Session.")
    phase: str | None = Field(default=None, description="The Session's phase when last seen.")
    revision: str | None = Field(default=None, description="The revision the wave pushed.")
    evidence: str | None = Field(default=None, description="The Evidence of the success check.")
    verdict: WaveVerdict = Field(
        default="Pending",
        description="Pass, Fail or Error (the Evidence's), NoRevision (nothing was pushed to"
        " check), or Pending.",
    )
    message: str | None = Field(default=None, description="What the wave came to, in a line.")


class GoalStatus(ApiModel):
    waves: int = Field(default=0, ge=0, description="Waves run.")
    sessions: list[str] = Field(default_factory=list, description="Sessions started.")
    verdict: Literal["Pending", "Met", "Failed"] = Field(default="Pending", description="Verdict.")
    history: list[GoalWave] = Field(
        default_factory=list, description="Every wave so far, oldest first (docs/goals.md)."
    )
    session: str | None = Field(default=None, description="The current (or last) wave's Session.")
    revision: str | None = Field(default=None, description="The last revision checked.")
    message: str | None = Field(default=None, description="Why the Goal is where it is.")
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
            PrinterColumn("Max", ".spec.maxWaves", "integer"),
            PrinterColumn("Verdict", ".status.verdict"),
            PrinterColumn("Session", ".status.session"),
            PrinterColumn("Revision", ".status.revision", priority=1),
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


# -------------------------------------------------------------------------------------- Freeze


class FreezeScope(ApiModel):
    """What a Freeze holds, in its own namespace: exactly one scope. A freeze flows down the
    session tree: the Sessions below a held Session are held too."""

    session: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="This Session and every Session below it (its tree).",
    )
    agent: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS_LABEL,
        description="Every Session of this Agent, and the Sessions below them.",
    )
    namespace: bool | None = Field(
        default=None, description="true: every Session in the Freeze's namespace."
    )

    model_config = with_rules(
        cel(
            "[has(self.session), has(self.agent), has(self.namespace) && self.namespace]"
            ".exists_one(x, x)",
            "set exactly one scope: session, agent, or namespace: true",
        )
    )


class FreezeSpec(ApiModel):
    """A person's switch that holds work: while it is in force the operator aborts the turns
    in flight (cause `freeze`) and admits nothing, and the custodian refuses model calls,
    pushes and spawns. Deleting the Freeze, or `frozen: false`, lifts it."""

    scope: FreezeScope = Field(
        description="The one scope it holds; immutable (make another Freeze for another)."
    )
    frozen: bool = Field(default=True, description="false lifts the freeze without deleting it.")
    reason: str = Field(
        default="", max_length=1024, description="Why; shown on every Session it holds."
    )

    model_config = with_rules(
        cel("self.scope == oldSelf.scope", "scope is immutable", field_path=".scope")
    )


class FreezeStatus(ApiModel):
    conditions: list[Condition] = _conditions()
    observed_generation: int | None = Field(default=None, description="Last generation seen.")


class Freeze(Resource):
    """A person's switch that freezes a session tree, an Agent's sessions or a namespace."""

    api_version: Literal["corral.dev/v1alpha1"] = "corral.dev/v1alpha1"
    kind: Literal["Freeze"] = "Freeze"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: FreezeSpec
    status: FreezeStatus | None = None

    info = KindInfo(
        kind="Freeze",
        plural="freezes",
        short_names=("frz",),
        description="Holds a session tree, an Agent's sessions or a namespace: turns in flight"
        " are aborted, nothing new is admitted, model calls, pushes and spawns are refused.",
        columns=(
            PrinterColumn("Session", ".spec.scope.session"),
            PrinterColumn("Agent", ".spec.scope.agent"),
            PrinterColumn("Namespace", ".spec.scope.namespace", "boolean"),
            PrinterColumn("Frozen", ".spec.frozen", "boolean"),
            PrinterColumn("Reason", ".spec.reason", priority=1),
            AGE,
        ),
    )


KINDS: tuple[type[Resource], ...] = (Agent, Session, Goal, Evidence, Approval, Freeze)
KIND_BY_NAME: dict[str, type[Resource]] = {k.info.kind: k for k in KINDS}
