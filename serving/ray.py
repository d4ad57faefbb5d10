"""A Ray Serve deployment of a `.tcpkg` package: replicas that load it, with ``@serve.batch`` merging requests.

    import ray
    from ray import serve
    from tcexport.serving.ray import deployment

    ray.init()
    serve.start(http_options={"host": "127.0.0.1", "port": 8000})
    handle = serve.run(deployment("mlp.tcpkg", name="mlp", num_replicas=2), name="mlp",
                       route_prefix="/v2/models/mlp")
    y = handle.infer.remote({"x": x}).result()["output"]           # Python handle: numpy in, numpy out
    # HTTP, the v2 JSON shape: POST http://127.0.0.1:8000/v2/models/mlp/infer
    #   {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [...]}]}
    # GET http://127.0.0.1:8000/v2/models/mlp is the model's metadata.

Each replica loads the package once; requests reaching it within ``batch_wait_timeout_s`` (up to
``max_batch_size`` requests) are handed together to ``loader.request_runner.RequestRunner``: each checked alone, the good
ones concatenated along the package's batch symbol (never past its range), run as one call in a worker thread (the
loader releases the GIL, the replica's event loop stays free), and split back. A request that breaks a guard, or
whose data cannot be decoded, fails alone: over HTTP a 400 with the typed error's message and fields as JSON,
through a handle the typed error itself (``GuardError`` and its kind). Each replica's loader uses as many threads
as the CPUs Ray reserves for it (``num_cpus``), so replicas on one node do not oversubscribe it.
Needs ``pip install 'tcexport[ray]'``; Ray is imported when this module is.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

from tcexport.formats.errors import TcError
from tcexport.loader.arrays import to_numpy
from tcexport.loader.load import load

from tcexport.loader.request_runner import Outcome, RequestRunner
from .v2_json import V2RequestError, decode_inputs, encode_outputs, error_body, metadata


@serve.deployment
class TcpkgModel:
    """One replica: a loaded package behind ``__call__`` (HTTP), ``infer`` and ``infer_v2`` (handles)."""

    def __init__(self, pkg_path: str, model_name: str, device: str, num_threads: int,
                 max_batch_size: int, batch_wait_timeout_s: float):
        if device == "cpu":
            self.model = load(pkg_path, num_threads=num_threads)
        else:
            self.model = load(pkg_path, device)
        self.name = model_name
        self.manifest = self.model.manifest
        self.runner = RequestRunner(self.model)
        self._batched.set_max_batch_size(max_batch_size)
        self._batched.set_batch_wait_timeout_s(batch_wait_timeout_s)

    async def infer(self, inputs) -> dict:
        """Outputs by name for inputs given by name (a dict) or in manifest order (a list); raises the typed
        error of a bad request."""
        arrays = self._arrays(inputs)
        outcome = await self._batched(arrays)
        if outcome.error is not None:
            raise outcome.error
        return {s.name: a for s, a in zip(self.manifest.outputs, outcome.outputs)}

    async def infer_v2(self, body: dict) -> dict:
        """A v2 JSON request body in, the v2 response body out; raises the typed error of a bad request."""
        outcome = await self._batched(self._decode(body))
        if outcome.error is not None:
            raise outcome.error
        return encode_outputs(outcome.outputs, self.manifest, self.name, _request_id(body))

    async def __call__(self, request: Request) -> JSONResponse:
        """HTTP under the route prefix: ``POST .../infer`` runs the v2 JSON body, ``GET`` gives the metadata."""
        path = request.url.path.rstrip("/")
        if request.method == "GET" and not path.endswith("/infer"):
            if path.endswith("/ready"):
                return JSONResponse({"name": self.name, "ready": True})
            return JSONResponse(metadata(self.manifest, self.name))
        if request.method != "POST" or not path.endswith("/infer"):
            return JSONResponse({"error": f"{request.method} {path}: use POST <prefix>/infer or GET <prefix>"},
                                status_code=404)
        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError) as e:
            return JSONResponse({"error": f"request body is not JSON: {e}", "error_type": "V2RequestError"},
                                status_code=400)
        outcome = await self._batched(self._decode(body))
        if outcome.error is not None:
            status = 400 if isinstance(outcome.error, TcError) else 500
            return JSONResponse(error_body(outcome.error), status_code=status)
        return JSONResponse(encode_outputs(outcome.outputs, self.manifest, self.name, _request_id(body)))

    async def batch_sizes(self) -> dict[int, int]:
        """How many calls this replica ran per row count (a merged batch counts once, at its total rows)."""
        return dict(self.runner.batches)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def _batched(self, requests: list) -> list[Outcome]:
        """Ray's batch of requests (arrays, or the error that decoding one raised), run as few merged calls."""
        return await asyncio.to_thread(self.runner.run, requests)

    def _decode(self, body):
        try:
            return decode_inputs(body, self.manifest)
        except V2RequestError as e:
            return e

    def _arrays(self, inputs) -> list:
        names = [s.name for s in self.manifest.inputs]
        if isinstance(inputs, dict):
            unknown = [k for k in inputs if k not in names]
            missing = [n for n in names if n not in inputs]
            if unknown or missing:
                raise V2RequestError(f"model {self.manifest.model!r} takes inputs {', '.join(names)}; got "
                                     f"{', '.join(inputs) or 'none'}", input=(unknown or missing)[0])
            values = [inputs[n] for n in names]
        else:
            values = list(inputs)
        return [to_numpy(v, names[k] if k < len(names) else f"#{k}") for k, v in enumerate(values)]


def _request_id(body):
    return body.get("id") if isinstance(body, dict) else None


def deployment(pkg_path, *, name: str | None = None, num_replicas: int = 1, max_batch_size: int = 16,
               batch_wait_timeout_s: float = 0.005, num_cpus: float = 1.0, device: str = "cpu",
               num_threads: int | None = None, max_ongoing_requests: int | None = None):
    """A bound Ray Serve application serving ``pkg_path``: pass it to ``serve.run``.

    ``pkg_path`` is opened by each replica, so on a cluster of several nodes it must be a path every node can
    read (shared storage); each replica verifies the package as ``load`` always does.
    ``name``: the deployment's (and the v2 responses') model name, default the file stem. ``num_replicas``
    replicas, each reserving ``num_cpus`` CPUs (and one GPU for ``device`` "cuda"); ``max_batch_size`` requests at
    most per ``@serve.batch`` call, gathered for up to ``batch_wait_timeout_s`` (rows are further capped by the
    batch symbol's range); ``num_threads`` for the loader (default: ``num_cpus``, at least 1);
    ``max_ongoing_requests`` per replica (default: twice ``max_batch_size``, so a replica can fill a batch while
    one runs).
    """
    path = Path(pkg_path).resolve()
    if not path.is_file():
        raise TcError(f"package {str(pkg_path)!r} is not a file; pass the path of a .tcpkg")
    for label, value in (("num_replicas", num_replicas), ("max_batch_size", max_batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TcError(f"{label} should be an integer >= 1, got {value!r}")
    if not batch_wait_timeout_s >= 0:
        raise TcError(f"batch_wait_timeout_s should be >= 0, got {batch_wait_timeout_s!r}")
    name = name or path.stem
    threads = num_threads if num_threads is not None else max(1, int(num_cpus))
    actor = {"num_cpus": num_cpus, **({"num_gpus": 1} if device.startswith("cuda") else {})}
    return TcpkgModel.options(name=name, num_replicas=num_replicas, ray_actor_options=actor,
                              max_ongoing_requests=max_ongoing_requests or 2 * max_batch_size).bind(
        str(path), name, device, threads, max_batch_size, batch_wait_timeout_s)
