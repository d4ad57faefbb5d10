"""Run one backend's measurement in a fresh process with a deadline.

A fresh process per backend keeps thread pools that other backends left behind (torch's OpenMP team, ONNX Runtime's
spinning workers) from taking cores from the one being timed. The deadline keeps one hung or endless backend (a
max-autotune search, a compile that never ends) from eating a suite run: past it, the process and everything it
started (compile workers, cold-start processes; they share its process group) are killed and the row says so.
"""

from __future__ import annotations

import multiprocessing
import os
import signal


def _child(conn, fn, args) -> None:
    os.setpgrp()  # its own process group: a timeout ends it and the processes it started, nothing else
    try:
        conn.send(fn(*args))
    finally:
        conn.close()


def _kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def run_isolated(fn, args: tuple, seconds: float) -> dict:
    """``fn(*args)`` (which returns a picklable row dict) in a spawned process; a row with ``error`` (and
    ``timed_out``) when it runs past ``seconds`` or dies before answering."""
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, fn, args), daemon=False)
    proc.start()
    send.close()
    try:
        if recv.poll(seconds):
            try:
                row = recv.recv()
            except EOFError:  # the child died without answering (a crash in native code)
                proc.join(30)
                return {"latency": {}, "error": f"process: died with exit code {proc.exitcode} before answering"}
            proc.join(60)  # it answered; a child that then hangs at exit is killed below
            return row
        return {"latency": {}, "timed_out": True,
                "error": f"timeout: still running after {seconds / 60:.1f} min (--max-minutes-per-backend); killed"}
    finally:
        if proc.is_alive():
            _kill_group(proc)
            proc.join(30)
        recv.close()
