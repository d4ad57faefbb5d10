"""Where the C++ codegen puts a reduction's ``#pragma omp simd``: over the whole reduce nest (``collapse(2)``) or on
its innermost loop, for a plane of H x W summed per channel (a global pool, a squeeze-excite's mean).

    python -m bench.probes.cpu_reduce_simd
    python -m bench.probes.cpu_reduce_simd --planes 7x7 56x56 --seconds 1
    python -m bench.probes.cpu_reduce_simd --parallel --threads 2

Builds a C++ program a plane size (static extents, as a package's) with the runtime's prelude (for ``tc_sigmoid``,
whose exp selects in its range checks) and the build's own flags at ``-march=native``, and times, alternating call
by call, four loops per plane size: a plain sum and a sum of ``x * sigmoid(x)`` (a pool after SiLU, fused), each
under either pragma. Prints the median nanoseconds an element. GCC 12 vectorizes no collapsed reduction whose body
selects, which is why exporter/cpu/codegen.py puts the pragma on the innermost loop. Results (2-core AMD EPYC):
bench/results/2core-amd-epyc-2026-12-07-cpu-reduce-ab.md.

``--parallel`` times the shape a kernel has on the pool (a body lambda that the pool's range calls out of line): with
the input pointer read through the lambda's capture GCC leaves the load in the loop and the loop scalar; bound again
to a local at the top of the body, the loop vectorizes (why codegen's ``_dispatch`` binds the frame inside the body).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from . import common

ROOT = Path(__file__).resolve().parents[2]
PRELUDE = ROOT / "exporter/cpu/runtime/prelude.h"
DEFAULT_PLANES = ["7x7", "14x14", "28x28", "56x56", "112x112"]

# what the runtime's headers need before them (pool.h, then prelude.h, as a package's source has them)
INCLUDES = r"""
#include "pool.h"
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <random>
#include <stdexcept>
#include <type_traits>
#include "prelude.h"
"""

HARNESS = INCLUDES + r"""

// one channel's plane of PH x PW: the codegen's reduce nest q0 (rows) x q1 (columns), static extents as a
// package's are (PH and PW are compiled in, one program a plane size)
#define LOOP(NAME, PRAGMA_OUTER, PRAGMA_INNER, BODY)                                  \
  __attribute__((noinline)) void NAME(const float* x, float* out, int64_t c) {      \
    for (int64_t ch = 0; ch < c; ++ch) {                                             \
      const float* p = x + ch * PH * PW;                                             \
      float acc = 0.0f;                                                              \
      PRAGMA_OUTER                                                                   \
      for (int64_t q0 = 0; q0 < PH; ++q0) {                                         \
        PRAGMA_INNER                                                                 \
        for (int64_t q1 = 0; q1 < PW; ++q1) {                                        \
          const float v = p[q0 * PW + q1];                                           \
          acc += BODY;                                                               \
        }                                                                            \
      }                                                                              \
      out[ch] = acc;                                                                 \
    }                                                                                \
  }
#define P(x) _Pragma(#x)
LOOP(sum_collapse, P(omp simd collapse(2) reduction(+:acc)), , v)
LOOP(sum_inner, , P(omp simd reduction(+:acc)), v)
LOOP(silu_collapse, P(omp simd collapse(2) reduction(+:acc)), , v * tc_sigmoid(v))
LOOP(silu_inner, , P(omp simd reduction(+:acc)), v * tc_sigmoid(v))

int main(int argc, char** argv) {  // seconds
  const int64_t h = PH, w = PW;
  const double seconds = atof(argv[1]);
  const int64_t c = std::max<int64_t>(8, (int64_t(1) << 20) / (h * w));  // about 4 MB of input a call
  std::mt19937 g(1);
  std::uniform_real_distribution<float> u(-4, 4);
  std::vector<float> x(c * h * w), out(c);
  for (auto& v : x) v = u(g);
  void (*fs[4])(const float*, float*, int64_t) = {sum_collapse, sum_inner, silu_collapse,
                                                                    silu_inner};
  std::vector<double> t[4];
  const auto start = std::chrono::steady_clock::now();
  for (int it = 0; std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds; ++it) {
    for (int f = 0; f < 4; ++f) {
      const auto t0 = std::chrono::steady_clock::now();
      fs[f](x.data(), out.data(), c);
      if (it) t[f].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  for (int f = 0; f < 4; ++f) {
    std::sort(t[f].begin(), t[f].end());
    printf("%.3f ", t[f][t[f].size() / 2] / double(c * h * w) * 1e9);
  }
  printf("\n");
}
"""


# --parallel: the kernel shape the codegen writes (a body lambda the pool calls out of line, exporter/cpu/codegen.py
# _dispatch), its pointer read through the lambda's capture or bound again to a local at the top of the body
PARALLEL = INCLUDES + r"""

struct Frame { const float* x; float* out; };

#define KERNEL(NAME, REBIND)                                                            \
  __attribute__((noinline)) void NAME(const Frame& f, int nt, int64_t c) {              \
    const float* __restrict__ x = f.x;                                                  \
    float* __restrict__ out = f.out;                                                    \
    auto body = [&](int64_t ch) {                                                       \
      REBIND                                                                            \
      float acc = 0.0f;                                                                 \
      for (int64_t q0 = 0; q0 < PH; ++q0) {                                             \
        _Pragma("omp simd reduction(+:acc)")                                            \
        for (int64_t q1 = 0; q1 < PW; ++q1) {                                           \
          const float v = x[ch * PH * PW + q0 * PW + q1];                               \
          acc += v * tc_sigmoid(v);                                                     \
        }                                                                               \
      }                                                                                 \
      out[ch] = acc;                                                                    \
    };                                                                                  \
    if (nt > 1)                                                                         \
      tc_parallel_range(nt, c, 8 * nt, [&](int64_t lo, int64_t hi) {                    \
        for (int64_t i = lo; i < hi; ++i) body(i);                                      \
      });                                                                               \
    else                                                                                \
      for (int64_t i = 0; i < c; ++i) body(i);                                          \
  }
KERNEL(captured, )
KERNEL(rebound, const float* __restrict__ x = f.x; float* __restrict__ out = f.out;)

int main(int argc, char** argv) {  // threads seconds
  const int nt = atoi(argv[1]);
  const double seconds = atof(argv[2]);
  const int64_t c = std::max<int64_t>(8, (int64_t(1) << 20) / (PH * PW));
  std::mt19937 g(1);
  std::uniform_real_distribution<float> u(-4, 4);
  std::vector<float> x(c * PH * PW), out(c);
  for (auto& v : x) v = u(g);
  const Frame f{x.data(), out.data()};
  void (*fs[2])(const Frame&, int, int64_t) = {captured, rebound};
  std::vector<double> t[2];
  const auto start = std::chrono::steady_clock::now();
  for (int it = 0; std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds; ++it) {
    for (int k = 0; k < 2; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      fs[k](f, nt, c);
      if (it) t[k].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  for (int k = 0; k < 2; ++k) {
    std::sort(t[k].begin(), t[k].end());
    printf("%.3f ", t[k][t[k].size() / 2] / double(c * PH * PW) * 1e9);
  }
  printf("\n");
}
"""


def parse_plane(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)x(\d+)", text)
    if m is None:
        raise SystemExit(f"plane {text!r}: expected HxW (e.g. 7x7)")
    return int(m.group(1)), int(m.group(2))


def build(folder: Path, h: int, w: int, parallel: bool = False) -> Path:
    """The program for planes of h x w, compiled in ``folder`` with the flags a package's library gets
    (exporter/cpu/build.py)."""
    from tcexport.exporter.cpu.build import BASE_FLAGS

    (folder / "prelude.h").write_text(PRELUDE.read_text())
    (folder / "pool.h").write_text((PRELUDE.parent / "pool.h").read_text())
    (folder / "probe.cpp").write_text(PARALLEL if parallel else HARNESS)
    exe = folder / f"probe-{h}x{w}{'-parallel' if parallel else ''}"
    flags = [f for f in BASE_FLAGS if f not in ("-shared", "-fPIC") and not f.startswith("-W")]
    subprocess.run(["g++", *flags, "-march=native", f"-DPH={h}", f"-DPW={w}", "-w", "probe.cpp", "-o", str(exe)],
                   cwd=folder, check=True)
    return exe


def main(argv=None) -> None:
    p = common.parser(__doc__)
    p.add_argument("--planes", nargs="+", default=DEFAULT_PLANES)
    p.add_argument("--seconds", type=float, default=1.0, help="timing per plane size (the loops alternating)")
    p.add_argument("--parallel", action="store_true",
                   help="x*sigmoid(x) sums in the kernel shape the codegen writes, on the runtime's pool: the "
                        "pointers read through the body lambda's captures against bound again inside it")
    p.add_argument("--threads", type=int, default=2, help="--parallel: the pool's threads")
    args = p.parse_args(argv)
    planes = [parse_plane(s) for s in args.planes]
    with tempfile.TemporaryDirectory(prefix="tcexport-reduce-simd-") as tmp:
        if args.parallel:
            print(f"{'plane':>9} | {'captured':>9} {'rebound':>9}   (x*sigmoid(x) sums on {args.threads} threads, "
                  "ns an element, medians)")
            for h, w in planes:
                exe = build(Path(tmp), h, w, parallel=True)
                out = subprocess.run([str(exe), str(args.threads), str(args.seconds)], capture_output=True,
                                     text=True, check=True).stdout.split()
                a, b = (float(v) for v in out)
                print(f"{h:>4}x{w:<4} | {a:9.3f} {b:9.3f}")
            return
        print(f"{'plane':>9} | {'sum collapse':>12} {'sum inner':>10} | {'x*sig collapse':>14} {'x*sig inner':>11}"
              "   (ns an element, medians)")
        for h, w in planes:
            exe = build(Path(tmp), h, w)
            out = subprocess.run([str(exe), str(args.seconds)], capture_output=True, text=True,
                                 check=True).stdout.split()
            a, b, c, d = (float(v) for v in out)
            print(f"{h:>4}x{w:<4} | {a:12.3f} {b:10.3f} | {c:14.3f} {d:11.3f}")


if __name__ == "__main__":
    main()
