"""Linear and convolution weights stored the way the CPU's GEMM reads them, at export: as 32-wide panels, once.

The AVX-512 GEMM (cpu/runtime/prelude.h) multiplies rows of A by a B copied into kc x 32 micro-panels. For a
linear, B is the weight read through ``permute(w, [1, 0])`` ([N, K] stored, [K, N] read), so every call transposed
every weight into panels again, 16 x 16 blocks at a time: at 64 tokens (GPT-2 at batch 1) that copy is as long as a
fifth of the product, and with 8 rows (a decode step) half of it. The weight is a constant, so the copy can be
paid once, here: the pass stores

    panels[p, k, j] = w[32 p + j, k]    (0 where 32 p + j >= N),  shape [ceil(N / 32), K, 32]

and reads it back as the [K, N] operand through views only (permute, reshape, slice), which lowering turns into
index arithmetic; cpu/codegen.py recognises that index and hands the panels to ``tc_gemm_panels``, which reads them
in place. Each output is the same dot product over the same K in the same order, so nothing changes but the layout.
(python -m bench.probes.cpu_gemm_ab --base 850f820 --shapes 64x768x3072p 8x768x768p: 0.77x and 0.53x the time on
one core of an AMD EPYC; bench/results/2core-amd-epyc-2026-12-08-weight-panels.md.)

A convolution's product is W [Cout, K] times its input's columns [K, positions], which the own kernel runs with
output channels as a tile's rows and positions as its 32 lanes: a 7x7 map (49 positions) leaves a third of the
lanes empty, a 14x14 one an eighth. Where the channels fill panels better (conv_pays), the weight is stored as
panels of 32 output channels (``pack`` of W as [Cout, K]) and the product runs transposed, positions as rows
(``tc_gemm_panels_t``), each tile transposed as it is stored.

Only for a package whose only target is the CPU (a GPU target stores [K, N] instead: weights_kn.py), for float32
weights (the kernel is float32's; a 16-bit weight is widened per call anyway), and only what is provably private:
a linear's weight read through its permute (weights_kn.private_linear_weight) or, stored [K, N] already (GPT-2's
Conv1D), read as it is by its one GEMM; a convolution's weight read by that convolution alone (after
fold_batchnorm, which bakes its batch norm into it). Runs after concat_linears, so a joined q/k/v weight packs
once.
"""

from __future__ import annotations

import math

import torch

from tcexport.exporter.front.constants import add_constant, finish_rewrite, input_specs, is_constant, lookup
from tcexport.exporter.front.weights_kn import is_dtype_check, private_linear_weight, reads_instead

aten = torch.ops.aten
PANEL = 32  # columns per panel: the AVX-512 kernel's tile width (kTcNr)
MIN_N = 16  # narrower products keep their weight as it is: a panel would be mostly zeros


def weights_panels(ep: torch.export.ExportedProgram) -> list[str]:
    """Store each float32 linear's private weight as panels in ``ep``, in place, and each convolution's whose
    product pays to run transposed (conv_pays); returns a note for each kind moved."""
    specs = input_specs(ep)
    moved, read = [], set()
    for node in list(ep.graph.nodes):
        chain = private_linear_weight(node, specs, ep)
        if chain is not None and chain[1] is None:
            weight, _, permute = chain
            nk = lookup(ep, specs[weight.name]).detach()
        elif (kn := _private_kn_weight(node, specs, ep)) is not None:
            weight = permute = kn
            nk = lookup(ep, specs[weight.name]).detach().t()
        else:
            continue
        if nk.dtype != torch.float32 or nk.shape[0] < MIN_N:
            continue
        key = specs[weight.name].target
        stored = add_constant(ep, specs, key + ".panels", pack(nk), like=weight)
        reads_instead(weight, stored)
        node.replace_input_with(permute, _as_kn(ep, stored, node, nk.shape))
        if permute is not weight:
            ep.graph.erase_node(permute)
        read.add(weight)
        moved.append(key)
    convs = _convolutions(ep, specs, read)
    if not moved and not convs:
        return []
    finish_rewrite(ep, read, "weights stored as panels")
    notes = []
    if moved:
        notes.append(f"{len(moved)} linear weights stored as 32-column panels, the layout the CPU GEMM reads "
                     f"({moved[0]}, ...)")
    if convs:
        notes.append(f"{len(convs)} convolution weights stored as panels of 32 output channels, their products run "
                     f"with positions as rows ({convs[0]}, ...)")
    return notes


def _convolutions(ep, specs: dict, read: set) -> list[str]:
    """Pack the weights of the convolutions whose products run better transposed (conv_pays); their keys."""
    moved = []
    for node in list(ep.graph.nodes):
        if node.op != "call_function" or node.target is not aten.convolution.default:
            continue
        w = node.args[1]
        if not is_constant(w, specs, ep) or w in (node.args[0], node.args[2]) or \
                [u for u in w.users if not is_dtype_check(u)] != [node]:
            continue
        value = lookup(ep, specs[w.name]).detach()
        out = node.meta["val"].shape
        if node.args[6] or node.args[8] != 1 or value.dtype != torch.float32 or value.dim() < 3 or \
                not all(isinstance(d, int) for d in out[2:]):
            continue
        cout, depth = value.shape[0], math.prod(value.shape[1:])
        if not conv_pays(math.prod(out[2:]), cout, depth):
            continue
        key = specs[w.name].target
        stored = add_constant(ep, specs, key + ".panels", pack(value.reshape(cout, depth)), like=w)
        reads_instead(w, stored)
        node.replace_input_with(w, _as_conv_weight(ep, stored, node, tuple(value.shape)))
        read.add(w)
        moved.append(key)
    return moved


def conv_pays(positions: int, cout: int, depth: int) -> bool:
    """Whether a convolution's product should run with positions as rows and output channels as lanes
    (tc_gemm_panels_t) rather than channels as rows and positions as lanes (the own kernel), given it has a tile's
    rows of positions and each output sums at least MIN_DEPTH products (the transposed store costs about as much as
    a few dozen of them). Either its output channels fill the 32-lane tiles better than its positions do, by at
    least MIN_FILL_GAIN (ResNet's last stages, 49 and 196 positions a map: tiles 77% and 88% full; a MobileNet's or
    an EfficientNet's 1x1 convolutions over 14x14 and 7x7 maps), or they fill them as well and it is DEEP times
    deeper than it has channels: the own kernel copies the positions' K x N operand on every call and uses each
    copy for only Cout / 8 row tiles, where this one broadcasts them from where they lie (ResNet-18's 3x3 layers of
    64 and 128 channels: 0.96x the model's time at batch 1 and 8; neutral on ResNet-50, EfficientNet-b0,
    MobileNetV3-small)."""
    def fill(n: int) -> float:
        return n / (PANEL * -(-n // PANEL))
    if positions < MIN_POSITIONS or depth < MIN_DEPTH:
        return False
    gain = fill(cout) - fill(positions)
    return gain >= MIN_FILL_GAIN or (gain >= 0 and depth >= DEEP * cout)


MIN_POSITIONS = 8  # a tile's rows; a squeeze-excite's 1x1 map is one GEMM over the batch instead (lower/ops.py)
MIN_DEPTH = 64
MIN_FILL_GAIN = 0.05
DEEP = 4


def _private_kn_weight(node: torch.fx.Node, specs: dict, ep) -> torch.fx.Node | None:
    """The weight placeholder when ``node`` is an mm / addmm whose B is a private 2-D constant read as it is,
    [K, N] (transformers' Conv1D, GPT-2's linears, keeps its weight [in, out]), else None."""
    if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
        return None
    b = node.args[-1] if node.target is aten.mm.default else node.args[2] if len(node.args) == 3 else None
    if not is_constant(b, specs, ep) or b in node.args[:-1] or \
            [u for u in b.users if not is_dtype_check(u)] != [node]:
        return None
    return b if lookup(ep, specs[b.name]).dim() == 2 else None


def pack(w: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [ceil(N / 32), K, 32], zero-padded: panels[p, k, j] = w[32 p + j, k]."""
    n, k = w.shape
    panels = -(-n // PANEL)
    padded = torch.zeros(panels * PANEL, k, dtype=w.dtype)
    padded[:n] = w
    return padded.reshape(panels, PANEL, k).permute(0, 2, 1).contiguous()


def _as_conv_weight(ep, stored: torch.fx.Node, before: torch.fx.Node, shape: tuple) -> torch.fx.Node:
    """The [Cout, Cin, k...] weight as a view of its panels, built before ``before``: permute to [panels, 32, K],
    reshape to [panels * 32, K], slice to Cout, reshape to ``shape``."""
    cout, depth = shape[0], math.prod(shape[1:])
    panels = -(-cout // PANEL)
    with ep.graph.inserting_before(before), stored.meta["val"].fake_mode:
        x = _view(ep, aten.permute.default, stored, [0, 2, 1])
        x = _view(ep, aten.reshape.default, x, [panels * PANEL, depth])
        if panels * PANEL != cout:
            x = _view(ep, aten.slice.Tensor, x, 0, 0, cout)
        return _view(ep, aten.reshape.default, x, list(shape))


def _as_kn(ep, stored: torch.fx.Node, before: torch.fx.Node, shape) -> torch.fx.Node:
    """The [K, N] view of the panels (``shape`` is [N, K]), built before ``before``: permute to [K, panels, 32],
    reshape to [K, panels * 32], slice to N."""
    n, k = shape
    panels = -(-n // PANEL)
    with ep.graph.inserting_before(before), stored.meta["val"].fake_mode:
        x = _view(ep, aten.permute.default, stored, [1, 0, 2])
        x = _view(ep, aten.reshape.default, x, [k, panels * PANEL])
        return x if panels * PANEL == n else _view(ep, aten.slice.Tensor, x, 1, 0, n)


def _view(ep, op, x: torch.fx.Node, *args) -> torch.fx.Node:
    """A node applying ``op`` to ``x``, its value the op run on x's fake value (inside the fake mode)."""
    y = ep.graph.call_function(op, (x, *args))
    y.meta["val"] = op(x.meta["val"], *args)
    return y
