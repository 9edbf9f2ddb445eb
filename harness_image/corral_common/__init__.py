"""What the sandbox pod's roles share, and nothing else: the model catalog (`catalog`), the
tool-name matching of the Agent's allow/deny lists and the fixed rule (`toolmatch`), and the
pod-local credential's conventions. The harness (the brain), the custodian (the keys) and the
tools exec service (the hands) import each other never; each may import this package and
`corral_api`.
"""
