"""Probe (`python -m bench.probes.attention [--mask] [--graph]` on a GPU machine): GPT-2 small's attention at
batch 8 (96 heads x 128 x 64, bf16, an additive causal mask read from a float32 buffer, as the exported model has
it) in variants of the kernel the CUDA codegen generates (exporter/cuda/), timed with triton.testing.do_bench, with
the relative error against float32 SDPA. PV16: 0 = float32 P in a tf32 dot, 1 = P rounded to bf16 (flash
attention), 2 = P as bf16 hi + lo in two dots (what the codegen does). SKIP: skip key blocks whose mask is all
-inf. OUTL: write the output as [batch, seq, heads, d], the layout the projection reads. `--mask --graph`: the mask
read from its buffer against computed from the positions in the kernel, with the sequence length specialised as
divisible by 16 (Triton's JIT) or not (what a package's ahead-of-time build knows), timed in a CUDA graph of 12
launches. `--sweep --shape B S H`: tiles x warps x stages of the codegen's variant and of flash attention's, at
another shape (a ~1B Llama's prefill of 1024 tokens: `--shape 1 1024 32`).

Results: bench/results/nvidia-h200-2026-11-29-gpt2-b8-where-time-goes.md,
bench/results/nvidia-h200-2026-11-30-gpt2-b8-kernels.md, bench/results/nvidia-h100-2026-12-07-gemm-table.md."""
import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from bench.probes.common import graph_us, parser, require_gpu


def _attn(qkv, maskb, out, S, H: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PV16: tl.constexpr,
         SKIP: tl.constexpr, OUTL: tl.constexpr, MASKGEN: tl.constexpr = False):
    M = S; N = S; D: tl.constexpr = 64
    pid = tl.program_id(0); bid = tl.program_id(1)
    b = bid // H; h = bid % H
    rm = pid * BM + tl.arange(0, BM); rd = tl.arange(0, D); rn0 = tl.arange(0, BN)
    row = 3 * H * D
    q = tl.load(qkv + row * (b * S + rm[:, None]) + h * D + rd[None, :], mask=rm[:, None] < M, other=0.0)
    m_i = tl.full((BM,), float('-inf'), tl.float32); l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, D), tl.float32)
    for kk in range(0, tl.cdiv(N, BN)):
        rn = kk * BN + rn0
        smask = (rm[:, None] < M) & (rn[None, :] < N)
        if MASKGEN:  # the causal mask computed from the positions instead of read from its buffer
            mk = tl.where(rn[None, :] <= rm[:, None], 0.0, float('-inf'))
        else:
            mk = tl.load(maskb + b * S * S + rm[:, None] * S + rn[None, :], mask=smask, other=0)
        go = True
        if SKIP:
            go = tl.max(tl.max(mk, 1), 0) > float('-inf')
        if go:
            kt = tl.load(qkv + row * (b * S + rn[None, :]) + H * D + h * D + rd[:, None], mask=rn[None, :] < N, other=0.0)
            s = tl.dot(q, kt) * 0.125 + mk
            s = tl.where(rn[None, :] < N, s, float('-inf'))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = tl.where(m_new == float('-inf'), 0.0, m_new)
            alpha = tl.exp(m_i - m_use)
            p = tl.exp(s - m_use[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(qkv + row * (b * S + rn[:, None]) + 2 * H * D + h * D + rd[None, :], mask=rn[:, None] < N, other=0.0)
            if PV16 == 2:
                p_hi = p.to(tl.bfloat16)
                acc = tl.dot((p - p_hi.to(tl.float32)).to(tl.bfloat16), v, acc * alpha[:, None])
                acc = tl.dot(p_hi, v, acc)
            elif PV16 == 1:
                acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v)
            else:
                acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="tf32")
            m_i = m_new
    acc = acc / l_i[:, None]
    if OUTL:  # [batch, seq, head, d]: what the projection reads
        tl.store(out + (b * S + rm[:, None]) * H * D + h * D + rd[None, :], acc.to(tl.bfloat16), mask=rm[:, None] < M)
    else:     # [batch*head, seq, d]
        tl.store(out + bid * M * D + rm[:, None] * D + rd[None, :], acc.to(tl.bfloat16), mask=rm[:, None] < M)

attn = triton.jit(_attn)
attn_ns = triton.jit(_attn, do_not_specialize=["S"])  # as the package's AOT build sees a symbol: no divisibility

B, S, H, D = 8, 128, 12, 64
CONFIGS = ((64, 64, 4, 2), (64, 128, 4, 1), (128, 128, 8, 2), (64, 64, 4, 1), (32, 64, 4, 2))
SWEEP = ((64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 4, 2), (128, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3),
         (128, 128, 8, 2), (64, 128, 4, 2), (128, 32, 4, 2), (256, 64, 8, 2))
MASK_CONFIGS = ((64, 64, 4, 2), (64, 128, 4, 1), (64, 128, 4, 2))


class Trials:
    """Causal attention inputs (GPT-2 small's at batch 8 unless told: b batch entries, s tokens, h heads of D), the
    float32 SDPA reference, and one timed, checked launch per call."""

    def __init__(self, graph: bool, b: int = B, s: int = S, h: int = H):
        self.graph = graph  # time 12 launches in a CUDA graph (as in the model) rather than with do_bench
        self.b, self.s, self.h = b, s, h
        self.qkv = torch.randn(self.b * self.s, 3 * self.h * D, device="cuda", dtype=torch.bfloat16)
        causal = torch.full((self.s, self.s), float("-inf"), device="cuda").triu(1)
        self.maskb = causal.expand(self.b, self.s, self.s).contiguous()
        self.q, self.k, self.v = self.qkv.view(self.b, self.s, 3, self.h, D).permute(2, 0, 3, 1, 4)
        self.ref = torch.nn.functional.scaled_dot_product_attention(self.q.float(), self.k.float(), self.v.float(),
                                                                    is_causal=True)  # b, h, s, D

    def sdpa_ms(self) -> float:
        return do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(self.q, self.k, self.v,
                                                                                 is_causal=True))

    def __call__(self, BM, BN, warps, stages, PV16, SKIP, OUTL, MASKGEN=False, kernel=None):
        """(ms, tile config, variant, relative error), or None if the launch failed (printed)."""
        out = torch.empty(self.b * self.s * self.h * D, device="cuda", dtype=torch.bfloat16)
        grid = (triton.cdiv(self.s, BM), self.b * self.h)
        fn = lambda: (kernel or attn)[grid](self.qkv, self.maskb, out, self.s, self.h, BM, BN, PV16, SKIP, OUTL,
                                            MASKGEN, num_warps=warps, num_stages=stages)
        try:
            fn()
            got = out.view(self.b, self.s, self.h, D).transpose(1, 2) if OUTL else out.view(self.b, self.h, self.s, D)
            err = ((got.float() - self.ref).norm() / self.ref.norm()).item()
            t = graph_us([fn] * 12) / 1e3 if self.graph else do_bench(fn)
        except Exception as e:  # noqa: BLE001 - a variant the compiler rejects is reported, not fatal
            print((BM, BN, warps, stages, PV16, SKIP, OUTL), "failed", str(e)[:100])
            return None
        return t, (BM, BN, warps, stages), dict(pv16=PV16, skip=SKIP, outl=OUTL), round(err, 5)


def show(r) -> None:
    if r is not None:
        print(f"{r[0]*1e3:6.1f} us {r[1]} {r[2]} relerr {r[3]}", flush=True)


def mask_variants(trial: Trials) -> None:
    """The mask read from memory against computed in the kernel, each with the sequence length specialised or not."""
    for cfg in MASK_CONFIGS:
        for MASKGEN in (False, True):
            for name, kernel in (("seq divisible by 16", attn), ("seq unspecialised", attn_ns)):
                r = trial(*cfg, 2, 0, 0, MASKGEN, kernel)
                if r is not None:
                    print(f"{r[0]*1e3:6.2f} us {r[1]} split P, mask {'computed' if MASKGEN else 'loaded'}, {name}, "
                          f"relerr {r[3]}", flush=True)


def main(argv=None):
    p = parser(__doc__)
    p.add_argument("--mask", action="store_true", help="the mask loaded against computed in the kernel only")
    p.add_argument("--graph", action="store_true", help="time 12 launches in a CUDA graph instead of do_bench")
    p.add_argument("--shape", type=int, nargs=3, metavar=("B", "S", "H"), default=(B, S, H),
                   help="batch, tokens, heads (of 64) instead of GPT-2 small's at batch 8")
    p.add_argument("--sweep", action="store_true",
                   help="tiles x warps x stages (SWEEP) of the codegen's variant (split P, masked blocks skipped), "
                        "and of flash attention's (P in bf16)")
    args = p.parse_args(argv)
    require_gpu()
    trial = Trials(args.graph, *args.shape)
    print(f"torch sdpa (bf16, is_causal) {trial.sdpa_ms()*1e3:.1f} us, shape (B, S, H) {tuple(args.shape)}", flush=True)
    if args.mask:
        mask_variants(trial)
        return
    if args.sweep:
        for PV16 in (2, 1):
            for cfg in SWEEP:
                show(trial(*cfg, PV16, 1, 0))
        return
    for cfg in CONFIGS:
        for PV16 in (0, 1, 2):
            show(trial(*cfg, PV16, 0, 0))
    for SKIP, OUTL in ((1, 0), (0, 1), (1, 1)):
        for PV16 in (0, 2):
            show(trial(64, 64, 4, 2, PV16, SKIP, OUTL))


if __name__ == "__main__":
    main()
