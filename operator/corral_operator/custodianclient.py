"""The operator's one call to the custodian: its own record of what the session spent.

`GET http://<podIP>:8082/v1/usage` with the wire token. The port is opened by the sandbox's
NetworkPolicy to the operator's pods only, and the custodian answers it only with the wire
token. The Session's `status.usage` comes from this record, never from the harness's report
(docs/decisions/0062).
"""

from __future__ import annotations

import httpx
from pydantic import ValidationError

from corral_api.kinds import Usage
from corral_api.wire import CustodianDelivery, CustodianUsage

USAGE_PATH = "/v1/usage"
DELIVERY_PATH = "/v1/delivery"


class CustodianUnavailable(Exception):
    """The custodian's record could not be read; the status keeps the last figure read."""


async def read_usage(
    base_url: str,
    token: str,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    timeout: float = 10.0,
) -> CustodianUsage:
    try:
        async with httpx.AsyncClient(
            base_url=base_url, transport=transport, timeout=timeout
        ) as client:
            answer = await client.get(USAGE_PATH, headers={"Authorization": f"Bearer {token}"})
    except httpx.HTTPError as err:
        raise CustodianUnavailable(f"{base_url}{USAGE_PATH}: {err!r}") from None
    if answer.status_code != 200:
        raise CustodianUnavailable(
            f"{base_url}{USAGE_PATH} answered {answer.status_code}: {answer.text[:200]}"
        )
    try:
        return CustodianUsage.model_validate(answer.json())
    except (ValueError, ValidationError) as err:
        raise CustodianUnavailable(f"{base_url}{USAGE_PATH}: not a usage record: {err}") from None


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
    try:
        async with httpx.AsyncClient(
            base_url=base_url, transport=transport, timeout=timeout
        ) as client:
            answer = await client.get(DELIVERY_PATH, headers={"Authorization": f"Bearer {token}"})
    except httpx.HTTPError as err:
        raise CustodianUnavailable(f"{base_url}{DELIVERY_PATH}: {err!r}") from None
    if answer.status_code != 200:
        raise CustodianUnavailable(
            f"{base_url}{DELIVERY_PATH} answered {answer.status_code}: {answer.text[:200]}"
        )
    try:
        return CustodianDelivery.model_validate(answer.json())
    except (ValueError, ValidationError) as err:
        raise CustodianUnavailable(
            f"{base_url}{DELIVERY_PATH}: not a delivery record: {err}"
        ) from None
