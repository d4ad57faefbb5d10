"""Run the app under uvicorn: one process, or ``workers`` processes sharing the port.

SIGTERM (or Ctrl-C) drains: uvicorn stops accepting connections and lets the requests in flight finish (up to
``graceful_seconds``), readiness turns 503 for load balancers meanwhile, then the app's lifespan drains every
model's queue and the process exits 0. With several workers each process loads the packages itself with its
share of the cores (``num_threads`` = cores // workers unless given), so the workers' thread pools do not
oversubscribe the machine; each worker has its own batching queue and its own metrics.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import uvicorn

from tcexport.loader.model import default_num_threads

from .app import create_app
from .metrics import Metrics
from .repository import LoadOptions, Repository

CONFIG_ENV = "TCEXPORT_SERVE_CONFIG"  # how the parent hands its settings to spawned worker processes


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    sources: tuple
    options: LoadOptions
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    poll_seconds: float = 1.0
    max_body_bytes: int = 64 << 20
    graceful_seconds: float = 30.0
    log_level: str = "info"


def build_app(config: ServeConfig, load_model=None):
    """The app for ``config``; ``load_model(path, options)`` replaces the loader as the models' factory (the
    load test serves ONNX Runtime sessions through the same app, repository and Batcher)."""
    metrics = Metrics()
    repository = Repository(list(config.sources), config.options, on_batch=metrics.on_batch,
                            on_versions=lambda name, n: metrics.loaded.labels(name).set(n), load_model=load_model)
    return create_app(repository, metrics, config.max_body_bytes, _version(), config.poll_seconds)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("tcexport")
    except Exception:  # noqa: BLE001 - a source checkout without metadata
        return "0+unknown"


class _Server(uvicorn.Server):
    """uvicorn's server, telling the app it drains as soon as the signal arrives (readiness 503), and exiting 0
    once drained."""

    def __init__(self, config, state):
        super().__init__(config)
        self._state = state

    def handle_exit(self, sig, frame):
        self._state["draining"] = True
        super().handle_exit(sig, frame)
        # uvicorn re-raises the signal once it has shut down (the process then dies of SIGTERM); a drained
        # server has done what SIGTERM asks, so it exits 0 instead
        getattr(self, "_captured_signals", []).clear()


def serve(config: ServeConfig, load_model=None) -> int:
    logging.basicConfig(level=getattr(logging, config.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if config.workers > 1:
        threads = config.options.num_threads or max(1, default_num_threads() // config.workers)
        config = dataclasses.replace(config, options=dataclasses.replace(config.options, num_threads=threads))
        os.environ[CONFIG_ENV] = json.dumps(_to_json(config))
        uvicorn.run("tcexport.serving.server:worker_app", factory=True, host=config.host, port=config.port,
                    workers=config.workers, log_level=config.log_level,
                    timeout_graceful_shutdown=int(config.graceful_seconds))
        return 0
    app = build_app(config, load_model)
    server = _Server(uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level,
                                    timeout_graceful_shutdown=int(config.graceful_seconds)), app.state.serving)
    server.run()
    return 0 if server.started else 3


def worker_app():
    """A worker process's app (uvicorn's factory), from the settings the parent put in the environment."""
    return build_app(_from_json(json.loads(os.environ[CONFIG_ENV])))


def _to_json(config: ServeConfig) -> dict:
    d = dataclasses.asdict(config)
    d["sources"] = [str(s) for s in config.sources]
    d["options"]["trusted_keys"] = [str(k) for k in config.options.trusted_keys]
    return d


def _from_json(d: dict) -> ServeConfig:
    raw = d.pop("options")
    raw["trusted_keys"] = tuple(raw["trusted_keys"])
    return ServeConfig(**{**d, "sources": tuple(d["sources"]), "options": LoadOptions(**raw)})
