"""An upgrade mid-turn on the real node (docs/operations.md, "Upgrade"): a Session running under
the operator and sandbox image of an earlier commit (EARLIER) continues to Succeeded after the
operator is upgraded to the working tree's while its turn runs.

EARLIER is the last commit before the wire stated its version: its harness answers without
`Corral-Wire-Version` (wire 1.0), and the working tree's operator (1.1) drives it. Its chart
and its own images are built from a `git worktree` by its own hack/node/build-images.sh and
cached by that script's keys (corral_dev.earlier). The tier's control plane holds the working
tree's CRDs: this module puts EARLIER's in their place for the install, as a cluster running
it would have them, and the working tree's are back when it ends, whatever happened.

The turn is held in a command, not in a model answer: the upgrade rolls the egress gateway too
(it ships in the operator image), which cuts a model call in flight through it, and the harness
sends that request again (a held answer is asked for twice)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest

from corral_api.wire import WIRE_VERSION_HEADER
from corral_dev import _realnode_stack as rstack
from corral_dev import earlier as earlier_commits
from corral_dev import realnode

from ..conftest import record_tier_time
from . import _corral
from ._corral import Corral
from ._target import Target

# EARLIER's images are built beside the tests (conftest.py); what a cold build has not finished
# when this module starts is waited for inside the test's time (about 2 minutes on 2 cores).
pytestmark = pytest.mark.timeout(900)

# The last commit before the wire stated its version (its harness is wire 1.0).
EARLIER = "9ba1147ca087554df15da375958b857fcec5538f"
# Turn 1's command: a mark in the workspace while it runs, until the test says GO.
HOLD = "touch RUNNING && until [ -e GO ]; do sleep 0.2; done && rm RUNNING GO && echo one > ONE.md"
OPERATOR_SELECTOR = (
    f"app.kubernetes.io/name=corral-operator,app.kubernetes.io/instance={_corral.RELEASE}"
)


@pytest.fixture(scope="module")
def earlier(target: Target, request: pytest.FixtureRequest) -> earlier_commits.Earlier:
    """EARLIER's worktree and images (built beside the tests from the end of collection, see
    conftest.py), imported into the real node's containerd."""
    if target.name == "external":
        pytest.skip("EARLIER's images are imported into the real node's containerd only")
    node: realnode.RealNode = request.getfixturevalue("real_node")
    build: Callable[[str], earlier_commits.Earlier] = request.getfixturevalue("earlier_build")
    start = time.monotonic()
    built = build(EARLIER)
    waited = time.monotonic() - start
    record_tier_time("node", f"waiting for commit {EARLIER[:7]}'s images", waited)
    imported = earlier_commits.import_images(node, built)
    record_tier_time("node", f"commit {EARLIER[:7]}'s images imported", imported)
    how = "built" if built.built else "cached"
    print(f"commit {EARLIER[:7]}: worktree and images {how} in {built.seconds:.1f}s "
          f"(waited for {waited:.1f}s), imported in {imported:.1f}s")  # fmt: skip
    return built


def _apply_crds(target: Target, directory: str) -> None:
    """The documented step: the chart's CRDs applied server-side, taking helm's fields."""
    target.kubectl("apply", "--server-side", "--force-conflicts", "-f", directory)
    target.kubectl("wait", "--for=condition=Established", "crd", "-l",
                   "app.kubernetes.io/part-of=corral", "--timeout=60s")  # fmt: skip


@pytest.fixture(scope="module")
def corral(target: Target, earlier: earlier_commits.Earlier) -> Iterator[Corral]:
    """EARLIER's chart installed with EARLIER's images and CRDs, as `_corral.installed` installs
    the working tree's (it installs `rstack.CHART`: here, EARLIER's chart)."""
    start = time.monotonic()
    with contextlib.ExitStack() as stack:
        stack.callback(_apply_crds, target, str(rstack.CHART / "crds"))
        _apply_crds(target, str(earlier.crds))
        at_earlier = dataclasses.replace(
            target, operator_image=earlier.operator_image, sandbox_image=earlier.sandbox_image
        )
        with mock.patch.object(rstack, "CHART", earlier.chart):
            installed = stack.enter_context(_corral.installed(at_earlier))
        record_tier_time("node", f"Corral of {EARLIER[:7]} installed (helm)",
                         time.monotonic() - start)  # fmt: skip
        yield installed


def _upgrade(target: Target) -> None:
    """docs/operations.md, "Upgrade": the new CRDs, then `helm upgrade --reuse-values` with the
    new chart; the images are `target`'s, the working tree's (they have no release tag here)."""
    _apply_crds(target, str(rstack.CHART / "crds"))
    repository, tag = rstack.split_image(target.operator_image)
    images = {"image.repository": repository, "image.tag": tag,
              "sandboxImage": target.sandbox_image}  # fmt: skip
    rstack.helm_install(target.helm, target.kubeconfig, _corral.RELEASE, images, reuse_values=True)


def _image(pod: dict[str, Any], container: str) -> str:
    return str(next(c["image"] for c in pod["spec"]["containers"] if c["name"] == container))


def _operator_images(corral: Corral) -> dict[str, str]:
    """Each operator pod's image, by the pod's name (pods already going left out)."""
    listed = corral.kubectl("get", "pods", "-n", _corral.OPERATOR_NAMESPACE, "-l",
                            OPERATOR_SELECTOR, "-o", "json")  # fmt: skip
    return {
        pod["metadata"]["name"]: _image(pod, "operator")
        for pod in json.loads(listed.stdout)["items"]
        if not pod["metadata"].get("deletionTimestamp")
    }


def _leader(corral: Corral) -> str:
    """The pod whose operator holds the Lease (its identity: `<pod>_<random suffix>`)."""
    lease = corral.get("lease", f"{_corral.RELEASE}-operator", _corral.OPERATOR_NAMESPACE) or {}
    holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
    return holder.rpartition("_")[0]


def _led_by(corral: Corral, image: str) -> bool:
    """Every operator pod runs `image`, and one of them holds the Lease."""
    pods = _operator_images(corral)
    return bool(pods) and set(pods.values()) == {image} and _leader(corral) in pods


def _rollout(corral: Corral) -> str:
    """Where the operator's rollout is, for a failure's message."""
    ns = _corral.OPERATOR_NAMESPACE
    listed = corral.kubectl("get", "deploy,rs,pods", "-n", ns, "-o", "wide", check=False)
    events = corral.kubectl("get", "events", "-n", ns, "--sort-by=.lastTimestamp", check=False)
    return (f"{listed.stdout}\nlease: {_leader(corral)}\n"
            f"{chr(10).join(events.stdout.splitlines()[-25:])}")  # fmt: skip


def _running(corral: Corral, pod: str) -> str:
    """Where turn 1's command left its mark while it runs ("": it does not run)."""
    found = corral.exec(pod, "tools", "find", "/workspace", "-maxdepth", "2", "-name", "RUNNING")
    return found.stdout.strip() if found.returncode == 0 else ""


def _go(corral: Corral, pod: str, mark: str) -> None:
    """Let turn 1's command finish."""
    done = corral.exec(pod, "tools", "touch", mark.removesuffix("RUNNING") + "GO")
    assert done.returncode == 0, done.stderr


def _summary(requests: list[dict[str, Any]]) -> list[str]:
    """Each model request: when, and the end of its last message."""
    return [f"{r['ts']:.1f} {str(r['body']['messages'][-1])[-160:]}" for r in requests]


def _in_flight(corral: Corral, name: str, turn: int) -> dict[str, Any] | None:
    ledger = ((corral.get("session", name) or {}).get("status") or {}).get("ledger")
    return ledger if ledger and ledger.get("turn") == turn else None


def _wire_version(corral: Corral, pod: str) -> str:
    """What the pod's harness says of its wire version on /readyz (`None`: no header)."""
    ip = corral.pod_ip(pod)
    ask = (
        "import sys, urllib.error, urllib.request as u\n"
        "try:\n    r = u.urlopen(sys.argv[1], timeout=5)\n"
        "except urllib.error.HTTPError as e:\n    r = e\n"
        "print(r.headers.get(sys.argv[2]))\n"
    )
    done = corral.exec(pod, "harness", "python3", "-c", ask, f"http://{ip}:8080/readyz",
                       WIRE_VERSION_HEADER)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _remote_git(corral: Corral, *args: str) -> str:
    """git in the repository the Session cloned and pushed to."""
    remote = corral.work / "repos" / "work" / "repo"
    done = subprocess.run(["git", "-C", str(remote), *args], capture_output=True, text=True,
                          check=True)  # fmt: skip
    return done.stdout


def test_a_session_continues_to_succeeded_across_an_operator_upgrade_mid_turn(
    corral: Corral, earlier: earlier_commits.Earlier, target: Target
) -> None:
    """Turn 1 is admitted by EARLIER's operator and runs a command while the operator is
    upgraded; the new operator takes the turn over in the same pod (EARLIER's harness, wire
    1.0), admits turn 2 there, and the Session Succeeds with no turn run twice."""
    assert earlier.sandbox_image != target.sandbox_image
    assert earlier.operator_image != target.operator_image
    name = "upgraded-mid-turn"
    script = [
        {"tool_use": {"name": "bash", "input": {"command": HOLD, "timeout": 300}}},
        {"text": "Wrote ONE.md."},  # turn 1's end, once its command is done
        {"tool_use": {"name": "bash", "input": {"command": "cat ONE.md && echo two > TWO.md"}}},
        {"text": "ALL DONE: ONE.md and TWO.md."},
    ]
    corral.load_script({"conversations": {name: script}})
    guard = {"criteria": {"substring": "ALL DONE"}, "turnBudget": 3}
    corral.apply(_corral.agent_doc(), _corral.session_doc(name, corral.git_url, evaluation=guard))
    pod_name = f"corral-{name}"

    def held() -> str | None:
        return _running(corral, pod_name) if _in_flight(corral, name, 1) else None

    mark = _corral.wait_for("turn 1 running its command", held, 240,
                            lambda: corral.diagnose(name))  # fmt: skip
    pod = corral.get("pod", pod_name)
    assert pod is not None
    assert _image(pod, "harness") == earlier.sandbox_image
    assert _led_by(corral, earlier.operator_image), (_operator_images(corral), _leader(corral))

    start = time.monotonic()
    _upgrade(target)
    helm = time.monotonic() - start
    _corral.wait_for(
        "the new operator leading",
        lambda: _led_by(corral, target.operator_image),
        120,
        lambda: _rollout(corral),
    )
    upgraded, took = time.time(), time.monotonic() - start
    record_tier_time("node", "operator upgrade mid-turn (CRDs, helm upgrade, new leader)", took)
    print(f"the upgrade took {took:.1f}s ({helm:.1f}s to the end of helm upgrade --wait)")
    # Mid-turn: the new operator leads while turn 1's command still runs.
    seen = corral.model_requests(name)
    assert _in_flight(corral, name, 1) and _running(corral, pod_name) and len(seen) == 1, (
        f"turn 1 went on during the {took:.0f}s upgrade: {_summary(seen)}"
    )

    _go(corral, pod_name, mark)
    status = corral.wait_phase(name, {"Succeeded", "Failed"}, timeout=180)
    assert status["phase"] == "Succeeded", corral.diagnose(name)
    assert status["turns"] == 2 and status.get("restarts", 0) == 0, status
    requests = corral.model_requests(name)
    assert len(requests) == len(script), _summary(requests)
    assert requests[2]["ts"] > upgraded  # turn 2 was admitted by the new operator
    assert "one" in str(requests[3]["body"]["messages"][-1])
    # The same pod throughout, EARLIER's sandbox: the new operator drove a harness of wire 1.0.
    now = corral.get("pod", pod_name)
    assert now is not None and now["metadata"]["uid"] == pod["metadata"]["uid"]
    assert _image(now, "harness") == earlier.sandbox_image
    assert _wire_version(corral, pod_name) == "None"
    assert set(_operator_images(corral).values()) == {target.operator_image}
    branch = f"corral/{name}"
    files = _remote_git(corral, "ls-tree", "--name-only", branch).split()
    assert {"ONE.md", "TWO.md"} <= set(files)
    assert status["delivery"]["revision"] == _remote_git(corral, "rev-parse", branch).strip()
