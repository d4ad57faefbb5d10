"""The row count that splits a GPU GEMM's shapes in two: up to SMALL_M rows (a transformer at batch 1-2 of 128
tokens) a GEMM has too few output tiles to fill the GPU, so it takes smaller tiles (cuda/tiles.py) and, with a
long K, split-K (schedule/split_k.py). One number, owned by the schedule, read by both."""

SMALL_M = 256
