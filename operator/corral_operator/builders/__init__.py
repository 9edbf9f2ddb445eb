"""The manifests the operator creates, built as pure functions over plain dicts: the Session's
sandbox (`podbuilder`), the warm pool's pods (`poolpod`) and the Evidence check pod
(`evidencepod`)."""
