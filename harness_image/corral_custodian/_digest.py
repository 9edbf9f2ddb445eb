"""The action digest, from the shared API package (kept as a module for local imports)."""

from corral_api.digest import action_digest, canonical_json

__all__ = ["action_digest", "canonical_json"]
