"""Service counters, exposed as Prometheus text at ``/metrics``."""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["Metrics"]


@dataclass(slots=True)
class Metrics:
    rows_inserted: int = 0
    bytes_inserted: int = 0
    batches_inserted: int = 0
    duplicate_batches: int = 0
    rows_committed: int = 0
    flushes: int = 0
    flush_seconds_total: float = 0.0
    channels_opened: int = 0
    compactions_started: int = 0
    rejected_requests: int = 0
    buffer_bytes: int = 0

    def record_insert(self, rows: int, nbytes: int, buffered: int) -> None:
        self.rows_inserted += rows
        self.bytes_inserted += nbytes
        self.batches_inserted += 1
        self.buffer_bytes = buffered

    def record_flush(self, rows: int, seconds: float) -> None:
        self.rows_committed += rows
        self.flushes += 1
        self.flush_seconds_total += seconds

    def prometheus(self, extra: dict[str, float]) -> str:
        lines = []
        for item in fields(self):
            value = getattr(self, item.name)
            kind = "gauge" if item.name == "buffer_bytes" else "counter"
            name = f"ingest_{item.name}" + (
                "_total" if kind == "counter" and not item.name.endswith("_total") else ""
            )
            lines += [f"# TYPE {name} {kind}", f"{name} {value}"]
        for name, value in extra.items():
            lines += [f"# TYPE ingest_{name} gauge", f"ingest_{name} {value}"]
        return "\n".join(lines) + "\n"
