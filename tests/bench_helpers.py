"""What the benchmarks' test files share (``from bench_helpers import ...``): a result's machine
record, as ``hvdtrain.bench.shared.host.machine`` writes it."""
from __future__ import annotations

MACHINE = {"cpu": "cpu", "cores": 2, "memory_gib": 1, "os": "os", "python": "3",
           "versions": {"tensorflow-cpu": "2.20.0", "keras": "3.15.1"},
           "load_average_1min_at_start": 0.123, "date_utc": "today"}
