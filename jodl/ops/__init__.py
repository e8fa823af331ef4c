"""Operations: what ``jodl status`` shows (:mod:`.status`), the Prometheus collectors of
each process (:mod:`.metrics`) and the health, metrics and profiling endpoint
(:mod:`.server`)."""
