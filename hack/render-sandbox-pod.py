"""Print, as a YAML stream, the manifests the operator creates for one Session behind the chart's
egress gateway: the sandbox pod, its NetworkPolicy and its Secret (values redacted). The
chart's security scan (hack/chart-check.sh) reads them: the chart does not template sandbox
pods, the operator's builder does, so the scan must see the builder's output.

Usage: .venv/bin/python hack/render-sandbox-pod.py > sandbox.yaml
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests/_objects.py: the test world's Agent and Session

from tests._objects import agent, session  # noqa: E402

from corral_operator.builders.podbuilder import build_sandbox  # noqa: E402
from corral_operator.settings import EgressGateway, OperatorSettings  # noqa: E402

# As the chart's operator reads them at start: the gateway Service's clusterIP and ports, its
# pods' labels, and a binding key (the chart's generated Secret).
GATEWAY = EgressGateway(
    address="10.96.0.40",
    port=3128,
    namespace="corral-system",
    pod_labels={"app.kubernetes.io/name": "corral-egress-gateway"},
    binding_key="k" * 48,
)


def main() -> int:
    manifests = build_sandbox(
        agent(sandbox={"egress": [{"host": "pypi.org"}]}),
        session(),
        OperatorSettings(egress_gateway=GATEWAY, model_catalog_configmap="corral-model-catalog"),
        "w" * 43,
        "c" * 43,
        egress_credential="e" * 43,
    )
    secret = manifests.secret
    # The scan judges the Secret's shape, not its contents: never print a credential.
    for field in ("data", "stringData"):
        if field in secret:
            secret[field] = {key: "cmVkYWN0ZWQ=" for key in secret[field]}
    yaml.safe_dump_all(manifests.all(), sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
