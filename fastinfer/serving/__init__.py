"""The request path without HTTP: decode and preprocess, the response cache, the pipeline that calls a
runner, top-k, the runners' micro-batcher, the CPU pool, live stats and Prometheus metrics (and their
files on a full disk). Imports catalog/, engines/ and common/."""
