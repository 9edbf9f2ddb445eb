"""Approvals: how an `ask` outcome becomes a person's decision (docs/approvals.md).

- `settle`: settling an `ask` through an `ApprovalPort`, and the digest a decision binds to
  (pure: no store, no transport).
- `custodian_port`: the port in a pod and under `corral run`: the custodian creates the
  Approval and reports its decision.
- `file_port`: the port of a harness with no custodian: the local file store.
"""
