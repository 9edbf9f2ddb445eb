"""The console: a read API and web pages for people, served beside the operator (its own
listener in the operator process) and by `corral console` on a workstation (docs/console.md,
ADR 0082)."""
