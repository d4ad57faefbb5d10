"""LLM decode and prefill with a static KV cache: tcpkg side by side with transformers eager and torch.compile.

    python -m bench.decode --device cuda --models gpt2 llama --contexts 128 1024 --batch 1
    python -m bench.decode --device cpu --models gpt2 llama --size small --threads 2

Every backend runs the same module: examples/lm_cache.py's ``CachedLM`` (transformers'
``TorchExportableModuleWithStaticCache`` over GPT-2 or a Llama-style model, random weights), eager, under
``torch.compile`` (``mode="reduce-overhead"`` on the GPU, transformers' documented fast path for a static cache;
the default mode on the CPU), on the CPU through ONNX Runtime (the cache as inputs and outputs), and exported as a
stateful package. A decode step is one token at cache position
``context``; prefill is ``context`` tokens from position 0. Latency is the median of timed calls after warm-up.
The memory floor of a decode step is the bytes it must read at least once (every weight, and the keys and values
of the filled context) over the bandwidth of a large copy measured in the same run. Results go to
bench/results/<machine>-<date>-decode.{md,json}.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import time
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def load_lm_file(kind: str, size: str, cache: int, batch: int):
    """examples/lm_cache.py, configured through its environment variables for this one import."""
    os.environ.update(TCEXPORT_LM=kind, TCEXPORT_LM_SIZE=size, TCEXPORT_LM_CACHE=str(cache),
                      TCEXPORT_LM_BATCH=str(batch))
    spec = importlib.util.spec_from_file_location(f"lm_cache_{kind}_{size}_{cache}_{batch}",
                                                  ROOT / "examples" / "lm_cache.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def timed(fn, device: str, warmup: int, runs: int) -> float:
    """Median milliseconds of ``runs`` calls after ``warmup``."""
    for _ in range(warmup):
        fn()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def cache_bytes(cfg, batch: int, context: int, itemsize: int) -> int:
    layers = getattr(cfg, "num_hidden_layers", None) or cfg.n_layer
    heads = getattr(cfg, "num_key_value_heads", None) or getattr(cfg, "n_head", None)
    hidden = getattr(cfg, "hidden_size", None) or cfg.n_embd
    head_dim = hidden // (getattr(cfg, "num_attention_heads", None) or cfg.n_head)
    return 2 * layers * batch * heads * head_dim * context * itemsize


def unique_weight_bytes(module: torch.nn.Module) -> int:
    seen, total = set(), 0
    for p in list(module.parameters()):
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def run_model(kind: str, args, peaks: dict, rows: list, notes: list, profiles: list) -> None:
    device, dtype = args.device, DTYPES[args.dtype]
    cache = max(args.contexts) + 64
    file = load_lm_file(kind, args.size, cache, args.batch)
    module = file.model(device, dtype).eval()
    start = {n: b.detach().clone() for n, b in module.named_buffers()}
    cfg = module.lm.model.config
    wbytes = unique_weight_bytes(module)
    itemsize = torch.empty((), dtype=dtype).element_size()
    b = args.batch
    tok = lambda n: torch.randint(0, cfg.vocab_size, (b, n), device=device)  # noqa: E731

    backends = {}
    eager = lambda ids, pos: module(ids, pos)  # noqa: E731
    backends["eager"] = eager
    try:
        mode = "reduce-overhead" if device == "cuda" else "default"
        compiled = torch.compile(module, mode=mode)
        backends[f"torch.compile({mode})"] = lambda ids, pos: compiled(ids, pos)
    except Exception as e:  # noqa: BLE001 - a backend that fails is labelled, not fatal
        notes.append(f"{kind}: torch.compile failed: {type(e).__name__}: {e}")
    if device == "cpu":
        try:
            backends["onnxruntime"] = onnx_backend(file, args)
        except Exception as e:  # noqa: BLE001
            notes.append(f"{kind}: onnxruntime failed: {type(e).__name__}: {str(e)[:300]}")
    pkg_path, sessions = None, {}
    variants = {"tcpkg": None}  # label: CudaOptions (None: the defaults), a package each, side by side
    for label, options in variants.items():
        try:
            t0 = time.perf_counter()
            path = export_package(file, kind, args, cache, options)
            pkg_path = pkg_path or path
            notes.append(f"{kind}: export {time.perf_counter() - t0:.0f} s -> {path.name}")
            from tcexport.loader import load

            lm = load(path, device=device, num_threads=args.threads) if device == "cpu" else load(path, device)
            session = sessions[label] = lm.new_session()
            backends[label] = (lambda ids, pos, s=session: s(ids, pos)) if device == "cuda" else \
                (lambda ids, pos, s=session: torch.from_numpy(np.asarray(s(ids.numpy(), pos.numpy()))))
        except Exception as e:  # noqa: BLE001
            notes.append(f"{kind}: {label} failed: {type(e).__name__}: {str(e)[:300]}")
            traceback.print_exc()

    # accuracy: one prompt then one decode step, each backend from an empty cache, against eager in float32
    with torch.no_grad():
        reference = file.model(device, torch.float32).eval()
        prompt, step = tok(8), tok(1)
        pos0, pos1 = torch.arange(8, device=device), torch.tensor([8], device=device)
        reference(prompt, pos0)
        want = reference(step, pos1).float()
        scale = float(want.abs().max())
        for name, fn in backends.items():
            try:
                if name in sessions:
                    sessions[name].reset_state()
                elif name == "onnxruntime":
                    fn.reset()
                else:  # the cache back to its start (not every buffer: RoPE's inv_freq is one too)
                    for buf_name, buf in module.named_buffers():
                        buf.copy_(start[buf_name])
                fn(prompt, pos0)
                got = fn(step, pos1).float()
                err = float((got - want).abs().max()) / scale
                rows.append(dict(model=kind, backend=name, phase="accuracy", context=8, batch=b, ms=None,
                                 error=err))
            except Exception as e:  # noqa: BLE001
                notes.append(f"{kind}: {name} accuracy failed: {type(e).__name__}: {str(e)[:200]}")
        del reference

    for context in args.contexts:
        floor_bytes = wbytes + cache_bytes(cfg, b, context + 1, itemsize)
        floor = floor_bytes / peaks["copy_bytes_per_s"] * 1e3
        for name, fn in list(backends.items()):
            ids, pos = tok(1), torch.tensor([context], device=device)
            try:
                with torch.no_grad():
                    ms = timed(lambda: fn(ids, pos), device, args.warmup, args.runs)
                rows.append(dict(model=kind, backend=name, phase="decode", context=context, batch=b, ms=ms,
                                 floor_ms=floor, floor_bytes=floor_bytes))
            except Exception as e:  # noqa: BLE001
                notes.append(f"{kind}: {name} decode at {context} failed: {type(e).__name__}: {str(e)[:200]}")
                rows.append(dict(model=kind, backend=name, phase="decode", context=context, batch=b, ms=None,
                                 failed=type(e).__name__))
        if args.prefill:
            for name, fn in list(backends.items()):
                ids, pos = tok(context), torch.arange(context, device=device)
                try:
                    with torch.no_grad():
                        ms = timed(lambda: fn(ids, pos), device, max(2, args.warmup // 4), max(3, args.runs // 8))
                    rows.append(dict(model=kind, backend=name, phase="prefill", context=context, batch=b, ms=ms))
                except Exception as e:  # noqa: BLE001
                    notes.append(f"{kind}: {name} prefill {context} failed: {type(e).__name__}: {str(e)[:200]}")
                    rows.append(dict(model=kind, backend=name, phase="prefill", context=context, batch=b, ms=None,
                                     failed=type(e).__name__))


    if args.profile and device == "cuda":
        profile_decode(kind, backends, pkg_path, tok, max(args.contexts), notes, profiles)
        if args.prefill:
            for context in sorted({min(args.contexts), max(args.contexts)}):
                profile_decode(kind, backends, pkg_path, tok, context, notes, profiles, prefill=True)


def profile_decode(kind: str, backends: dict, pkg_path, tok, context: int, notes: list, profiles: list,
                   prefill: bool = False) -> None:
    """Where a decode step's time goes (``prefill``: a prefill of ``context`` tokens): each backend's kernels
    under torch.profiler (count, total, by kind, the largest), beside its measured latency. tcpkg is loaded again
    without CUDA graphs so that each kernel shows under its own name; the gap between the kernel total and the
    latency is launch and host time. ``profiles`` gains each backend's time per kernel (the results' json)."""
    from tcexport.loader import load

    runs = dict(backends)
    if pkg_path is not None:
        direct = load(pkg_path, "cuda", graphs=False).new_session()
        runs["tcpkg (kernels)"] = lambda ids, pos: direct(ids, pos)
    ids, pos = (tok(context), torch.arange(context, device="cuda")) if prefill else \
        (tok(1), torch.tensor([context], device="cuda"))
    what = f"a prefill of {context} tokens" if prefill else f"the decode step at context {context}"
    for name, fn in runs.items():
        if name == "eager":
            continue
        try:
            summary, us = kernel_profile(lambda: fn(ids, pos))
            notes.append(f"{kind}: where {what} goes, {name}: {summary}")
            profiles.append(dict(model=kind, backend=name, phase="prefill" if prefill else "decode",
                                 context=context, us=dict(sorted(us.items(), key=lambda kv: -kv[1]))))
        except Exception as e:  # noqa: BLE001
            notes.append(f"{kind}: profiling {name} failed: {type(e).__name__}: {str(e)[:200]}")


def kernel_profile(fn, calls: int = 5) -> tuple[str, dict]:
    """``fn``'s GPU kernels per call: a summary (how many, their total time, the time by kind and the five
    largest) and the microseconds of each kernel."""
    import collections
    import re

    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
    events = [e for e in p.key_averages() if "cuda" in str(getattr(e, "device_type", "")).lower()
              and (getattr(e, "device_time_total", 0) or getattr(e, "cuda_time_total", 0))]
    us = {e.key: (getattr(e, "device_time_total", 0) or getattr(e, "cuda_time_total", 0)) / calls for e in events}
    count = sum(e.count for e in events) / calls
    kinds, per_kind = collections.defaultdict(float), collections.Counter()
    for e in events:
        words = re.findall(r"[A-Za-z0-9]+", re.sub(r"^k\d+_", "", e.key))  # ours: k12_gemm_epilogue
        kind = "_".join(words[:2]) or e.key
        kinds[kind] += us[e.key]
        per_kind[kind] += e.count / calls
    top = sorted(us.items(), key=lambda kv: -kv[1])[:5]
    return (f"{count:.0f} kernels, {sum(us.values()):.0f} us; by kind "
            + ", ".join(f"{k} {v:.0f} us ({per_kind[k]:.0f})" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
            + "; largest " + ", ".join(f"{k[:48]} {v:.1f} us" for k, v in top)), us


class OnnxDecoder:
    """ONNX Runtime over the same program with its cache as inputs and outputs (how ORT serves a KV cache): the
    functional program torch.export makes (the buffers' writes as outputs) exported to ONNX; each call feeds the
    state the last call returned."""

    def __init__(self, path: Path, state: list, threads: int):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.names = [i.name for i in self.session.get_inputs()]
        self.initial = [s.detach().numpy().copy() for s in state]
        self.reset()

    def reset(self) -> None:
        self.state = [s.copy() for s in self.initial]

    def __call__(self, ids, pos):
        outs = self.session.run(None, dict(zip(self.names, [ids.numpy(), pos.numpy()] + self.state)))
        self.state = outs[1:]
        return torch.from_numpy(outs[0])


def onnx_backend(file, args) -> OnnxDecoder:
    from torch.export.graph_signature import InputKind, OutputKind

    from tcexport.exporter.front.state import lift_buffer_aliases

    module = file.model("cpu", DTYPES[args.dtype]).eval()
    ids, pos = file.example_inputs()
    seq = torch.export.Dim("seq", min=1, max=file.CACHE)
    shapes = {"input_ids": {1: seq}, "cache_position": {0: seq}}
    ep = torch.export.export(module, (ids, pos), dynamic_shapes=shapes, strict=False)
    lift_buffer_aliases(ep, module)
    ep = ep.run_decompositions()
    sig = ep.graph_signature
    names = [s.target for s in sig.output_specs if s.kind == OutputKind.BUFFER_MUTATION]
    value = lambda t: ep.state_dict[t] if t in ep.state_dict else ep.constants[t]  # noqa: E731

    class Functional(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gm, self.kinds = ep.graph_module, []
            for s in sig.input_specs:
                if s.kind == InputKind.USER_INPUT:
                    self.kinds.append(("user", None))
                elif s.kind == InputKind.BUFFER and s.target in names:
                    self.kinds.append(("state", names.index(s.target)))
                else:
                    self.register_buffer(f"c{len(self.kinds)}", value(s.target).detach().clone())
                    self.kinds.append(("const", f"c{len(self.kinds)}"))

        def run(self, ids, pos, state):
            user = iter([ids, pos])
            outs = self.gm(*[next(user) if kind == "user" else state[k] if kind == "state" else getattr(self, k)
                             for kind, k in self.kinds])
            return (outs[len(names)],) + tuple(outs[:len(names)])

    # torch.onnx wants one named argument per state (a list argument is flattened when it checks the export)
    arg_names = ", ".join(f"s{i}" for i in range(len(names)))
    scope: dict = {}
    exec(f"def forward(self, input_ids, cache_position, {arg_names}):\n"
         f"    return self.run(input_ids, cache_position, [{arg_names}])", scope)
    Functional.forward = scope["forward"]
    state = [value(n).detach().clone() for n in names]
    path = Path(args.work) / f"{file.KIND}-{args.size}-{args.dtype}-c{file.CACHE}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(Functional(), (ids, pos, *state), dynamo=True,
                      dynamic_shapes={**shapes, **{f"s{i}": None for i in range(len(names))}}).save(str(path))
    return OnnxDecoder(path, state, args.threads)


def export_package(file, kind: str, args, cache: int, options=None) -> Path:
    from tcexport.exporter.pipeline import export

    out = Path(args.work) / f"{kind}-{args.size}-{args.dtype}-c{cache}-b{args.batch}-{args.device}.tcpkg"
    if out.exists() and not args.rebuild:
        return out
    module = file.model("cpu", DTYPES[args.dtype]).eval()
    target = "cpu" if args.device == "cpu" else f"cuda:sm_{torch.cuda.get_device_capability()[0]}" \
        f"{torch.cuda.get_device_capability()[1]}"
    ids, pos = torch.randint(0, 100, (args.batch, 3)), torch.arange(3)
    pkg = export(module, (ids, pos), file.dynamic_shapes, target, name=f"{kind}-decode", cuda_options=options)
    out.parent.mkdir(parents=True, exist_ok=True)
    pkg.save(out)
    return out


def report(rows: list, notes: list, peaks: dict, args) -> str:
    lines = [f"# LLM decode and prefill with a static KV cache ({args.device}, {args.dtype}, batch {args.batch}, "
             f"size {args.size})", "",
             f"`python -m bench.decode --device {args.device} --models {' '.join(args.models)} --contexts "
             f"{' '.join(map(str, args.contexts))} --batch {args.batch} --size {args.size} --dtype {args.dtype}`", "",
             f"Measured bandwidth {peaks['copy_bytes_per_s'] / 1e9:.0f} GB/s (a large copy, this run). Median of "
             f"{args.runs} calls after {args.warmup} warm-up calls. `vs compile`: tcpkg's latency over "
             "torch.compile's (lower is better).", ""]
    by = {(r["model"], r["backend"], r["phase"], r["context"]): r for r in rows}
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    compiled = next((b for b in backends if b.startswith("torch.compile")), None)
    for phase in ("decode", "prefill"):
        ctxs = sorted({r["context"] for r in rows if r["phase"] == phase})
        if not ctxs:
            continue
        lines += [f"## {phase} (ms)", "", "| model | context | " + " | ".join(backends) +
                  (" | vs compile | floor | vs floor |" if phase == "decode" else " | vs compile |"),
                  "|---|---|" + "---|" * (len(backends) + (3 if phase == "decode" else 1))]
        for model in dict.fromkeys(r["model"] for r in rows):
            for c in ctxs:
                cells = []
                for b in backends:
                    r = by.get((model, b, phase, c))
                    cells.append("—" if r is None else f"failed ({r.get('failed')})" if r["ms"] is None
                                 else f"{r['ms']:.3f}")
                t, k = by.get((model, "tcpkg", phase, c)), by.get((model, compiled, phase, c))
                ratio = f"{t['ms'] / k['ms']:.2f}" if t and k and t["ms"] and k["ms"] else "—"
                extra = [ratio]
                if phase == "decode":
                    fl = (t or k or {}).get("floor_ms")
                    extra += [f"{fl:.3f}" if fl else "—", f"{t['ms'] / fl:.2f}" if t and t["ms"] and fl else "—"]
                lines.append(f"| {model} | {c} | " + " | ".join(cells + extra) + " |")
        lines.append("")
    acc = [r for r in rows if r["phase"] == "accuracy"]
    if acc:
        lines += ["## accuracy (max |error| / max |logit| of a decode step after an 8-token prompt, vs float32 eager)",
                  "", "| model | " + " | ".join(backends) + " |", "|---|" + "---|" * len(backends)]
        for model in dict.fromkeys(r["model"] for r in acc):
            cells = [next((f"{r['error']:.1e}" for r in acc if r["model"] == model and r["backend"] == b), "—")
                     for b in backends]
            lines.append(f"| {model} | " + " | ".join(cells) + " |")
        lines.append("")
    if notes:
        lines += ["## notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", nargs="+", default=["gpt2", "llama"])
    p.add_argument("--contexts", nargs="+", type=int, default=[128, 1024])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--size", default=None, help="full (default on the GPU) or small (default on the CPU)")
    p.add_argument("--dtype", default=None, help="bfloat16 (default on the GPU) or float32 (default on the CPU)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--no-prefill", dest="prefill", action="store_false")
    p.add_argument("--profile", action="store_true", help="GPU: each backend's kernels in a decode step at the "
                   "largest context (torch.profiler), in the notes")
    p.add_argument("--work", default=str(Path(os.environ.get("TMPDIR", "/tmp")) / "tcexport-decode"))
    p.add_argument("--rebuild", action="store_true")
    p.add_argument("--out", default=None, help="results file stem (default: <machine>-<date>-decode)")
    args = p.parse_args(argv)
    args.size = args.size or ("full" if args.device == "cuda" else "small")
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    from bench.floors import machine_peaks

    peaks = machine_peaks(args.device, DTYPES[args.dtype], args.threads)
    rows, notes, profiles = [], [], []
    for kind in args.models:
        run_model(kind, args, peaks, rows, notes, profiles)
        torch.cuda.empty_cache() if args.device == "cuda" else None
    machine = (torch.cuda.get_device_name().lower().replace(" ", "-") if args.device == "cuda"
               else f"{os.cpu_count()}core-{platform.machine()}")
    stem = args.out or f"{machine}-{datetime.date.today().isoformat()}-decode-{args.device}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = report(rows, notes, peaks, args)
    (RESULTS / f"{stem}.md").write_text(text)
    (RESULTS / f"{stem}.json").write_text(json.dumps({"args": vars(args), "peaks": peaks, "rows": rows,
                                                      "notes": notes, "profiles": profiles}, indent=1, default=str))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
