"""Corral's API: the `corral.dev/v1alpha1` kinds and the wire's shapes.

This package is the bottom layer: both the operator and the sandbox image import it, and it
imports neither of them nor any adapter library.
"""

from ._base import API_VERSION, GROUP, VERSION, Condition, corral_path
from .kinds import (
    KIND_BY_NAME,
    KINDS,
    Agent,
    AgentSpec,
    Approval,
    Evidence,
    Goal,
    Session,
    SessionSpec,
    SessionStatus,
)

__all__ = [
    "API_VERSION",
    "GROUP",
    "KINDS",
    "KIND_BY_NAME",
    "VERSION",
    "Agent",
    "AgentSpec",
    "Approval",
    "Condition",
    "Evidence",
    "Goal",
    "Session",
    "SessionSpec",
    "SessionStatus",
    "corral_path",
]
