"""The engine seam (`seam.py`), its provider-message helpers, and the one adapter on the SDK.

Importing this package does not import the SDK: only `anthropic_engine` does, and the server
loads it in the background.
"""
