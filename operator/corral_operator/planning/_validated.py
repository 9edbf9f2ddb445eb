"""An object's metadata and spec as its API model, or why they do not validate: what every
planner's inputs start from."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

Model = TypeVar("Model", bound=BaseModel)


def validated(model: type[Model], body: dict[str, Any]) -> Model | ValidationError:
    try:
        return model.model_validate({k: body.get(k) for k in ("metadata", "spec")})
    except ValidationError as exc:
        return exc
