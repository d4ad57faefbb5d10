"""The HTTP face of `tcpkg serve`: the KServe / Open Inference Protocol v2 routes as a Starlette ASGI app.

Every request's failure is its own: a body that cannot be read, inputs that break a guard, an index out of range
inside a kernel are 4xx answers with the typed error's message and fields (input, dim, symbol, expected, got);
nothing a client sends reaches past its own response. Error bodies name the model, never a file on the server.
Inference runs on the model's Batcher (loader/batcher.py) through ``await``, so the event loop never blocks on a
call and concurrent requests merge along the batch symbol.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tcexport.formats.errors import GuardError, RuntimeKernelError, TcError
from tcexport.loader.batcher import BatcherClosedError

from .metrics import Metrics
from .repository import Repository, UnknownModelError
from .v2_binary import HEADER, decode_inputs, encode_response, split_body, wants_binary
from .v2_json import V2RequestError, error_body, metadata

log = logging.getLogger("tcexport.serving")
_ABSOLUTE_PATH = re.compile(r"(?<![\w.])(/[^\s:'\"]*/)([^/\s:'\"]+)")
SERVER_NAME = "tcexport"


class BodyTooLarge(TcError):
    exit_code = 5


def create_app(repository: Repository, metrics: Metrics, max_body_bytes: int, version: str,
               poll_seconds: float = 1.0) -> Starlette:
    """The app; its lifespan starts the repository (first scan, then polling) and, at shutdown, after the
    server stopped taking requests and finished those in flight, drains every model's queue."""
    state = {"draining": False}

    async def live(request: Request):
        return JSONResponse({"live": True})

    async def ready(request: Request):
        ok = not state["draining"] and bool(repository.names())
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    async def server_metadata(request: Request):
        return JSONResponse({"name": SERVER_NAME, "version": version, "extensions": ["binary_tensor_data"]})

    async def model_metadata(request: Request):
        name, v = request.path_params["name"], request.path_params.get("version")
        try:
            entry = repository.get(name, v)
        except UnknownModelError as e:
            return JSONResponse(error_body(e), status_code=404)
        body = metadata(entry.model.manifest, name)
        body["versions"] = sorted(repository.versions(name), key=int)
        body["version"] = entry.version
        return JSONResponse(body)

    async def model_ready(request: Request):
        try:
            repository.get(request.path_params["name"], request.path_params.get("version"))
        except UnknownModelError as e:
            return JSONResponse(error_body(e), status_code=404)
        return JSONResponse({"ready": True})

    infer = _infer_handler(repository, metrics, max_body_bytes)

    async def prometheus(request: Request):
        for name in repository.names():
            metrics.queue_depth.labels(name).set(sum(v.batcher.pending for v in repository.versions(name).values()))
        body, content_type = metrics.text()
        return Response(body, media_type=content_type)

    routes = [
        Route("/v2/health/live", live), Route("/v2/health/ready", ready), Route("/v2", server_metadata),
        Route("/v2/models/{name}", model_metadata), Route("/v2/models/{name}/versions/{version}", model_metadata),
        Route("/v2/models/{name}/ready", model_ready),
        Route("/v2/models/{name}/versions/{version}/ready", model_ready),
        Route("/v2/models/{name}/infer", infer, methods=["POST"]),
        Route("/v2/models/{name}/versions/{version}/infer", infer, methods=["POST"]),
        Route("/metrics", prometheus),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(app):
        repository.start(poll_seconds)
        if not repository.names():
            raise TcError("no package could be loaded (the log says why); the server does not start empty")
        yield
        state["draining"] = True
        repository.close()

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.serving = state  # the server flips "draining" on SIGTERM, so /v2/health/ready turns 503
    return app


def _infer_handler(repository: Repository, metrics: Metrics, max_body_bytes: int):
    """POST .../infer: decode, run on the version's Batcher, encode; every failure is this request's answer."""

    async def infer(request: Request):
        started = time.perf_counter()
        name = request.path_params["name"]
        status, version = 500, request.path_params.get("version") or "latest"
        try:
            entry = repository.get(name, request.path_params.get("version"))
            version = entry.version
            header, binary = split_body(await _body(request, max_body_bytes), request.headers.get(HEADER))
            arrays = decode_inputs(header, binary, entry.model.manifest)
            outputs = await entry.batcher.infer(*arrays)
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            every, named = wants_binary(header)
            content, headers = encode_response(outputs, entry.model.manifest, name, version, header.get("id"),
                                               every, named)
            status = 200
            return Response(content, status_code=200, headers=headers,
                            media_type="application/octet-stream" if headers else "application/json")
        except Exception as e:  # noqa: BLE001 - every failure is this request's answer, never the server's
            status = _status(e)
            if status >= 500:
                log.exception("request to %s failed", name)
            return JSONResponse(_public_error(e, status), status_code=status)
        finally:
            metrics.requests.labels(name, version, str(status)).inc()
            metrics.latency.labels(name).observe(time.perf_counter() - started)

    return infer


async def _body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body of {declared} bytes is over this server's limit of {limit} bytes "
                           "(--max-body-mb); send fewer rows per request")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body is over this server's limit of {limit} bytes (--max-body-mb); "
                               "send fewer rows per request")
        chunks.append(chunk)
    return b"".join(chunks)


def _status(e: Exception) -> int:
    if isinstance(e, UnknownModelError):
        return 404
    if isinstance(e, BodyTooLarge):
        return 413
    if isinstance(e, (V2RequestError, GuardError, RuntimeKernelError)):
        return 400  # the request's own inputs: a guard, or data a kernel refused (an index out of range)
    if isinstance(e, BatcherClosedError):
        return 503  # the version was retired between lookup and queueing: the client retries
    return 500


def _public_error(e: Exception, status: int) -> dict:
    """The error body; a server-side failure says what failed but not the server's paths or internals, and
    any absolute path in a message (the package's, or the model file's on the build machine) keeps only its
    file name."""
    if status < 500:
        body = error_body(e)
        body["error"] = _ABSOLUTE_PATH.sub(lambda m: m.group(2), body["error"])
        return body
    return {"error": f"the server could not run this request ({type(e).__name__}); its log has the details",
            "error_type": type(e).__name__}
