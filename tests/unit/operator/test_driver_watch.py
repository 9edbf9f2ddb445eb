"""The Session loop notices its driver's end at once, not at its 30 s safety net."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from corral_operator import handlers  # noqa: F401  (the loop's module is imported through them)
from corral_operator.runtime import Runtime
from corral_operator.sessionloop import DRIVER_RECHECK, SessionLoop
from corral_operator.settings import OperatorSettings


class Running:
    """kopf's stop flag, not set: the daemon keeps running."""

    def __bool__(self) -> bool:
        return False


def test_a_finished_driver_is_noticed_before_the_recheck() -> None:
    async def scenario() -> float:
        rt = Runtime(kube=cast(Any, None), settings=OperatorSettings())
        loop = SessionLoop(rt, "ns", "s1")
        driver = asyncio.create_task(asyncio.sleep(0.05))  # a turn that settles at once
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(
            loop._watch_driver(driver, cast(Any, None), Running(), {}), DRIVER_RECHECK / 3
        )
        return asyncio.get_running_loop().time() - started

    # Waiting for the driver *and* a wake-up returned only at the 30 s recheck: the pod of
    # every finished Session stayed that long, and a freeze interrupted a turn that late.
    assert asyncio.run(scenario()) < 2.0
