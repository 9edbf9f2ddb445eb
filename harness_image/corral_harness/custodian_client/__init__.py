"""The harness's clients of the custodian: the Menu and approvals, always over HTTP with the
pod-local credential. Nothing here holds a secret the custodian would accept from the agent."""
