"""The fixed rule: capabilities no allowlist can reach, not even `*`. One place, as data.

The data and the matching live in `corral_common.toolmatch`, so the harness (what the model is
offered) and the custodian (what a Menu call may do) apply the very same rule.
"""

from __future__ import annotations

from corral_common.toolmatch import FORBIDDEN, MENU_PREFIX, bare_name, forbidden_reason

__all__ = ["FORBIDDEN", "MENU_PREFIX", "bare_name", "forbidden_reason"]
