"""The engine seam (`seam.py`), its provider-message helpers, the shared tool loop (`_loop.py`)
and two adapters: `lean_engine` (httpx, the default) and `anthropic_engine` (the official SDK,
the reference). `choice.py` picks one from CORRAL_ENGINE.

Importing this package does not import the SDK: only `anthropic_engine` does, and only when
CORRAL_ENGINE=sdk chooses it.
"""
