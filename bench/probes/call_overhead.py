"""Probe (`python -m bench.probes.call_overhead [--package GPT2.tcpkg]` on a GPU machine): what a call costs beyond
its kernels. For GPT-2 small bf16 (the package given, e.g. the one `python -m bench.probes.gpt2` leaves in its
work folder, or one exported here) it times the call with the index check (the default: waiting for the copy of
the error word that the graph makes after its last index-reading kernel; or, after the whole graph, waiting on the
stream, on an event, or by polling the event) and without it. It also times the host's phases before the graph
launch: binding and guards, then the replay (up to its first graph launch, and in all, which includes the output
allocation and the launch calls); the graph replayed alone (the GPU floor of a call), with programmatic and with
ordinary edges between its kernels; and one launch call through cuda-bindings and through ctypes.

The check variants and the phase timer replace methods of the one loaded model they measure (its
``_raise_on_bad_index``, its device's ``graph_launch``), and put them back; nothing else is changed.

Results: bench/results/nvidia-h200-2026-11-29-gpt2-b8-where-time-goes.md,
bench/results/nvidia-h200-2026-11-30-late-gpt2-call-path.md."""
from __future__ import annotations

import time
from pathlib import Path

from bench.probes.common import export_gpt2, parser, require_gpu, work_folder


def timed(fn) -> float:
    """us a call, as the harness times it: CUDA events, median of 60."""
    from bench.run import time_calls

    return time_calls(fn, (), "cuda", min_calls=60, min_seconds=0)["median_ms"] * 1e3


def no_check(stream, kernels=None, probed=False):
    """A call that does not wait for its index check."""


def check_variants(model):
    """The ways a call can wait for its index check, as replacements of ``model._raise_on_bad_index``."""
    from tcexport.loader.native_cuda import check

    cu = model.device.cu
    ev = check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "ev")
    orig = model._raise_on_bad_index

    def full_wait(stream, kernels=None, probed=False):  # a queued copy after the whole graph, then a stream wait
        orig(stream, kernels)

    def via_event(stream, kernels=None, probed=False):
        model.device.download_async(model._error_host, model._error, 4, stream)
        check(cu.cuEventRecord(ev, stream), "rec"); check(cu.cuEventSynchronize(ev), "sync")

    def via_poll(stream, kernels=None, probed=False):
        model.device.download_async(model._error_host, model._error, 4, stream)
        check(cu.cuEventRecord(ev, stream), "rec")
        while int(cu.cuEventQuery(ev)[0]) != 0:
            pass

    return (("early", orig), ("stream-sync", full_wait), ("event-sync", via_event), ("poll", via_poll),
            ("no check", no_check), ("early", orig))


def time_checks(model, ids, batch: int) -> None:
    import torch

    orig = model._raise_on_bad_index
    try:
        for name, fn in check_variants(model):
            model._raise_on_bad_index = fn
            t = timed(lambda: model(ids))
            t0 = time.perf_counter()
            for _ in range(30):
                model(ids)
            torch.cuda.synchronize()
            host = (time.perf_counter() - t0) / 30 * 1e6
            print(f"batch {batch} {name:12s} call {t:7.1f} us (events); loop of calls {host:7.1f} us/call", flush=True)
    finally:
        model._raise_on_bad_index = orig


def host_phases(model, ids, batch: int) -> None:
    """Where the Python side goes (check off), timed on the host. The replay launches the graph's first part,
    allocates the outputs while it runs, then launches the part that writes them (the CUDA loader's graph)."""
    import torch

    launch = model.device.graph_launch
    ph = {"bind": 0.0, "until first launch": 0.0, "replay": 0.0, "graph launch calls": 0.0}
    for _ in range(200):
        marks = []

        def timed_launch(graph_exec, stream_):
            t = time.perf_counter(); launch(graph_exec, stream_); marks.append((t, time.perf_counter()))
        model.device.graph_launch = timed_launch
        try:
            t0 = time.perf_counter(); values, metas, env, stream = model._bind((ids,), {}, None)
            t1 = time.perf_counter(); model._run_graph(values, metas, env, stream)
            t2 = time.perf_counter()
        finally:
            model.device.graph_launch = launch
        ph["bind"] += t1 - t0; ph["until first launch"] += marks[0][0] - t1; ph["replay"] += t2 - t1
        ph["graph launch calls"] += sum(b - a for a, b in marks)
        torch.cuda.synchronize()
    print(f"batch {batch} host phases (us): " + ", ".join(f"{k} {v / 200 * 1e6:.1f}" for k, v in ph.items()) +
          f"; graph parts {len(model._graph_cache[(tuple(ids.shape),)].parts)}", flush=True)


def bare_replays(model, path: Path, ids, batch: int) -> None:
    """The graph replayed alone, with no Python before it: the GPU floor of a call (bare replay), and the same with
    ordinary edges between the kernels instead of programmatic ones (each kernel starts after the last)."""
    import torch

    import tcexport.loader as L

    stream = torch.cuda.current_stream().cuda_stream

    def replay(m):
        g = m._graph_cache[(tuple(ids.shape),)]
        return lambda: [m.device.graph_launch(p.graph_exec, stream) for p in g.parts]
    bare = timed(replay(model))
    ordered = L.load(path, device="cuda", dependent_launch=False)
    ordered(ids)
    bare_ordered = timed(replay(ordered))
    print(f"batch {batch} bare replay {bare:7.1f} us, with ordinary edges {bare_ordered:7.1f} us", flush=True)
    ordered.close()


def launch_call(model, ids, batch: int) -> None:
    """The host cost of one graph launch call: through cuda-bindings (what the loader does) and into libcuda."""
    import ctypes

    import torch

    stream = torch.cuda.current_stream().cuda_stream
    raw = ctypes.CDLL("libcuda.so.1").cuGraphLaunch
    raw.argtypes, raw.restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
    ge = model._graph_cache[(tuple(ids.shape),)].parts[-1].graph_exec
    for name, fn in (("cuda-bindings", lambda: model.device.graph_launch(ge, stream)),
                     ("ctypes", lambda: raw(int(ge), stream))):
        torch.cuda.synchronize(); spent = 0.0
        for _ in range(20):
            t = time.perf_counter(); fn(); spent += time.perf_counter() - t
        torch.cuda.synchronize()
        print(f"batch {batch} graph launch call through {name}: {spent / 20 * 1e6:.1f} us", flush=True)


def main(argv=None):
    p = parser(__doc__, work=True)
    p.add_argument("--package", type=Path, help="GPT-2 small bf16 for sm_90 (default: exported into --work)")
    args = p.parse_args(argv)
    require_gpu()
    import tcexport.loader as L
    from bench.models import get

    if args.package:
        path = args.package
    else:
        work = work_folder(args)
        path = export_gpt2(work / "gpt2.tcpkg", work / "cache")
    model = L.load(path, device="cuda")
    bm = get("gpt2-small")
    for batch in (1, 8):
        (ids,) = bm.inputs(batch)
        ids = ids.cuda()
        time_checks(model, ids, batch)
        orig = model._raise_on_bad_index
        model._raise_on_bad_index = no_check  # the host phases and replays without the check
        try:
            host_phases(model, ids, batch)
            bare_replays(model, path, ids, batch)
            launch_call(model, ids, batch)
        finally:
            model._raise_on_bad_index = orig


if __name__ == "__main__":
    main()
