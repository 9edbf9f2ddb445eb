"""Building blocks shared by every kind: the model base, conditions, and CRD metadata."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

GROUP = "corral.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"


def corral_path(namespace: str, plural: str, name: str | None = None) -> str:
    """The REST path of Corral's `plural` in `namespace`, or of the one called `name`."""
    base = f"/apis/{API_VERSION}/namespaces/{namespace}/{plural}"
    return f"{base}/{name}" if name else base


class ApiModel(BaseModel):
    """Base for every API object: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )

    def wire(self) -> dict[str, Any]:
        """The object as Kubernetes and the wire spell it."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def cel(rule: str, message: str, *, field_path: str | None = None) -> JsonDict:
    """One `x-kubernetes-validations` entry."""
    entry: JsonDict = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def with_rules(*rules: JsonDict) -> ConfigDict:
    """The base model config plus object-level CEL rules."""
    return ConfigDict(
        **ApiModel.model_config, json_schema_extra={"x-kubernetes-validations": list(rules)}
    )


def field_rules(*rules: JsonDict) -> JsonDict:
    """`json_schema_extra` for a field with CEL rules."""
    return {"x-kubernetes-validations": list(rules)}


class Condition(ApiModel):
    """The standard Kubernetes condition shape."""

    type: str = Field(description="Condition type, e.g. Ready, Progressing, Succeeded.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="One CamelCase word a machine can match on.")
    message: str = Field(default="", description="What a person should know.")
    last_transition_time: str = Field(
        description="When status last flipped (RFC 3339).",
        json_schema_extra={"format": "date-time"},
    )
    observed_generation: int = Field(
        default=0, ge=0, description="The metadata.generation this condition was computed from."
    )


@dataclass(frozen=True)
class PrinterColumn:
    name: str
    json_path: str
    type: str = "string"
    description: str = ""
    priority: int = 0


@dataclass(frozen=True)
class KindInfo:
    """CRD metadata for one kind: names, columns, and the schema root models."""

    kind: str
    plural: str
    short_names: tuple[str, ...]
    columns: tuple[PrinterColumn, ...]
    description: str
    categories: tuple[str, ...] = ("corral",)


AGE = PrinterColumn("Age", ".metadata.creationTimestamp", "date")


class Resource(ApiModel):
    """A top-level kind: apiVersion/kind/metadata around spec and status."""

    info: ClassVar[KindInfo]
