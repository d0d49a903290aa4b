"""The leaves every layer uses: where BentoML's home is, the error shape, the response schemas, what
this machine's hardware is, file digests, the key a client sends. Imports nothing of FastInfer's above it."""
