"""Each image holds only its role (pyproject.toml's extras, installed by its Dockerfile),
checked on its OCI archive without running it. A stranger fails the test: a distribution
outside the requirement closure of `corral[<the role's extras>]` (computed from the METADATA
files inside the image, markers evaluated for its interpreter), a Corral package of another
role, the scripted model server, or a console script whose module is not installed. The logic
is corral_dev.image_contents, tested on its own in tests/unit/devtools."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral_dev import image_contents, realnode

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize(("key", "role"), [("OPERATOR", "operator"), ("SANDBOX", "sandbox")])
def test_the_image_holds_only_its_role(
    node_artifacts: realnode.Artifacts, key: str, role: str
) -> None:
    image = image_contents.read_image(Path(node_artifacts[f"{key}_OCI"]))
    problems = image_contents.image_strangers(image, image_contents.ROLES[role])
    assert not problems, f"{node_artifacts[f'{key}_IMAGE']}:\n" + "\n".join(problems)
