"""Stand-ins for the model providers the custodian translates to (docs/providers.md), on
loopback, each checking what the real endpoint checks with an implementation that is not
Corral's own, and answering from a Messages API server behind it (the scripted model):

- `_bedrock`: Amazon Bedrock's runtime and STS (a stand-in for both, named as such): SigV4
  signatures recomputed with botocore, answers framed in the AWS event-stream encoding;
- `_vertex`: Google's OAuth token endpoint (the JWT grant's RS256 signature verified with
  google-auth) and Vertex AI's `streamRawPredict`, which accepts only tokens it issued;
- `_gateway`: a Messages-compatible gateway that wants its key in its own header.

Each module has `main(argv)`: `python -m corral_dev.providers KIND ...` starts one and prints a
line of JSON with its URLs once it listens. Test dependencies only (botocore, google-auth).
"""
