"""The harness's clients of the custodian: the Menu and memory, always over HTTP with the
pod-local credential (the approvals client is `approvals.custodian_port`). Nothing here holds a
secret the custodian would accept from the agent."""
