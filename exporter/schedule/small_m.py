"""The row counts that split a GPU GEMM's shapes into bands, owned by the schedule and read by both it (split-K,
schedule/split_k.py) and the tiles (cuda/tiles.py): up to SMALL_M rows (a transformer at batch 1-2 of 128 tokens)
a GEMM has too few output tiles to fill the GPU, so it takes smaller tiles and, with a long K, split-K; up to
FEW_M rows (a decode step at batch 1-16) one 16-row tile, tl.dot's least, holds every row, and the weight's bytes
are the whole cost, so the tiles are narrow and K is split for as many programs as the GPU has SMs."""

SMALL_M = 256
FEW_M = 16

