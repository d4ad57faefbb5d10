"""The Triton GEMM kernels more than one probe times: the template's loop (one program per tile, ``mm_tile``) and a
persistent GEMM (one program per SM walking its tiles, ``mm_persist``), with the grouped tile order they share.
Shapes: A [M, K]; W [K, N], or [N, K] with ``WT`` (an LM head tied to the embedding); C [M, N]."""

import triton
import triton.language as tl


@triton.jit
def tile_pid(tile, num_m, num_n, GROUP_M: tl.constexpr):
    """Tile ``tile`` of a num_m x num_n grid in grouped order (GROUP_M rows of tiles at a time): (pid_m, pid_n)."""
    group = GROUP_M * num_n
    first_m = (tile // group) * GROUP_M
    group_m = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (tile % group) % group_m, (tile % group) // group_m


@triton.jit
def mm_tile(A, W, C, bias, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
            MOD: tl.constexpr = False, WT: tl.constexpr = False):
    """MOD: rows and columns past the edge load a wrapped-around (valid) element instead of being masked, and only
    the store is masked. WT: the weight is stored [N, K] (an LM head tied to the embedding)."""
    pid_m, pid_n = tile_pid(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
    rm = pid_m * BM + tl.arange(0, BM); rn = pid_n * BN + tl.arange(0, BN); rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    if MOD:
        ram = tl.max_contiguous(tl.multiple_of(rm % M, BM), BM)
        rbn = tl.max_contiguous(tl.multiple_of(rn % N, BN), BN)
    for kk in range(0, tl.cdiv(K, BK)):
        if MOD:
            a = tl.load(A + ram[:, None] * K + kk * BK + rk[None, :])
            if WT:
                b = tl.load(W + rbn[None, :] * K + kk * BK + rk[:, None])
            else:
                b = tl.load(W + (kk * BK + rk[:, None]) * N + rbn[None, :])
        else:
            a = tl.load(A + rm[:, None] * K + kk * BK + rk[None, :], mask=rm[:, None] < M, other=0.0)
            if WT:
                b = tl.load(W + rn[None, :] * K + kk * BK + rk[:, None], mask=rn[None, :] < N, other=0.0)
            else:
                b = tl.load(W + (kk * BK + rk[:, None]) * N + rn[None, :], mask=rn[None, :] < N, other=0.0)
        acc = tl.dot(a, b, acc)
    acc += tl.load(bias + rn, mask=rn < N).to(tl.float32)[None, :]
    tl.store(C + rm[:, None] * N + rn[None, :], acc.to(C.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def mm_persist(A, W, C, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
               NUM_SMS: tl.constexpr, FLATTEN: tl.constexpr, TMA: tl.constexpr):
    """One program per SM walking tiles NUM_SMS apart; W is [N, K], no bias. FLATTEN: the loop over tiles is
    software-pipelined across tile boundaries; TMA: loads through tensor descriptors (the caller sets Triton's
    allocator: common.torch_allocator_for_triton); stores are pointer stores."""
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    if TMA:
        a_desc = tl.make_tensor_descriptor(A, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
        w_desc = tl.make_tensor_descriptor(W, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_SMS, flatten=FLATTEN):
        pid_m, pid_n = tile_pid(tile, num_m, num_n, GROUP_M)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), tl.float32)
        for kk in range(0, k_tiles):
            if TMA:
                a = a_desc.load([pid_m * BM, kk * BK])
                b = w_desc.load([pid_n * BN, kk * BK]).T
            else:
                a = tl.load(A + rm[:, None] * K + kk * BK + rk[None, :], mask=rm[:, None] < M, other=0.0)
                b = tl.load(W + rn[None, :] * K + kk * BK + rk[:, None], mask=rn[None, :] < N, other=0.0)
            acc = tl.dot(a, b, acc)
        tl.store(C + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))
