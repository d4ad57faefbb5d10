"""Where a package's time goes, kernel by kernel.

    python -m bench.profile_kernels examples/decoder.py --batch 8 --threads 1
    python -m bench.profile_kernels prefill.py --as-given --threads 2     (a package with state: a KV cache)

Exports the model, instruments a copy of the generated C++ with a timer around each kernel call (the package
itself is never instrumented: timers would be global state in a library that must stay re-entrant), builds it,
runs it through the loader's own calling convention, and prints each kernel's share of the call (a GEMM kernel's
tc_gemm call timed apart from the rest of it: the epilogue pass, and for 16-bit or gathered operands their copies).
"""

from __future__ import annotations

import argparse
import ctypes
import re
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np


_GEMM_CALL = re.compile(r"\n(  tc_gemm(?:<|_panels\(|_panels_t\().*?\);\n)", re.S)  # a GEMM kernel's one call of the product


def instrument(cpp: str) -> tuple[str, list[str]]:
    """A timer around each kernel call of the entry, those that run for some shapes only (``if (...) k(f);``,
    schedule/cpu.py) included."""
    names = re.findall(r"\n    (?:if \(.*\) )?(k\d+_\w+)\(f\);", cpp)
    cpp = cpp.replace("#include <algorithm>", "#include <algorithm>\n#include <chrono>", 1)
    cpp = cpp.replace("namespace {\nstruct Frame", f"double tc_prof[{max(len(names), 1)}];\nnamespace {{\nstruct Frame", 1)
    for i, n in enumerate(names):
        cpp = re.sub(rf"(\n    (?:if \(.*\) )?){n}\(f\);",
                     lambda m, n=n, i=i: f"{m.group(1)}{{ auto t0 = std::chrono::steady_clock::now(); {n}(f); tc_prof[{i}] += "
                     f"std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }}", cpp, count=1)
    cpp = cpp.replace("namespace {\nstruct Frame", f"double tc_prof_gemm[{max(len(names), 1)}];\nnamespace {{\nstruct Frame", 1)
    for i, n in enumerate(names):  # a GEMM kernel's product apart from its epilogue pass
        head = f"static void {n}(const Frame& f) {{"
        at = cpp.find(head)
        call = _GEMM_CALL.search(cpp, at) if at >= 0 else None
        if call is None or cpp.find("\n}\n", at) < call.start():
            continue
        timed = (f"\n  {{ auto tg0 = std::chrono::steady_clock::now();\n{call.group(1)}  tc_prof_gemm[{i}] += "
                 "std::chrono::duration<double>(std::chrono::steady_clock::now() - tg0).count(); }\n")
        cpp = cpp[:call.start()] + timed + cpp[call.end():]
    return cpp + ('\nextern "C" double* tc_prof_ptr() { return tc_prof; }\n'
                  'extern "C" double* tc_prof_gemm_ptr() { return tc_prof_gemm; }\n'), names


def main(argv=None) -> None:
    from tcexport.exporter.cpu.build import BASE_FLAGS, ISA_LEVELS, compiler, isa_flags
    from tcexport.exporter.front.model_file import load_model_file
    from tcexport.exporter.pipeline import export
    import tcexport.loader as L

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_file", type=Path)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--as-given", action="store_true",
                   help="call with the example inputs as they are (--batch ignored): a decoder's prefill over its "
                        "example's tokens and positions")
    args = p.parse_args(argv)

    spec = load_model_file(args.model_file)
    tmp = Path(tempfile.mkdtemp(prefix="tcprof-"))
    pkg = export(spec.module, spec.example_inputs, spec.dynamic_shapes, name=args.model_file.stem).save(tmp / "m.tcpkg")
    model = L.load(pkg, num_threads=args.threads)
    cpp, names = instrument(model.archive.read("src/cpu/model.cpp").decode())
    (tmp / "prof.cpp").write_text(cpp)
    base = getattr(model, "base", model)  # a package with state (a KV cache) runs its kernels through its base
    isa = base.isa
    subprocess.run([compiler(), *BASE_FLAGS, "-w", *isa_flags(next(i for i in ISA_LEVELS if i.name == isa)), "prof.cpp", "-o", "prof.so"],
                   cwd=tmp, check=True)
    lib = ctypes.CDLL(str(tmp / "prof.so"))
    lib.tc_prof_ptr.restype = ctypes.POINTER(ctypes.c_double)
    lib.tc_run.argtypes, lib.tc_run.restype = base._native.run.argtypes, base._native.run.restype
    base._native.run = lib.tc_run  # same ABI, same loader path: guards, buffers, workspace
    xs = [np.ascontiguousarray(t.numpy() if args.as_given else
                               np.repeat(t.numpy(), -(-args.batch // t.shape[0]), axis=0)[:args.batch])
          for t in spec.example_inputs]
    for _ in range(10):
        model(*xs)
    lib.tc_prof_gemm_ptr.restype = ctypes.POINTER(ctypes.c_double)
    prof, prof_gemm = lib.tc_prof_ptr(), lib.tc_prof_gemm_ptr()
    for i in range(len(names)):
        prof[i] = prof_gemm[i] = 0.0
    t0 = time.perf_counter()
    for _ in range(args.calls):
        model(*xs)
    total = (time.perf_counter() - t0) / args.calls * 1e6
    kernels = sorted(((prof[i] / args.calls * 1e6, n, prof_gemm[i] / args.calls * 1e6) for i, n in enumerate(names)),
                     reverse=True)
    inside = sum(us for us, _, _ in kernels)
    shape = "the example's inputs" if args.as_given else f"batch {args.batch}"
    print(f"{args.model_file} {shape}, {args.threads} thread(s), ISA {isa}: {total:.1f} us per call, "
          f"{inside:.1f} us in kernels, {total - inside:.1f} us in the loader and the call")
    for us, n, gemm in kernels:
        print(f"  {us:9.1f} us  {100 * us / total:5.1f}%  {n}" + (f"  (GEMM {gemm:.1f} us)" if gemm else ""))


if __name__ == "__main__":
    main()
