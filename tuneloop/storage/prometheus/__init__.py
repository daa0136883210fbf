"""Series in a Prometheus-compatible TSDB (Prometheus, VictoriaMetrics, Mimir, Thanos)."""
