"""The unit tier's fixtures shared with other tiers (tests/_fixtures.py): the scripted model
server and PostgreSQL."""

from tests._fixtures import postgres, scripted, scripted_server  # noqa: F401
