"""`corral-operator`: the kopf operator for Corral's kinds, with a liveness probe; alone, or one
of several replicas of which the one holding a Lease leads (`--leader-elect-lease`, ADR 0103)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import ipaddress
import logging
import os
import re
import secrets
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import kopf

from corral_api.kinds import EGRESS_HOST
from corral_api.providers import ModelProvider, ProviderError, load_providers
from corral_common import logs

from . import handlers
from .archive.configure import archive_store
from .archive.server import RunningReader, start_archive_reader
from .egressrecords import poll_forever
from .kopfext import collector
from .kopfext.diffbase import (
    LeanAnnotationsDiffBaseStorage,
    LeanAnnotationsProgressStorage,
    essence_needed,
)
from .kube import Kube, object_path
from .leadership import LeaseElector, LeaseTerms, parse_lease
from .metrics import parse_address
from .runtime import Runtime
from .session.wiretoken import read_wire_token
from .settings import (
    EgressGateway,
    EgressTarget,
    GatewayServiceError,
    OperatorSettings,
    gateway_from_service,
)
from .standby import StandbyServing, stand_by

log = logging.getLogger("corral.operator")

_SETTINGS = OperatorSettings()
_KUBECONFIG: str | None = None
_ARCHIVE_LISTEN: tuple[str, int] | None = None
_METRICS_ADDR = ""
_GATEWAY_SERVICE: tuple[str, str] | None = None
_BINDING_KEY: str | None = None


@dataclasses.dataclass(frozen=True)
class Election:
    """The Lease this replica leads by, and as whom."""

    namespace: str
    name: str
    identity: str
    terms: LeaseTerms


_ELECTION: Election | None = None


def _egress(text: str) -> EgressTarget:
    """CIDR[:PORT[,PORT...]] or HOST[:PORT[,PORT...]] -> EgressTarget (a host is reached
    through the egress gateway only)."""
    where, _, ports = text.partition(":") if text.count(":") <= 1 else (text, "", "")
    try:
        numbers = tuple(int(p) for p in ports.split(",") if p)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad port list in {text!r}") from None
    if "/" in where:
        try:
            ipaddress.ip_network(where, strict=False)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{where!r} is not a CIDR (e.g. 10.0.0.1/32)"
            ) from None
        return EgressTarget(cidr=where, ports=numbers)
    if not re.fullmatch(EGRESS_HOST, where):
        raise argparse.ArgumentTypeError(
            f"{where!r} is neither a CIDR (e.g. 10.0.0.1/32) nor a host name (e.g. api.example.com)"
        )
    return EgressTarget(host=where, ports=numbers)


def _gateway(text: str) -> tuple[str, int]:
    """ADDRESS:PORT of the egress gateway's Service (an address: sandboxes have no DNS)."""
    address, _, port = text.rpartition(":")
    try:
        ipaddress.ip_address(address.strip("[]"))
        return address.strip("[]"), int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not ADDRESS:PORT (the gateway Service's clusterIP and proxy port)"
        ) from None


def _service_ref(text: str) -> tuple[str, str]:
    namespace, sep, name = text.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAMESPACE/NAME")
    return namespace, name


async def gateway_of_service(
    kube: Kube, ref: tuple[str, str], *, attempts: int = 30, pause: float = 2.0
) -> EgressGateway:
    """The gateway as its Service says, read once at start. The chart creates the Service
    with the operator, so a missing one is waited for (a minute) before the start fails."""
    namespace, name = ref
    path = object_path("v1", "Service", namespace, name)
    for attempt in range(attempts):
        service = await kube.get(path)
        if service is not None:
            return gateway_from_service(service)
        if attempt == 0:
            logging.getLogger(__name__).warning(
                "the egress gateway's Service %s/%s is not there yet; waiting", namespace, name
            )
        await asyncio.sleep(pause)
    raise GatewayServiceError(f"the egress gateway's Service {namespace}/{name} does not exist")


def _gateway_settings(args: argparse.Namespace) -> EgressGateway | None:
    if args.egress_gateway is None:
        return None
    address, port = args.egress_gateway
    return EgressGateway(
        address=address,
        port=port,
        namespace=args.egress_gateway_namespace or args.operator_namespace,
        pod_labels=dict(args.egress_gateway_pod_label)
        or {"app.kubernetes.io/name": "corral-egress-gateway"},
        admin_port=args.egress_gateway_admin_port,
        binding_key=args.egress_binding_key_file,
    )


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _at_least_one(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be {what} (1 or more)")
    return value


def _uid(text: str) -> int:
    return _at_least_one(text, "a non-root id")


def _positive(text: str) -> int:
    return _at_least_one(text, "a count")


# Below this an ordinary admission or refusal answer would not fit.
MIN_HISTORY_BYTES = 64 * 1024


def _history_bytes(text: str) -> int:
    value = _at_least_one(text, "a number of bytes")
    if value < MIN_HISTORY_BYTES:
        raise argparse.ArgumentTypeError(f"must be at least {MIN_HISTORY_BYTES} bytes")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    defaults = OperatorSettings()
    parser = argparse.ArgumentParser(prog="corral-operator", description=__doc__)
    # The groups in the order --help lists them.
    _add_watch_args(parser)
    _add_sandbox_args(parser, defaults)
    _add_egress_args(parser, defaults)
    _add_uid_args(parser, defaults)
    _add_limit_args(parser, defaults)
    _add_local_repo_args(parser, defaults)
    _add_archive_args(parser, defaults)
    _add_serving_args(parser)
    _add_leader_args(parser)
    _add_logging_args(parser)
    args = parser.parse_args(argv)
    _check_args(parser, args)
    return args


def _add_watch_args(parser: argparse.ArgumentParser) -> None:
    """Which namespaces the operator watches, and the cluster it reaches."""
    parser.add_argument(
        "-n", "--namespace", action="append", default=[], help="watch this namespace"
    )
    parser.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))


def _add_sandbox_args(parser: argparse.ArgumentParser, d: OperatorSettings) -> None:
    """What each sandbox runs and the services it is given."""
    parser.add_argument("--image", default=os.environ.get("CORRAL_SANDBOX_IMAGE", d.image))
    parser.add_argument(
        "--operator-namespace", default=os.environ.get("POD_NAMESPACE", d.operator_namespace)
    )
    parser.add_argument("--operator-pod-label", action="append", type=_label, default=[])
    parser.add_argument("--sandbox-service-account", default=d.sandbox_service_account)
    parser.add_argument("--token-audience", default=d.token_audience)
    parser.add_argument("--token-expiry-seconds", type=int, default=d.token_expiry_seconds)
    parser.add_argument("--kube-api-url", default=d.kube_api_url)
    parser.add_argument("--kube-ca-configmap", default=d.kube_ca_configmap, help="'' for none")
    parser.add_argument("--model-upstream-url", default=d.model_upstream_url)
    parser.add_argument(
        "--model-providers-file",
        type=_model_providers,
        default=(),
        help="JSON or YAML file of the platform's modelProviders (docs/providers.md); the "
        "chart mounts its modelProviders here. Unset: the one 'anthropic' provider at "
        "--model-upstream-url",
    )
    parser.add_argument(
        "--model-catalog-configmap",
        default=d.model_catalog_configmap,
        help="ConfigMap (in each Session's namespace) with the model catalog overlay, key "
        "models.json; mounted into every sandbox's harness and custodian ('' for none)",
    )
    parser.add_argument(
        "--memory-dsn-file",
        type=_memory_dsn,
        default=None,
        help="file holding the PostgreSQL DSN of the long-term memory store (docs/memory.md); "
        "copied into each sandbox's Secret for its custodian alone",
    )
    parser.add_argument(
        "--otlp-endpoint",
        default=None,
        help="OTLP/HTTP collector that each sandbox's custodian relays its harness's traces to "
        "(docs/tracing.md)",
    )


def _add_egress_args(parser: argparse.ArgumentParser, d: OperatorSettings) -> None:
    """Where a sandbox may connect: the egress gateway, the platform's endpoints, and (without
    a gateway) the cluster's DNS."""
    parser.add_argument("--platform-egress", action="append", type=_egress, default=[])
    parser.add_argument(
        "--egress-gateway",
        type=_gateway,
        default=None,
        help="ADDRESS:PORT of the egress gateway's Service: the one way out of a sandbox "
        "(docs/egress.md); unset, the NetworkPolicy allows CIDR rules alone",
    )
    parser.add_argument(
        "--egress-gateway-service",
        type=_service_ref,
        default=None,
        help="NAMESPACE/NAME of the egress gateway's Service, read at start: its clusterIP, "
        "its `proxy` and `admin` ports and its pods' selector (the chart passes this)",
    )
    parser.add_argument(
        "--egress-gateway-namespace",
        default=None,
        help="namespace of the gateway's pods (default: the operator's)",
    )
    parser.add_argument(
        "--egress-gateway-pod-label",
        action="append",
        type=_label,
        default=[],
        help="KEY=VALUE label of the gateway's pods (repeatable; default "
        "app.kubernetes.io/name=corral-egress-gateway)",
    )
    parser.add_argument("--egress-gateway-admin-port", type=int, default=9091)
    parser.add_argument(
        "--egress-binding-key-file",
        type=_binding_key,
        default=None,
        help="file holding the key that signs each pod's egress binding (the gateway has the "
        "same key and trusts no unsigned binding); the chart generates it",
    )
    parser.add_argument("--no-dns-egress", action="store_true")
    parser.add_argument(
        "--dns-namespace", default=d.dns_namespace, help="namespace of the cluster's DNS pods"
    )
    parser.add_argument(
        "--dns-pod-label",
        action="append",
        type=_label,
        default=[],
        help="KEY=VALUE label of the cluster's DNS pods (repeatable; default k8s-app=kube-dns)",
    )


def _add_uid_args(parser: argparse.ArgumentParser, d: OperatorSettings) -> None:
    """The sandbox's uids and its shared group (checked apart in _check_args)."""
    parser.add_argument("--harness-uid", type=_uid, default=d.harness_uid)
    parser.add_argument("--tools-uid", type=_uid, default=d.tools_uid)
    parser.add_argument("--custodian-uid", type=_uid, default=d.custodian_uid)
    parser.add_argument("--fs-group", type=_uid, default=d.fs_group)


def _add_limit_args(parser: argparse.ArgumentParser, d: OperatorSettings) -> None:
    """How long and how much the operator waits for, reads and sends at once."""
    parser.add_argument("--wire-wait-seconds", type=float, default=d.wire_wait_seconds)
    parser.add_argument(
        "--max-history-bytes",
        type=_history_bytes,
        default=d.max_history_bytes,
        help="the most read of one harness answer (its history) or one archived object; "
        "beyond it the read stops and the Session's condition says so (default 64 MiB)",
    )
    parser.add_argument(
        "--api-writes-in-flight",
        type=_positive,
        default=d.api_writes_in_flight,
        help="updates and deletes sent to the API server at once; creates and reads go at once",
    )


def _add_local_repo_args(parser: argparse.ArgumentParser, d: OperatorSettings) -> None:
    parser.add_argument(
        "--local-repo-root",
        default=d.local_repo_root,
        help="development aid for local clusters: resolve a relative workspace.repo against "
        "this directory on the node, or this git server's base URL (e.g. git://HOST:PORT/); "
        "off by default: relative repos are refused",
    )


def _add_archive_args(parser: argparse.ArgumentParser, d: OperatorSettings) -> None:
    """Where finished Sessions are archived (a directory or an S3 bucket), and its reader."""
    parser.add_argument(
        "--archive-dir",
        default=None,
        help="archive each Session's transcript and receipts here before its pod goes "
        "(docs/history.md; the chart mounts a PersistentVolumeClaim)",
    )
    parser.add_argument(
        "--archive-s3-endpoint",
        default=None,
        metavar="URL",
        help="archive to this S3-compatible object store instead of --archive-dir "
        "(docs/history.md)",
    )
    parser.add_argument("--archive-s3-bucket", default="", help="the S3 archive's bucket")
    parser.add_argument("--archive-s3-region", default=d.archive_s3_region, help="SigV4 region")
    parser.add_argument("--archive-s3-prefix", default="", help="a key prefix inside the bucket")
    parser.add_argument(
        "--archive-s3-credentials-dir",
        default=None,
        metavar="DIR",
        help="the mounted Secret with the files accessKeyId and secretAccessKey "
        "(and sessionToken, optional), read on each request",
    )
    parser.add_argument(
        "--archive-deadline-seconds",
        type=float,
        default=d.archive_deadline_seconds,
        help="how long after a Session finished its pod waits for a failing archive",
    )
    parser.add_argument(
        "--archive-listen",
        type=_archive_listen,
        default=None,
        metavar="HOST:PORT",
        help="serve the archive reader (people's transcripts, live or archived) here",
    )


def _add_serving_args(parser: argparse.ArgumentParser) -> None:
    """What the operator serves itself: liveness, the console and metrics."""
    parser.add_argument("--liveness", default="http://0.0.0.0:8080/healthz")
    parser.add_argument(
        "--console-addr",
        default="",
        metavar="HOST:PORT",
        help="serve the console (people's read API and web pages, docs/console.md) here; "
        "'' for none",
    )
    parser.add_argument(
        "--console-secure-cookie",
        action="store_true",
        help="mark the console's sign-in cookie Secure (set when it is served over HTTPS)",
    )
    parser.add_argument(
        "--metrics-addr",
        type=_metrics_addr,
        default=os.environ.get("CORRAL_METRICS_ADDR", ""),
        help="HOST:PORT to serve Prometheus metrics at /metrics (docs/observability.md); "
        "'' for none",
    )


def _add_leader_args(parser: argparse.ArgumentParser) -> None:
    """Leader election, for more than one replica (ADR 0103); the flags' names are
    kube-controller-manager's."""
    d = LeaseTerms()
    parser.add_argument(
        "--leader-elect-lease",
        type=_lease,
        default=None,
        metavar="NAMESPACE/NAME",
        help="lead only while holding this coordination.k8s.io Lease (a standby serves "
        "liveness, metrics, the console and the archive reader meanwhile); unset: lead alone",
    )
    parser.add_argument(
        "--leader-elect-identity",
        default=os.environ.get("POD_NAME") or socket.gethostname(),
        help="this replica's name in the Lease (a random suffix is added: a restarted "
        "replica is a new candidate)",
    )
    for flag, default, what in (
        ("--leader-elect-lease-duration", d.duration, "how long a Lease holds unrenewed"),
        ("--leader-elect-renew-deadline", d.renew_deadline, "how long a leader tries to renew"),
        ("--leader-elect-retry-period", d.retry_period, "how often a replica tries"),
    ):
        parser.add_argument(flag, type=float, default=default, metavar="SECONDS",
                            help=f"{what} (default {default:g})")  # fmt: skip


def _lease(text: str) -> tuple[str, str]:
    try:
        return parse_lease(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _election(args: argparse.Namespace) -> Election | None:
    if args.leader_elect_lease is None:
        return None
    namespace, name = args.leader_elect_lease
    identity = f"{args.leader_elect_identity}_{secrets.token_hex(4)}"
    return Election(namespace, name, identity, _lease_terms(args))


def _lease_terms(args: argparse.Namespace) -> LeaseTerms:
    """The flags' terms; ValueError when a leader could not stop before a standby leads."""
    return LeaseTerms(
        duration=args.leader_elect_lease_duration,
        renew_deadline=args.leader_elect_renew_deadline,
        retry_period=args.leader_elect_retry_period,
    )


def _add_logging_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-format",
        type=_log_format,
        default=os.environ.get(logs.LOG_FORMAT_ENV, "text"),
        help="json or text: the operator's lines, and the harness's and custodian's in every "
        f"sandbox it builds (default ${logs.LOG_FORMAT_ENV}, else text)",
    )
    parser.add_argument("-v", "--verbose", action="store_true")


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What argparse cannot check flag by flag; normalises a --local-repo-root directory to
    absolute (a URL stays as given)."""
    if not args.namespace and not args.all_namespaces:
        parser.error("give --namespace (repeatable) or --all-namespaces")
    if args.local_repo_root is not None:
        if not args.local_repo_root:
            parser.error("--local-repo-root must name a directory")
        if "://" not in args.local_repo_root:
            args.local_repo_root = os.path.abspath(args.local_repo_root)
    if args.token_expiry_seconds < 600:
        parser.error("--token-expiry-seconds must be at least 600 (the API server's minimum)")
    uids = (args.harness_uid, args.tools_uid, args.custodian_uid)
    if len(set(uids)) != 3:
        parser.error("--harness-uid, --tools-uid and --custodian-uid must be three different uids")
    if args.fs_group in uids:
        parser.error("--fs-group must be a group of its own, not one of the three uids")
    if args.leader_elect_lease is not None:
        try:
            _lease_terms(args)
        except ValueError as e:
            parser.error(str(e))
    if args.archive_s3_endpoint:
        if args.archive_dir:
            parser.error("give --archive-dir or --archive-s3-endpoint, not both")
        if not args.archive_s3_bucket or not args.archive_s3_credentials_dir:
            parser.error("--archive-s3-endpoint needs --archive-s3-bucket and "
                         "--archive-s3-credentials-dir")  # fmt: skip


def _archive_listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host, int(port)


def _metrics_addr(text: str) -> str:
    try:
        return parse_address(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _log_format(text: str) -> logs.LogFormat:
    try:
        return logs.parse_format(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _binding_key(path: str) -> str:
    try:
        text = Path(path).read_text().strip()
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot read the egress binding key: {e}") from e
    if len(text) < 32:
        raise argparse.ArgumentTypeError(f"the egress binding key in {path} is under 32 characters")
    return text


def _memory_dsn(path: str) -> str:
    """The DSN in the file (the chart mounts the memory Secret's `dsn` key there)."""
    try:
        text = Path(path).read_text().strip()
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot read the memory DSN file: {e}") from e
    if not text:
        raise argparse.ArgumentTypeError(f"the memory DSN file {path} is empty")
    return text


def _model_providers(path: str) -> tuple[ModelProvider, ...]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot read the model providers file: {e}") from e
    try:
        return tuple(load_providers(text, path))
    except ProviderError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def settings_from(args: argparse.Namespace) -> OperatorSettings:
    labels = dict(args.operator_pod_label) or OperatorSettings().operator_pod_labels
    return OperatorSettings(
        image=args.image,
        operator_namespace=args.operator_namespace,
        operator_pod_labels=labels,
        sandbox_service_account=args.sandbox_service_account,
        token_audience=args.token_audience,
        token_expiry_seconds=args.token_expiry_seconds,
        kube_api_url=args.kube_api_url,
        kube_ca_configmap=args.kube_ca_configmap or None,
        model_upstream_url=args.model_upstream_url,
        model_providers=args.model_providers_file,
        model_catalog_configmap=args.model_catalog_configmap or None,
        otlp_endpoint=args.otlp_endpoint or None,
        memory_dsn=args.memory_dsn_file,
        platform_egress=tuple(args.platform_egress),
        egress_gateway=_gateway_settings(args),
        allow_dns=not args.no_dns_egress,
        dns_namespace=args.dns_namespace,
        dns_pod_labels=dict(args.dns_pod_label) or OperatorSettings().dns_pod_labels,
        harness_uid=args.harness_uid,
        tools_uid=args.tools_uid,
        custodian_uid=args.custodian_uid,
        fs_group=args.fs_group,
        wire_wait_seconds=args.wire_wait_seconds,
        max_history_bytes=args.max_history_bytes,
        api_writes_in_flight=args.api_writes_in_flight,
        local_repo_root=args.local_repo_root,
        archive_dir=args.archive_dir or None,
        archive_deadline_seconds=args.archive_deadline_seconds,
        archive_s3_endpoint=args.archive_s3_endpoint or None,
        archive_s3_bucket=args.archive_s3_bucket,
        archive_s3_region=args.archive_s3_region,
        archive_s3_prefix=args.archive_s3_prefix,
        archive_s3_credentials_dir=args.archive_s3_credentials_dir or None,
        log_format=args.log_format,
    )


@kopf.on.startup()
async def _startup(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    # kopf keeps its own bookkeeping in annotations: the CRDs' status schemas are closed.
    settings.persistence.progress_storage = LeanAnnotationsProgressStorage(prefix="corral.dev")
    settings.persistence.diffbase_storage = LeanAnnotationsDiffBaseStorage(
        prefix="corral.dev",
        key="last-handled-configuration",
        needed=essence_needed(kopf.get_default_registry()),
    )
    settings.persistence.finalizer = "corral.dev/finalizer"
    settings.posting.level = logging.WARNING  # our Events say what happened; kopf's are noise
    # Events are for people and may trail what they describe: at most 8 are posted at once
    # (each object's worker leaves its slot 0.1 s after its last Event), so in a burst the
    # API server's time goes to Sessions' pods first (ADR 0090).
    settings.posting.worker_limit = 8
    settings.posting.idle_timeout = 0.1
    settings.watching.server_timeout = 300
    # No cluster-wide scanning of CRDs and namespaces: the kinds are known, the namespaces are
    # given, and the operator's RBAC grants neither (docs/decisions/0031).
    settings.scanning.disabled = True
    settings.batching.worker_limit = None
    global _SETTINGS
    kube = await Kube.connect(_KUBECONFIG, writes_in_flight=_SETTINGS.api_writes_in_flight)
    if _GATEWAY_SERVICE is not None:
        gateway = await gateway_of_service(kube, _GATEWAY_SERVICE)
        gateway = dataclasses.replace(gateway, binding_key=_BINDING_KEY)
        _SETTINGS = dataclasses.replace(_SETTINGS, egress_gateway=gateway)
    memo.runtime = Runtime(kube=kube, settings=_SETTINGS)
    memo.runtime.metrics.write_slots = kube.write_slots
    if _ELECTION is not None:
        await _hold_leadership(memo, _ELECTION)
    memo.runtime.metrics.leader.labels(_ELECTION.identity if _ELECTION else "").set(1)
    memo.runtime.archive = archive_store(_SETTINGS)
    if _ARCHIVE_LISTEN is not None:
        memo.archive_reader = await _start_archive_reader(memo.runtime, *_ARCHIVE_LISTEN)
    if _METRICS_ADDR:
        memo.runtime.metrics.serve(_METRICS_ADDR)
    if _SETTINGS.egress_gateway is not None:
        # Kept on the memo: a task only the event loop referenced could be collected.
        memo.egress_poll = asyncio.create_task(
            poll_forever(kube, _SETTINGS.egress_gateway, memo.runtime.egress, memo.runtime.wake)
        )


async def _hold_leadership(memo: Any, election: Election) -> None:
    """Renew the Lease this replica took before kopf started, on a client of its own (never
    behind the operator's write slots), for as long as kopf runs."""
    memo.lease_kube = await Kube.connect(_KUBECONFIG)
    memo.elector = LeaseElector(
        memo.lease_kube.client, election.namespace, election.name, election.identity,
        election.terms,
    )  # fmt: skip
    memo.leadership = asyncio.create_task(memo.elector.hold(_lost_leadership))


def _lost_leadership(why: str) -> None:
    """Another replica may lead from now on: stop at once, mid-handler or not, so that two
    never drive one Session. The Deployment starts this replica again, as a standby."""
    log.error("leader election: %s stops leading: %s", _ELECTION and _ELECTION.identity, why)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(1)


async def _start_archive_reader(runtime: Runtime, host: str, port: int) -> RunningReader:
    """The archive reader for this operator's Sessions; a live transcript is read with the
    wire token in the Session's own Secret."""
    kube = runtime.kube

    async def token(namespace: str, name: str, uid: str) -> str:
        return await read_wire_token(kube, namespace, name, uid)

    return await start_archive_reader(
        kube,
        runtime.archive,
        host,
        port,
        harness_port=runtime.settings.harness_port,
        read_token=token,
        transport=runtime.wire_transport,
        max_history_bytes=runtime.settings.max_history_bytes,
    )


@kopf.on.login()
def _login(**kw: Any) -> kopf.ConnectionInfo | None:
    # The same identity for kopf's watches as for our own calls: --kubeconfig, else in-cluster.
    if _KUBECONFIG:
        return kopf.login_with_kubeconfig(**kw)
    return kopf.login_with_service_account(**kw) or kopf.login_with_kubeconfig(**kw)


@kopf.on.cleanup()
async def _cleanup(memo: Any, **_: Any) -> None:
    runtime = getattr(memo, "runtime", None)
    reader = getattr(memo, "archive_reader", None)
    poll = getattr(memo, "egress_poll", None)
    if poll is not None:
        poll.cancel()
    if reader is not None:
        await reader.cleanup()
    if isinstance(runtime, Runtime):
        await runtime.kube.close()
        await runtime.wire_transport.close_pool()
        runtime.metrics.close()
    leadership = getattr(memo, "leadership", None)
    if leadership is not None:
        # Every handler has stopped (kopf runs the cleanup last): the standby may lead now.
        leadership.cancel()
        await memo.elector.release()
        await memo.lease_kube.close()


def main(argv: Sequence[str] | None = None) -> int:
    global _SETTINGS, _KUBECONFIG, _METRICS_ADDR, _ARCHIVE_LISTEN, _GATEWAY_SERVICE, _BINDING_KEY
    global _ELECTION
    args = parse_args(argv)
    _ELECTION = _election(args)
    _SETTINGS = settings_from(args)
    _KUBECONFIG = args.kubeconfig
    _METRICS_ADDR = args.metrics_addr
    _ARCHIVE_LISTEN = args.archive_listen
    _GATEWAY_SERVICE = args.egress_gateway_service
    _BINDING_KEY = args.egress_binding_key_file
    if _GATEWAY_SERVICE is not None and args.egress_gateway is not None:
        print(
            "corral-operator: give --egress-gateway or --egress-gateway-service, not both",
            file=sys.stderr,
        )
        return 2
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # kopf's own login reads it
    logs.configure(args.log_format, logging.DEBUG if args.verbose else logging.INFO, sys.stderr)
    if not args.verbose:
        # A line per wire request and per handler run: with 1,000 Sessions, formatting them
        # cost the operator CPU (docs/performance.md). Warnings and errors still show.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    assert handlers  # importing the package registered every handler
    if args.console_addr:
        # Imported only when served: without a console, its web stack is never loaded.
        from .console.serve import start_in_operator

        start_in_operator(
            args.kubeconfig,
            None if args.all_namespaces else tuple(args.namespace),
            args.console_addr,
            _SETTINGS.harness_port,
            secure_cookie=args.console_secure_cookie,
            # Its own store object: the console runs on its own thread (docs/console.md).
            archive=archive_store(_SETTINGS),
            max_history_bytes=_SETTINGS.max_history_bytes,
        )
    if not collector.acyclic_kopf_bodies():  # an event's body freed when dropped (ADR 0091)
        logging.getLogger(__name__).warning("kopf's Body is of an unknown shape: left as is")
    collector.tune()  # after every import, before the first watch (ADR 0090)
    if _ELECTION is not None:
        _wait_for_leadership(args, _ELECTION)
    kopf.run(
        standalone=True,
        clusterwide=args.all_namespaces,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness or None,
        memo=kopf.Memo(),
    )
    return 0


def _wait_for_leadership(args: argparse.Namespace, election: Election) -> None:
    """Stand by, serving what every replica serves, until this replica holds the Lease."""
    serving = StandbyServing(
        liveness=args.liveness or "",
        metrics_addr=args.metrics_addr,
        archive_listen=args.archive_listen,
        kubeconfig=args.kubeconfig,
        archive=archive_store(_SETTINGS),
        harness_port=_SETTINGS.harness_port,
        max_history_bytes=_SETTINGS.max_history_bytes,
    )

    async def wait() -> float:
        kube = await Kube.connect(args.kubeconfig)
        try:
            elector = LeaseElector(
                kube.client, election.namespace, election.name, election.identity,
                election.terms,
            )  # fmt: skip
            return await stand_by(elector, serving)
        finally:
            await kube.close()

    waited = asyncio.run(wait())
    log.info("leader election: %s leads after %.1f s as a standby", election.identity, waited)


if __name__ == "__main__":
    sys.exit(main())
