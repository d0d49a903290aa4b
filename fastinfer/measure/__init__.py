"""Measuring: the photo pool, fidelity gates, the in-process profiler, the engine bench and the plots
behind `fastinfer …`, `python -m build_models` and `python -m load_tests`. Imports serving/ and below."""
