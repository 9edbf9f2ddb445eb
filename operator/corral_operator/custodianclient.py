"""The operator's one call to the custodian: its own record of what the session spent.

`GET http://<podIP>:8082/v1/usage` with the wire token. The port is opened by the sandbox's
NetworkPolicy to the operator's pods only, and the custodian answers it only with the wire
token. The Session's `status.usage` comes from this record, never from the harness's report
(docs/decisions/0062).
"""

from __future__ import annotations

from typing import TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from corral_api.kinds import Usage
from corral_api.wire import CustodianDelivery, CustodianUsage

USAGE_PATH = "/v1/usage"
DELIVERY_PATH = "/v1/delivery"

RecordT = TypeVar("RecordT", bound=BaseModel)


class CustodianUnavailable(Exception):
    """The custodian's record could not be read; the status keeps the last figure read."""


async def _read_record(
    base_url: str,
    token: str,
    path: str,
    shape: type[RecordT],
    what: str,
    transport: httpx.AsyncBaseTransport | None,
    timeout: float,
) -> RecordT:
    try:
        async with httpx.AsyncClient(
            base_url=base_url, transport=transport, timeout=timeout
        ) as client:
            answer = await client.get(path, headers={"Authorization": f"Bearer {token}"})
    except httpx.HTTPError as err:
        raise CustodianUnavailable(f"{base_url}{path}: {err!r}") from None
    if answer.status_code != 200:
        raise CustodianUnavailable(
            f"{base_url}{path} answered {answer.status_code}: {answer.text[:200]}"
        )
    try:
        return shape.model_validate(answer.json())
    except (ValueError, ValidationError) as err:
        raise CustodianUnavailable(f"{base_url}{path}: not a {what}: {err}") from None


async def read_usage(
    base_url: str,
    token: str,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    timeout: float = 10.0,
) -> CustodianUsage:
    return await _read_record(
        base_url, token, USAGE_PATH, CustodianUsage, "usage record", transport, timeout
    )


def status_usage(record: CustodianUsage) -> Usage:
    """The custodian's record as a Session's `status.usage`."""
    spent = record.usage
    return Usage(
        input_tokens=spent.input,
        output_tokens=spent.output,
        cache_read_tokens=spent.cacheRead,
        cache_write_tokens=spent.cacheWrite,
        cost=spent.cost,
    )


async def read_delivery(
    base_url: str,
    token: str,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    timeout: float = 10.0,
) -> CustodianDelivery:
    """The custodian's delivery record (docs/delivery.md), on the same port and token."""
    return await _read_record(
        base_url, token, DELIVERY_PATH, CustodianDelivery, "delivery record", transport, timeout
    )
