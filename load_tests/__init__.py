"""Load tests and measurements of a running FastInfer service."""
