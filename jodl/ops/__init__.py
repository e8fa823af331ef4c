"""Operations: what ``jodl status`` shows (:mod:`.status`), the Prometheus collectors of
each process (:mod:`.metrics`), the health, metrics and profiling endpoint
(:mod:`.server`) and where Prometheus finds every one of them (:mod:`.targets`)."""
