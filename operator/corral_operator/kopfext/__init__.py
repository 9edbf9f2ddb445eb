"""What the operator changes in kopf and the interpreter under it: the garbage collector's
tuning and kopf's acyclic bodies (`collector`), and kopf's lean diff-base storage
(`diffbase`)."""
