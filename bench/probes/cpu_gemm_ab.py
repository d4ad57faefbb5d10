"""The CPU's own AVX-512 GEMM against an earlier version of itself, shape by shape, operands out of cache.

    python -m bench.probes.cpu_gemm_ab --base 77d96b6
    python -m bench.probes.cpu_gemm_ab --base HEAD~1 --shapes 1024x3072x768t 64x3136x64 128x840x1152:9

Builds one C++ program holding both runtime preludes (``--base``'s, read with ``git show``, and the working
tree's), each in a namespace of its own, and times ``tc_sgemm_own`` on one thread, alternating the two call by
call for a few seconds over rotating copies of the operands (64 MB in all, so that each call finds them out of L2,
as a model's kernels do; warm operands hid a 2x difference). Prints both rates and the time ratio (medians).
Shapes are M x N x K; a trailing ``a`` gives A transposed (K x M: a convolution's weight stored [K, Cout]), a
trailing ``t`` B transposed (N x K: a Linear's weight), a trailing ``p`` that weight transposed on the base side and
packed as 32-column panels on the working tree's (``tc_sgemm_panels``, front/weights_panels.py); ``:T`` reads B's rows
through a table of T taps' offsets into a padded input (a window GEMM, schedule/window_gemm.py). Needs an AVX-512
CPU and g++. Results, written up by hand: bench/results/2core-intel-r-xeon-r-processor-2026-12-06-cpu-gemm-ab.md;
with panels, bench/results/2core-amd-epyc-2026-12-08-weight-panels.md.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from . import common

ROOT = Path(__file__).resolve().parents[2]
PRELUDE = "exporter/cpu/runtime/prelude.h"
DEFAULT_SHAPES = ["256x196x2304", "64x3136x64", "256x3136x64", "512x49x4608", "512x784x128", "128x3136x256",
                  "512x512x512", "128x840x1152:9", "64x3248x576:9", "64x12880x147:49", "8x3072x768t",
                  "64x3072x768t", "128x2304x768t", "394x768x3072t", "1024x768x3072t", "1024x3072x768t"]

HARNESS = r"""
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <immintrin.h>
#include <limits>
#include <random>
#include <stdexcept>
#include <type_traits>
#include <vector>
#include "pool.h"  // the working tree's thread pool, which both preludes' threaded entry points name
namespace base_k {
#include "base_prelude.h"
}
namespace new_k {
#include "new_prelude.h"
}
int main(int argc, char** argv) {  // M N K tb taps seconds ta panels
  const int64_t M = atoll(argv[1]), N = atoll(argv[2]), K = atoll(argv[3]);
  const bool tb = atoi(argv[4]);
  const int taps = atoi(argv[5]);
  const double seconds = atof(argv[6]);
  const bool ta = argc > 7 && atoi(argv[7]);
  const bool panels = argc > 8 && atoi(argv[8]);  // the new side reads B (given transposed) packed as panels
  const int64_t lda = ta ? M : K;
  std::mt19937 g(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> A(M * K), C(M * N), B, Bp;
  for (auto& x : A) x = u(g);
  const int64_t ldb = tb ? K : N;
  std::vector<int64_t> rows;
  if (taps) {  // K = channels x taps rows, tap t of a channel at t * 3 into its padded row of N + 64
    const int64_t cin = K / taps, pitch = N + 64;
    B.resize(cin * pitch);
    for (int64_t c = 0; c < cin; ++c)
      for (int t = 0; t < taps; ++t) rows.push_back(c * pitch + t * 3);
  } else {
    B.resize(K * N);
  }
  for (auto& x : B) x = u(g);
  if (panels) {  // B^T (N x K) as 32-column panels, [ceil(N / 32)][K][32], in B's place for the new side
    std::vector<float> packed(((N + 31) / 32) * K * 32, 0.0f);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) packed[((n / 32) * K + k) * 32 + n % 32] = B[n * K + k];
    Bp = packed;
  }
  const int64_t bytes = int64_t(A.size() + B.size() + C.size()) * 4;
  const int copies = int(std::max<int64_t>(2, (int64_t(64) << 20) / bytes));
  std::vector<std::vector<float>> As(copies, A), Bs(copies, B), Cs(copies, C), Bps(panels ? copies : 0, Bp);
  const int64_t* r = taps ? rows.data() : nullptr;
  std::vector<double> t[2];
  int which = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int it = 0; std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds; ++it) {
    for (int v = 0; v < 2; ++v) {
      const auto t0 = std::chrono::steady_clock::now();
      if (v == 0) base_k::tc_sgemm_own(M, N, K, ta, As[which].data(), lda, tb, Bs[which].data(), ldb, Cs[which].data(), N, r);
      else if (panels)
        new_k::tc_sgemm_panels(M, 0, N, K, ta, As[which].data(), lda, Bps[which].data(), Cs[which].data(), N);
      else new_k::tc_sgemm_own(M, N, K, ta, As[which].data(), lda, tb, Bs[which].data(), ldb, Cs[which].data(), N, r);
      if (it) t[v].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      which = (which + 1) % copies;
    }
  }
  double med[2];
  for (int v = 0; v < 2; ++v) {
    std::sort(t[v].begin(), t[v].end());
    med[v] = t[v][t[v].size() / 2];
  }
  const double flops = 2.0 * M * N * K;
  printf("%.2f %.2f %.3f\n", flops / med[0] / 1e9, flops / med[1] / 1e9, med[1] / med[0]);
}
"""


def parse_shape(text: str) -> tuple[int, int, int, bool, int, bool, bool]:
    """'MxNxK', with a trailing 'a' (A transposed), 't' (B transposed), 'p' (B transposed on the base side,
    packed as panels read by tc_sgemm_panels on the working tree's) or ':T' (T taps): (M, N, K, tb, taps, ta,
    panels)."""
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)(a?)([tp]?)(?::(\d+))?", text)
    if m is None:
        raise SystemExit(f"shape {text!r}: expected MxNxK, MxNxKa, MxNxKt, MxNxKp or MxNxK:T (e.g. 64x3136x64, "
                         f"512x49x4608a, 8x3072x768t, 64x768x3072p, 128x840x1152:9)")
    if m.group(5) and m.group(6):
        raise SystemExit(f"shape {text!r}: a tap table reads B as it is, not transposed")
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)), bool(m.group(5)), int(m.group(6) or 0),
            bool(m.group(4)), m.group(5) == "p")


def build(base: str, folder: Path) -> Path:
    """The program, compiled in ``folder``."""
    old = subprocess.run(["git", "show", f"{base}:{PRELUDE}"], cwd=ROOT, capture_output=True, text=True)
    if old.returncode != 0:
        raise SystemExit(f"--base {base}: git show could not read {PRELUDE} there: {old.stderr.strip()}")
    (folder / "base_prelude.h").write_text(old.stdout)
    (folder / "new_prelude.h").write_text((ROOT / PRELUDE).read_text())
    (folder / "pool.h").write_text((ROOT / PRELUDE).with_name("pool.h").read_text())
    (folder / "ab.cpp").write_text(HARNESS)
    exe = folder / "ab"
    subprocess.run(["g++", "-O3", "-march=native", "-std=c++17", "-w", "ab.cpp", "-o", str(exe)], cwd=folder,
                   check=True)
    return exe


def main(argv=None) -> None:
    p = common.parser(__doc__)
    p.add_argument("--base", required=True, help="the git revision whose prelude is the baseline")
    p.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES)
    p.add_argument("--seconds", type=float, default=2.0, help="timing per shape (both versions alternating)")
    args = p.parse_args(argv)
    shapes = [parse_shape(s) for s in args.shapes]
    with tempfile.TemporaryDirectory(prefix="tcexport-gemm-ab-") as tmp:
        exe = build(args.base, Path(tmp))
        print(f"| M x N x K | B | {args.base} GFLOP/s | working tree GFLOP/s | time new/base |")
        print("|---|---|---|---|---|")
        for text, (m, n, k, tb, taps, ta, panels) in zip(args.shapes, shapes):
            out = subprocess.run([str(exe), str(m), str(n), str(k), str(int(tb)), str(taps), str(args.seconds),
                                  str(int(ta)), str(int(panels))],
                                 capture_output=True, text=True, check=True).stdout.split()
            kind = ("A transposed, " if ta else "") + ("transposed / panels" if panels else "transposed" if tb else
                                                         f"{taps} taps" if taps else "row-major")
            print(f"| {m}x{n}x{k} | {kind} | {float(out[0]):.1f} | {float(out[1]):.1f} | {float(out[2]):.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
