"""``--precision bf16|fp16``: a float32 model exported with the semantics of ``torch.autocast("cuda")``.

Autocast is a rule per op, not a dtype for the model: GEMMs, convolutions and attention run on 16-bit operands
(accumulating in float32), numerically sensitive ops (norms, softmax, exp/log, reductions such as sum) run in
float32, and a few ops that mix operands promote them to the widest. The package should compute what the user's
model computes under ``torch.autocast("cuda", dtype)`` — the AMP half of torch.compile's benchmark — on any target,
and the export machine has no GPU, so the CUDA policy is written here as data (the op lists of ATen's
``autocast_mode.cpp`` for CUDA) and applied to the captured graph as explicit casts, before decomposition, at the
op level autocast itself works on (``aten.linear``, ``aten.layer_norm``, ...). The cast graph is then exported
again and goes through the pipeline like any float32 model, so every later stage sees ordinary dtype conversions.

A weight whose every use is cast to the 16-bit dtype is stored in 16 bits (half the bytes to read); a weight
also used in float32 (a tied embedding) stays float32 and is cast where the GEMM reads it.
"""

from __future__ import annotations

import functools

import torch
import torch.fx as fx

from tcexport.exporter.errors import ExportError

PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16}

# ATen autocast_mode.cpp, CUDA: ops that run in the 16-bit dtype (lower_precision_fp).
LOWER = frozenset({
    "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "convolution", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv",
    "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
})
# ... ops that run in float32 (fp32, and fp32_set_opt_dtype: a 16-bit input is computed and returned in float32).
FLOAT32 = frozenset({
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm", "group_norm", "frobenius_norm",
    "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp", "upsample_nearest1d",
    "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d", "upsample_nearest3d",
    "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
    "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
    "prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm", "linalg_matrix_norm", "sum",
})
# ... ops whose floating operands are promoted to the widest among them.
PROMOTE = frozenset({
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler", "index_put", "scatter_add",
    "tensordot", "cat", "stack", "index_copy",
})
HALF = (torch.float16, torch.bfloat16)


def precision_dtype(precision: str | None) -> torch.dtype | None:
    if precision is None:
        return None
    if precision not in PRECISIONS:
        raise ExportError(f"--precision {precision!r} is not known; use one of {', '.join(PRECISIONS)} "
                          "(or leave it out to export the model's own dtypes)")
    return PRECISIONS[precision]


def policy(target) -> str | None:
    """"lower", "float32", "promote" or None (the op runs in its inputs' dtypes) for an ATen op overload."""
    packet = getattr(target, "_overloadpacket", None)
    name = getattr(packet, "__name__", None)
    if name is None:
        return None
    return "lower" if name in LOWER else "float32" if name in FLOAT32 else "promote" if name in PROMOTE else None


def autocast_module(program: torch.export.ExportedProgram, example_inputs, dtype: torch.dtype) -> fx.GraphModule:
    """The program's module with autocast's casts made explicit, and GEMM-only weights stored in ``dtype``.

    Its ``forward`` takes the model's inputs under their own names, so it exports with the same dynamic shapes.
    """
    try:
        gm = program.module(check_guards=False)
    except TypeError:  # an older torch: no check_guards argument
        gm = program.module()
    for node in [n for n in gm.graph.nodes if n.op == "call_module" and n.target == "_guards_fn"]:
        gm.graph.erase_node(node)  # the exported program's own input checks: the second export makes its own
    with torch.no_grad():
        _Autocasting(gm, dtype).run(*example_inputs)
    _store_gemm_weights(gm, dtype)
    gm.graph.lint()
    gm.recompile()
    return gm


class _Autocasting(fx.Interpreter):
    """Runs the module once on the example inputs (so every value's dtype is known, as eager autocast knows it)
    and inserts, before each op the policy names, the casts autocast would make; the op itself then runs on the
    cast values, so the dtypes downstream are the ones autocast produces."""

    def __init__(self, gm: fx.GraphModule, dtype: torch.dtype):
        super().__init__(gm)
        self.dtype = dtype
        self.casts: dict[tuple, fx.Node] = {}  # (source node, dtype) -> its cast node, shared by every user

    def run_node(self, n: fx.Node):
        rule = policy(n.target) if n.op == "call_function" else None
        if rule is None:
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        want = self._target_dtype(rule, [v for v in _tensors((args, kwargs))])
        if want is None:
            return super().run_node(n)
        n.args = _map_nodes(n.args, lambda a: self._cast_node(a, want, n))
        n.kwargs = _map_nodes(n.kwargs, lambda a: self._cast_node(a, want, n))
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        return getattr(self, n.op)(n.target, args, kwargs)

    def _target_dtype(self, rule: str, tensors: list) -> torch.dtype | None:
        floats = [t.dtype for t in tensors if t.is_floating_point()]
        if rule == "lower":
            return self.dtype if any(d == torch.float32 for d in floats) else None
        if rule == "float32":
            return torch.float32 if any(d in HALF for d in floats) else None
        return functools.reduce(torch.promote_types, floats) if len(set(floats)) > 1 else None

    def _cast_node(self, source: fx.Node, want: torch.dtype, user: fx.Node) -> fx.Node:
        value = self.env.get(source)
        if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.dtype == want:
            return source
        if want in HALF and value.dtype == torch.float64:  # autocast leaves float64 alone
            return source
        key = (source, want)
        if key not in self.casts:
            with self.graph.inserting_before(user):
                cast = self.graph.call_function(torch.ops.aten._to_copy.default, (source,), {"dtype": want})
            self.env[cast] = value.to(want)
            self.casts[key] = cast
        return self.casts[key]


def _tensors(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, (list, tuple)):
        for t in tree:
            yield from _tensors(t)
    elif isinstance(tree, dict):
        for t in tree.values():
            yield from _tensors(t)


def _map_nodes(tree, fn):
    if isinstance(tree, fx.Node):
        return fn(tree)
    if isinstance(tree, (list, tuple)):
        return type(tree)(_map_nodes(t, fn) for t in tree)
    if isinstance(tree, dict):
        return {k: _map_nodes(v, fn) for k, v in tree.items()}
    return tree


def _store_gemm_weights(gm: fx.GraphModule, dtype: torch.dtype) -> None:
    """A float32 parameter or buffer read only through casts to ``dtype`` becomes a ``dtype`` tensor, and the
    casts go: the package stores it in 16 bits. The module's own (original) tensors are not touched."""
    for node in list(gm.graph.nodes):
        if node.op != "get_attr" or not node.users:
            continue
        users = list(node.users)
        if not all(u.target is torch.ops.aten._to_copy.default and u.kwargs.get("dtype") == dtype
                   and len(u.kwargs) == 1 for u in users):
            continue
        owner_name, _, attr = node.target.rpartition(".")
        owner = gm.get_submodule(owner_name)
        value = getattr(owner, attr)
        if not isinstance(value, torch.Tensor) or value.dtype != torch.float32:
            continue
        low = value.detach().to(dtype)
        if isinstance(value, torch.nn.Parameter):
            setattr(owner, attr, torch.nn.Parameter(low, requires_grad=False))
        else:
            owner.register_buffer(attr, low, persistent=attr not in getattr(owner, "_non_persistent_buffers_set", ()))
        for u in users:
            u.replace_all_uses_with(node)
            gm.graph.erase_node(u)
