"""Observability, the bottom layer: the metric declarations (:mod:`jodl.obs.metrics`),
logs (:mod:`jodl.obs.logs`) and traces (:mod:`jodl.obs.tracing`, the ``[otel]`` extra)."""
