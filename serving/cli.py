"""`tcpkg serve PKG_OR_REPO... [--host H] [--port P] [--max-batch N] [--max-delay-ms T] [--device D] [--workers K]`.

`tcpkg` hands `serve` here (the ``tcpkg.commands`` entry point); ``python -m tcexport.serving`` is the same.
Without the ``[serve]`` extra it says what to install instead of failing on an import.
"""

from __future__ import annotations

import argparse
import sys

MISSING = "tcpkg serve needs the serving extra: pip install 'tcexport[serve]' (missing: {})"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tcpkg serve", description="Serve .tcpkg packages over HTTP with the KServe / "
                                "Open Inference Protocol v2 (JSON and binary tensors), dynamic batching, "
                                "Prometheus metrics at /metrics, and hot reload of new versions.")
    p.add_argument("sources", nargs="+", metavar="PKG_OR_REPO",
                   help="a .tcpkg file (served under its file stem) or a repository REPO/<model>/<version>/model.tcpkg")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--max-batch", type=int, default=None, help="most rows one merged call carries (default: the "
                   "batch symbol's upper bound)")
    p.add_argument("--max-delay-ms", type=float, default=0.0, help="how long a request may wait for others to "
                   "merge with (default 0: no waiting; requests that queue while a call runs merge anyway)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--workers", type=int, default=1, help="server processes sharing the port, each with its share "
                   "of the cores (default 1)")
    p.add_argument("--threads", type=int, default=None, help="kernel threads per model (default: the CPUs this "
                   "process may use, divided among the workers)")
    p.add_argument("--poll-seconds", type=float, default=1.0, help="how often repositories are checked for new "
                   "versions (default 1; 0 turns hot reload off)")
    p.add_argument("--max-body-mb", type=float, default=64.0, help="largest request body accepted (default 64)")
    p.add_argument("--trusted-key", action="append", default=[], help="require packages signed by this ed25519 "
                   "public key (PEM; repeatable)")
    p.add_argument("--graceful-seconds", type=float, default=30.0, help="on SIGTERM, how long requests in flight "
                   "may take to finish (default 30)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        import prometheus_client  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        print(MISSING.format(e.name), file=sys.stderr)
        return 2
    from tcexport.formats.errors import TcError

    from .repository import LoadOptions
    from .server import ServeConfig, serve

    for flag, value, low in (("--workers", args.workers, 1), ("--max-batch", args.max_batch, 1)):
        if value is not None and value < low:
            print(f"error: {flag} should be >= {low}, got {value}", file=sys.stderr)
            return 2
    options = LoadOptions(device=args.device, num_threads=args.threads, max_batch=args.max_batch,
                          max_delay_ms=args.max_delay_ms, trusted_keys=tuple(args.trusted_key))
    config = ServeConfig(tuple(args.sources), options, args.host, args.port, args.workers, args.poll_seconds,
                         int(args.max_body_mb * (1 << 20)), args.graceful_seconds, args.log_level)
    try:
        return serve(config)
    except TcError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
