"""Developer tooling: the local control plane and the local node (tests and `make dev-cluster`)."""
