"""Series in a Prometheus-compatible TSDB: remote write in, PromQL over the HTTP API out."""
