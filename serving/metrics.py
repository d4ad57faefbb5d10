"""What `/metrics` exposes, in Prometheus' text format, from one registry per app (never the library's global
default registry: two servers in one process, or a test, must not share counters).

Request counts by model and status; latency histograms with the time a request waited in the batch queue and the
time its call ran kept apart (a slow queue and a slow model need different fixes); the queue depth; and
``tcexport_batch_size``, the rows of each call actually executed, which shows whether dynamic batching merges.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("tcexport_requests", "Inference requests by model, version and HTTP status",
                                ["model", "version", "status"], registry=r)
        self.latency = Histogram("tcexport_request_seconds", "Request time from arrival to response",
                                 ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_time = Histogram("tcexport_queue_seconds", "Time a request waited before its call started",
                                    ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.compute_time = Histogram("tcexport_compute_seconds", "Time of each executed call of a model",
                                      ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("tcexport_batch_size", "Rows of each executed call (dynamic batching merges "
                                    "requests along the batch symbol)", ["model"], buckets=BATCH_BUCKETS, registry=r)
        self.queue_depth = Gauge("tcexport_queue_depth", "Requests waiting or running, by model", ["model"],
                                 registry=r)
        self.loaded = Gauge("tcexport_model_versions_loaded", "Versions of a model loaded and served", ["model"],
                            registry=r)

    def on_batch(self, model: str):
        """The Batcher's ``on_batch`` for ``model``: one call's rows, its time, its requests' queueing."""
        batch, compute, queue = (self.batch_size.labels(model), self.compute_time.labels(model),
                                 self.queue_time.labels(model))

        def record(rec) -> None:
            batch.observe(rec.rows)
            compute.observe(rec.seconds)
            for q in rec.queued:
                queue.observe(q)
        return record

    def text(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
