"""Observability: the metric declarations (:mod:`jodl.obs.metrics`), the bottom layer."""
