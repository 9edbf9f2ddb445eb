"""Pure decisions: given what the operator observed, what to do and what status to write.

Nothing here talks to the API server; the handlers gather, call a planner, and apply.
"""
