"""Probe (`python -m bench.gpu_call_overhead_probe` on a GPU machine, after `python -m bench.gpu_gpt2` has left
/tmp/gpt2.tcpkg): what a call costs beyond its kernels. For GPT-2 small it times the call with the index check
(the default: waiting for the copy of the error word that the graph makes after its last index-reading kernel;
or, after the whole graph, waiting on the stream, on an event, or by polling the event) and without it. It also times the host's phases
before the graph launch: binding and guards, output allocation, and the replay itself; and the graph replayed
alone (the GPU floor of a call), with programmatic and with ordinary edges between its kernels.
Results: bench/results/*-gpt2-b8-where-time-goes.md."""
import time, sys, os
sys.path.insert(0, os.getcwd())
import torch
import tcexport.loader as L
from tcexport.loader.native_cuda import check
from bench.models import get
bm = get("gpt2-small")
def timed(fn, n=60):
    for _ in range(5): fn()
    torch.cuda.synchronize(); ts = []
    for _ in range(n):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
    ts.sort(); return ts[len(ts) // 2] * 1e3
model = L.load("/tmp/gpt2.tcpkg", device="cuda")
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
    while int(cu.cuEventQuery(ev)[0]) != 0: pass
def none(stream, kernels=None, probed=False): pass
for batch in (1, 8):
    (ids,) = bm.inputs(batch); ids = ids.cuda()
    for name, fn in (("early", orig), ("stream-sync", full_wait), ("event-sync", via_event), ("poll", via_poll),
                     ("no check", none), ("early", orig)):
        model._raise_on_bad_index = fn
        t = timed(lambda: model(ids))
        t0 = time.perf_counter()
        for _ in range(30): model(ids)
        torch.cuda.synchronize(); host = (time.perf_counter() - t0) / 30 * 1e6
        print(f"batch {batch} {name:12s} call {t:7.1f} us (events); loop of calls {host:7.1f} us/call", flush=True)
    model._raise_on_bad_index = none
    out = torch.empty(batch, 128, 50257, dtype=torch.bfloat16, device="cuda")
    # where the Python side goes (check off): phases timed on the host
    ph = {"bind": 0.0, "outputs": 0.0, "graph": 0.0}
    for _ in range(200):
        t0 = time.perf_counter(); values, metas, env, stream = model._bind((ids,), {}, None)
        t1 = time.perf_counter(); outs = model._new_outputs(values, env); ptrs = [o.data_ptr() for o in outs]
        t2 = time.perf_counter(); model._run_graph(metas, ptrs, env, stream)
        t3 = time.perf_counter(); ph["bind"] += t1 - t0; ph["outputs"] += t2 - t1; ph["graph"] += t3 - t2
        torch.cuda.synchronize()
    print(f"batch {batch} host phases (us): " + ", ".join(f"{k} {v / 200 * 1e6:.1f}" for k, v in ph.items()), flush=True)
    # the graph replayed alone, with no Python before it: the GPU floor of a call (bare replay), and the same
    # with ordinary edges between the kernels instead of programmatic ones (each kernel starts after the last)
    g = model._graph_cache[(tuple(ids.shape),)]
    stream = torch.cuda.current_stream().cuda_stream
    bare = timed(lambda: model.device.graph_launch(g.graph_exec, stream))
    ordered = L.load("/tmp/gpt2.tcpkg", device="cuda", dependent_launch=False)
    ordered(ids)
    og = ordered._graph_cache[(tuple(ids.shape),)]
    bare_ordered = timed(lambda: ordered.device.graph_launch(og.graph_exec, stream))
    print(f"batch {batch} bare replay {bare:7.1f} us, with ordinary edges {bare_ordered:7.1f} us", flush=True)
    ordered.close()
