"""Experiments: one question each about a kernel or a call (on a GPU, but for the three cpu_ ones), answered once and
written up by hand in its results file under bench/results/ (named in the probe's docstring). Unlike the harness
(bench/run.py and the rest of bench/), a probe may time code the product does not ship (hand-written Triton kernels,
other tiles) or build the product with a non-default option (exporter/options.py's CudaOptions), never by patching
it. Each is `python -m bench.probes.NAME` with a `main(argv)`, `--help` works without a GPU, and importing one does
nothing.
They share bench/probes/common.py (options, the GPT-2 export, a CUDA-graph timer) and bench/probes/gemm_kernels.py
(the GEMM kernels more than one of them times), never each other.

| probe | question |
|---|---|
| attention | variants of the attention kernel: P's precision, skipped blocks, the output layout, the mask |
| cpu_gemm | the CPU package's GEMMs against torch and the machine's float32 peak, shape by shape |
| cpu_gemm_ab | the CPU's own GEMM kernel against an earlier revision's, operands out of cache |
| cpu_reduce_simd | a reduction's simd pragma on the nest or its innermost loop; pointers captured or bound again |
| decode_gemm | a decode step's GEMMs (1 or 8 rows) over tile shapes and split-K |
| call_overhead | what a call costs beyond its kernels: the index check, host phases, graph replay, launch calls |
| dependent_launch | where a kernel lets the next one launch (CudaOptions.dependent_trigger) |
| epilogue | what GEMM epilogues cost: bias, GELU forms, residual, indices per element or per row |
| gemm_table | 16-bit GEMM tiles over a grid of shapes and row bands: the table the exporter ships |
| gemm_tma | pointer loads against TMA descriptor loads against cuBLAS on GPT-2's GEMMs |
| gpt2 | GPT-2 small in one process: against eager and torch.compile, kernels by kind, floor, cold start |
| lm_head | the LM head persistent with TMA or one program per tile, inside the model (CudaOptions.tma) |
| ln_gemm | layer norm folded into the GEMM that reads it |
| persistent_gemm | persistent GEMMs (flattened loop, TMA or pointer loads) against one program per tile |
| split_k | stream-K and serial split-K against the tile GEMM and cuBLAS; tile sweeps |

Three have a `--check` that runs their kernels on small shapes in Triton's CPU interpreter:
`TRITON_INTERPRET=1 python -m bench.probes.{split_k,epilogue,ln_gemm} --check`.
"""
