"""A real inference service under the tuner: a dynamically batching HTTP server in front of a
PyTorch model, its load generator, the webhook that scales its replicas and the A/B verdict.
See ``examples/inference/README.md``."""
