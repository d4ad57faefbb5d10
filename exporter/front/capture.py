"""Capture: torch.export with Dims, then decomposition into the small core op set the lowering knows.

Composite ops (softmax, layer_norm, gelu, ...) are decomposed on purpose: fusion rebuilds them as single kernels
from their parts, so one generic mechanism covers every such op instead of one hand-written kernel each.
Then graph rewrites that are exact at export time run on the decomposed program (``fold_batchnorm``: an eval
batch norm after a convolution becomes part of the convolution's weight and bias; ``concat_linears``: linears
over one input become one GEMM over their weights side by side; for a GPU target, ``weights_kn``: a linear's
weight stored [K, N], the layout the GPU GEMM reads fastest; for the CPU alone, ``weights_panels``: as the 32-column
panels the CPU GEMM reads).

A dynamic dim's way through the front end (``tcexport model.py --dynamic batch``): cli.py passes the spec
strings to the pipeline's capture stage, which calls ``capture`` here; dynamic.py parses them into our symbols
and where each is placed, then into torch.export Dims; torch.export runs (accepting its suggested fixes through
relations.accept_fixes); relations.py maps torch's symbols back to ours (``rename``), refines each symbol's range
and collects the guards. ``Captured`` carries them on: lowering reads every size over our symbols
(``to_sympy``, lower/context.py), and the package stage writes ``symbols`` and ``guards`` into the manifest,
which loader/guards.py checks before every call.
"""

from __future__ import annotations

import dataclasses
import math
import re

from dataclasses import dataclass, field

from pathlib import Path

import sympy
import torch
from torch._decomp import get_decompositions

from tcexport.exporter.front import autocast, dynamic
from tcexport.exporter.front import diagnose, methods, range_check, relations, state, torch_logs
from tcexport.exporter.errors import CaptureError, DataDependentError, ExampleSizeOneError, SpecializedDimError
from tcexport.exporter.front.source_line import frame_of
from tcexport.exporter.front.concat_linears import concat_linears
from tcexport.exporter.front.fold_batchnorm import fold_batchnorm
from tcexport.exporter.front.weights_kn import weights_kn
from tcexport.exporter.front.weights_panels import weights_panels
from tcexport.exporter.front.model_file import ModelSpec
from tcexport.formats.state import first_names

aten = torch.ops.aten

# Decomposed further than the core ATen set, so that fusion sees reductions and pointwise parts.
EXTRA_DECOMPOSITIONS = [
    aten._softmax, aten._log_softmax, aten.native_layer_norm, aten.gelu, aten.var_mean, aten.silu,
    aten.hardswish, aten.hardsigmoid, aten.mish, aten.softplus, aten.elu, aten.leaky_relu, aten.hardtanh,
    aten.native_group_norm, aten.rms_norm, aten.std, aten.var, aten._native_batch_norm_legit_functional,
    aten._native_batch_norm_legit.no_stats,
    aten.linalg_vector_norm, aten.logsumexp, aten.addcmul, aten.addcdiv, aten.lerp, aten.sigmoid_backward,
    # resizing as gathers at computed indices and a weighted sum (segmentation heads, BEiT's position bias)
    aten.upsample_bilinear2d, aten.upsample_nearest2d,
]


@dataclass
class Captured:
    """What the front end hands to lowering (lower/core.py): the decomposed program, our symbols and their
    ranges, torch's symbols renamed to ours, and the relations the package guards."""

    program: torch.export.ExportedProgram
    input_names: list[str]
    symbols: dict[str, dynamic.SymbolSpec]  # user name -> range (as export refined it)
    rename: dict  # torch's sympy symbol -> an expression over our symbols (see relations.subst)
    model_file: str | None
    guards: list = field(default_factory=list)  # relations.Relation: what the loader checks beyond ranges and dims
    notes: list = field(default_factory=list)   # what export demanded and we accepted (summary warnings)
    dynamic_shapes: dict | None = None          # the torch.export dynamic_shapes that succeeded, fixes included
    folded: list = field(default_factory=list)  # graph rewrites done before lowering (batch norms folded, ...)
    reference: object = None                    # --precision: the module the package computes (autocast.py)
    draft_failures: list = field(default_factory=list)  # draft=True: what draft export got past (_draft_findings)
    torch_log: list = field(default_factory=list)  # what torch logged during capture (kept off stderr)
    state: list = field(default_factory=list)      # state.StateBuffer: the buffers forward writes, in order


def decomposition_table():
    table = torch.export.default_decompositions()
    table.update(get_decompositions(EXTRA_DECOMPOSITIONS))
    table[aten._scaled_dot_product_flash_attention_for_cpu.default] = _sdpa_flash_cpu
    return table


def _sdpa_flash_cpu(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    """SDPA as its math parts, keeping the layout the fused CPU op reports: that of ``query`` (torch's own
    decomposition returns an [L, N, H, E]-ordered layout, after which GPT-2's ``.transpose(1, 2)
    .reshape(...)`` + ``.view(-1, d)`` no longer traces). In float32/float64 the scale multiplies the scores,
    not q and k as torch's math kernel does: q, k and v stay plain views of their projection, which GEMMs read
    in place, and the scale fuses into the scores GEMM's epilogue. 16-bit inputs are computed in float32 like
    torch's math kernel; their widening folds into the GEMMs (fuse.fold_copies_into_operands), which read the
    16-bit values directly and accumulate in float32 (the same arithmetic)."""
    if dropout_p != 0.0:
        raise CaptureError("scaled_dot_product_attention with dropout_p != 0 cannot be exported (call eval())")
    if query.size(1) != key.size(1):  # grouped-query attention: each k/v head serves several query heads
        group = query.size(1) // key.size(1)
        key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(query.size(-1)) if scale is None else scale
    dtype = query.dtype
    if dtype in (torch.float16, torch.bfloat16):  # computed in float32, as torch's math kernel does
        query, key, value = query.float(), key.float(), value.float()
        attn_mask = attn_mask.float() if attn_mask is not None and attn_mask.dtype == dtype else attn_mask
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale
    if is_causal:
        keep = torch.ones(query.size(-2), key.size(-2), dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            scores = scores + attn_mask
    attn = torch.softmax(scores, dim=-1)
    return _laid_out_like(torch.matmul(attn, value).to(dtype), query), attn


def _laid_out_like(out: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """``out`` (contiguous) in the memory order of ``query``: the op's meta function returns
    ``torch.empty_like(query)``, and the graph after it was traced against that layout (torch 2.11 records
    ``permute`` + ``view`` where that layout makes the view valid, e.g. in nn.MultiheadAttention). The order is
    the one empty_like computes, from comparisons export already made, so no new guard appears."""
    from torch._prims_common import compute_elementwise_output_logical_to_physical_perm

    perm = compute_elementwise_output_logical_to_physical_perm(query)
    perm = list(perm[0] if isinstance(perm, tuple) else perm)  # (perm, ambiguous) from torch 2.12 on
    if perm == sorted(perm):
        return out.contiguous()
    inverse = [perm.index(d) for d in range(len(perm))]
    return out.permute(perm).contiguous().permute(inverse)


def capture(spec: ModelSpec, cli_dynamic: list[str], fold: bool = True, precision: str | None = None,
            draft: bool = False, kn_weights: bool = False, panel_weights: bool = False) -> Captured:
    """The model as a decomposed program over our dynamic symbols: dynamic.resolve, torch.export (with fixes),
    then relations (bind_symbols, symbol_ranges, collect_guards). ``fold=False`` keeps eval batch norms unfolded
    and linears apart (a training package shares these weights with its training graphs, where each is a
    parameter of its own). ``kn_weights`` (a GPU target's): folding also stores each linear's weight [K, N]
    (weights_kn.py); ``panel_weights`` (a package whose only target is the CPU): as 32-column panels instead
    (weights_panels.py).
    ``precision`` ("bf16", "fp16") captures the model as it computes under autocast (autocast.py): a first
    export at the op level autocast works on, the casts made explicit, then the export every model gets.
    ``draft=True`` (``tcexport --report``) captures with torch.export.draft_export, which goes on past
    data-dependent guards: ``draft_failures`` lists them (torch's FailureReports) and the program is the one the
    example took, so lowering can still list the ops it lacks. Never packaged. ``spec.function`` names the
    module's method captured (a package's methods, front/methods.py; default ``forward``)."""
    if spec.function != "forward":
        spec = dataclasses.replace(spec, module=methods.running(spec.module, spec.function), function="forward")
    return _capture(spec, cli_dynamic, fold, precision, draft, kn_weights, panel_weights)


def _capture(spec: ModelSpec, cli_dynamic: list[str], fold: bool, precision: str | None, draft: bool,
             kn_weights: bool = False, panel_weights: bool = False) -> Captured:
    symbols, places = dynamic.resolve(spec.input_names, spec.example_inputs, spec.dynamic_shapes, cli_dynamic)
    accepted = relations.Accepted()
    declared = dict(symbols)
    reference = None
    if precision is not None:
        first, _ = _export_accepting_fixes(spec, symbols, places, accepted, decompose=False)
        _no_state_under_autocast(first, precision)
        reference = autocast.autocast_module(first, spec.example_inputs, autocast.precision_dtype(precision))
        spec = dataclasses.replace(spec, module=reference)
    torch_log: list[str] = []
    # the buffers' values before tracing: tracing may run a cache's own update on the real tensor (transformers'
    # static layer adds to its length counter when the step has a static length), and state starts from these
    before = {name: b.detach().clone() for name, b in spec.module.named_buffers(remove_duplicate=False)}
    ep, torch_shapes = _export_accepting_fixes(spec, symbols, places, accepted, draft=draft, log=torch_log)
    folded = fold_batchnorm(ep) + concat_linears(ep) + (weights_kn(ep) if kn_weights else []) + \
        (weights_panels(ep) if panel_weights else []) if fold else []
    rename, ours = relations.bind_symbols(ep, spec.input_names, places, symbols, accepted)
    _check_sizes_known(ep, rename, str(spec.path))
    refined, range_guards = relations.symbol_ranges(ep, rename, symbols, ours)
    accepted.notes += relations.range_notes(declared, refined)
    guards = relations.collect_guards(ep, rename, accepted, str(spec.path)) + range_guards
    failures = list(getattr(ep, "_tc_findings", [])) if draft else []
    return Captured(ep, spec.input_names, refined, rename, str(spec.path), guards, accepted.notes, torch_shapes,
                    folded, reference, failures, torch_log, state.state_of(ep, before))


def _no_state_under_autocast(ep, precision: str) -> None:
    """A model that writes its own buffers (a KV cache) cannot take ``--precision``: under autocast its 16-bit
    results would be written into float32 buffers, which torch refuses (index_copy_ needs one dtype)."""
    written = state.written_buffers(ep)
    if written:
        raise CaptureError(f"--precision {precision}: the model writes its buffers in forward ({first_names(written)}"
                           f": state such as a KV cache), and under autocast it "
                           f"would write 16-bit values into float32 buffers. Export the model in that dtype instead "
                           f"(model.to(torch.bfloat16) in model(), so the cache is made in 16 bits too) without "
                           f"--precision.")


MAX_FIX_ROUNDS = 4
MAX_CAPTURES = 8  # _same_program_across: captures of one range split by guards that pick between equal programs


def _export_accepting_fixes(spec: ModelSpec, symbols, places, accepted, decompose: bool = True,
                            draft: bool = False, log: list[str] | None = None):
    """torch.export; when it reports a constraint violation with suggested fixes (a narrower range, a
    divisibility ``seq = 4*_seq``, a relation ``b = a + 1``), accept them, note them, and export again.
    Returns the decomposed program and the dynamic_shapes that worked (the ONNX export reuses them)."""
    with torch_logs.kept(log) as log:  # torch's logs and graph dumps go into the error (or ``log``), not stderr
        for round_ in range(MAX_FIX_ROUNDS):
            shapes = dynamic.to_torch_dynamic_shapes(spec.input_names, spec.example_inputs, symbols, places,
                                                     accepted.rewrites)
            try:
                with torch.no_grad():
                    ep = _exporter(draft)(spec.module, spec.example_inputs, dynamic_shapes=shapes, strict=False)
                    state.lift_buffer_aliases(ep, spec.module)
                    if draft:  # read on the program torch reported about: decomposition renames its symbols
                        ep._tc_findings = _draft_findings(ep, str(spec.path))
                    return _decomposed(ep) if decompose else ep, shapes
            except Exception as e:  # torch's own message explains the constraint or the unsupported construct
                error = e
                log.withhold(e)
                if range_check.violated_symbols(str(e)) and round_ + 1 < MAX_FIX_ROUNDS and not draft:
                    found = _export_checking_range(spec, symbols, places, accepted, str(e), decompose)
                    if found is not None:
                        return found
                if "Suggested fixes:" in str(e) and round_ + 1 < MAX_FIX_ROUNDS:
                    try:
                        relations.accept_fixes(str(e), symbols, places, accepted)
                        continue
                    except SpecializedDimError as s:
                        raise _size_one_example(s, spec) from e
                    except CaptureError:
                        pass
                break
    raise diagnose.capture_error(error, str(spec.path), log.lines) from error


def _export_checking_range(spec: ModelSpec, symbols, places, accepted, message: str, decompose: bool = True):
    """Export again with the symbols torch could not prove a guard for as ``Dim.DYNAMIC`` over their declared
    ranges; keep that capture when every guard holds at every size in the ranges (range_check.py), else None
    (and torch's suggested fix is taken)."""
    trusted = dynamic.plain_symbols(range_check.violated_symbols(message), places, accepted.rewrites)
    if not trusted or any(symbols[n].max is None for n in trusted):
        return None
    shapes = dynamic.to_torch_dynamic_shapes(spec.input_names, spec.example_inputs, symbols, places,
                                             accepted.rewrites, trusted=trusted)
    ep = _recapture(spec, shapes)
    if ep is None:  # this capture fails differently: torch's fix stands
        return None
    if _raised_minimum(ep, spec, symbols, places, trusted):
        deferred = _export_deferring(spec, symbols, places, accepted, trusted, decompose)
        if deferred is not None:
            return deferred
    failing = range_check.failing_guard(ep, range_check.same_sizes(ep, spec.input_names, places, trusted))
    if failing is not None:
        found = _same_program_across(spec, ep, symbols, places, accepted, trusted)
        if found is None:
            return None
        dropped, shown = found
        accepted.dropped |= dropped
        accepted.notes.append(f"{', '.join(trusted)}: torch split the declared range by "
                              f"{', '.join(sorted(shown))}; captures across it gave the same program, "
                              f"so the range stands and the package does not check them")
        return (_decomposed(ep) if decompose else ep), shapes
    accepted.notes.append(f"{', '.join(trusted)}: torch could not prove its guards for the declared range; each "
                          f"was checked at every size in the range and holds, so the range stands")
    return (_decomposed(ep) if decompose else ep), shapes


def _raised_minimum(ep, spec: ModelSpec, symbols, places, trusted) -> bool:
    """Whether the ``Dim.DYNAMIC`` capture starts a trusted symbol above its declared minimum: torch 2.11 gives
    such a symbol size 1 no place in its range (0/1 specialisation), so a package from it refuses one token."""
    names = range_check.user_symbols(ep, spec.input_names, places, trusted)
    for sym, vr in ep.range_constraints.items():
        user = names.get(sympy.sympify(sym))
        if user is not None and vr.lower.is_finite and int(vr.lower) > max(symbols[user.name].min, 0):
            return True
    return False


def _export_deferring(spec: ModelSpec, symbols, places, accepted, trusted, decompose: bool):
    """Export with the declared ``Dim``s and the guards torch cannot prove deferred to runtime asserts (torch
    2.11 raises ``min(16*seq, 32*seq) == 16*seq`` for grouped-query attention and cannot prove it; it holds for
    every size). Keep the capture when every guard and assert holds at every size of the declared ranges (the
    package still checks the asserts, as it checks any), else None."""
    shapes = dynamic.to_torch_dynamic_shapes(spec.input_names, spec.example_inputs, symbols, places,
                                             accepted.rewrites)
    ep = _recapture(spec, shapes, prefer_deferred_runtime_asserts_over_guards=True)
    if ep is None or range_check.failing_guard(ep) is not None or \
            _raised_minimum(ep, spec, symbols, places, trusted):
        return None  # it fails differently, or a guard fails somewhere: the Dim.DYNAMIC capture stands
    accepted.notes.append(f"{', '.join(trusted)}: torch could not prove its guards for the declared range; "
                          f"exported with them as runtime asserts, each checked at every size in the range, where "
                          f"it holds, so the range stands")
    return (_decomposed(ep) if decompose else ep), shapes


def _recapture(spec: ModelSpec, shapes, **options):
    """torch.export of the model at its example inputs with these dynamic shapes (buffer aliases lifted, as the
    first capture's are), or None where it fails: the range checks' further captures."""
    try:
        with torch.no_grad():
            ep = torch.export.export(spec.module, spec.example_inputs, dynamic_shapes=shapes, strict=False,
                                     **options)
            state.lift_buffer_aliases(ep, spec.module)
    except Exception:  # the caller keeps what it had
        return None
    return ep


def _same_program_across(spec: ModelSpec, ep, symbols, places, accepted, trusted) -> tuple[set, set] | None:
    """The guards of ``ep`` that fail somewhere in the declared ranges, in torch's text and over the user's
    symbols (for the note), when exporting again at sizes where they fail (up to MAX_CAPTURES captures in all)
    gives the same graph each time and every size meets one capture's guards; else None (range_check.py: a guard
    that only picks between identical programs, as torch 2.11's pooling asks ``(size - 1) % 2 != 0``)."""
    names = range_check.user_symbols(ep, spec.input_names, places, trusted)
    guards = range_check.guards_over(ep, names)
    ranges = {n: (max(symbols[n].min, 0), symbols[n].max) for n in trusted}
    if guards is None:
        return None
    seen = [guards]  # one capture per region; several ceil-mode pools (SqueezeNet: three) split it more than once
    while True:
        try:
            point = range_check.uncovered(seen, ranges)
        except ValueError:
            return None
        if point is None:
            break
        if len(seen) == MAX_CAPTURES:
            return None
        inputs = tuple(range_check.resized(t, {d: point[text] for d, text in places.get(name, {}).items()
                                               if text in point}) if isinstance(t, torch.Tensor) else t
                       for name, t in zip(spec.input_names, spec.example_inputs))
        shapes = dynamic.to_torch_dynamic_shapes(spec.input_names, inputs, symbols, places, accepted.rewrites,
                                                 trusted=trusted)
        try:
            with torch.no_grad():
                other = torch.export.export(spec.module, inputs, dynamic_shapes=shapes, strict=False)
        except Exception:  # the other side does not capture: the guard matters
            return None
        other_guards = range_check.guards_over(other, range_check.user_symbols(other, spec.input_names, places,
                                                                                 trusted))
        if other_guards is None or other.graph_module.code != ep.graph_module.code:
            return None
        seen.append(other_guards)
    env = range_check.shape_env_of(ep)
    split = [g.expr for g in env.guards
             if g.expr.free_symbols and not range_check.holds_on(g.expr.xreplace(names), ranges)]
    return {str(e) for e in split}, {str(e.xreplace(names)) for e in split}


def _exporter(draft: bool):
    if not draft:
        return torch.export.export
    try:
        return torch.export.draft_export
    except AttributeError:  # torch before 2.7
        raise CaptureError(f"--report needs torch.export.draft_export (torch 2.7 or newer); this is torch "
                           f"{torch.__version__}. Export without --report to see the first problem.") from None


def _draft_findings(ep, model_file: str) -> list[dict]:
    """torch's draft export report as plain records: ``kind`` (torch's failure type, e.g.
    DATA_DEPENDENT_ERROR), ``expr``, ``stack`` (the user stack's frames: file, line, name, code) and ``text``.
    torch does not always record the user stack (its frame filter can drop every frame); the line is then the
    one of the graph node that made the expression's data-dependent symbol (``item()`` and friends)."""
    report = getattr(ep, "_report", None)
    names = getattr(report, "str_to_filename", None) or {}
    out = []
    for f in getattr(report, "failures", None) or []:
        data = f.data if isinstance(getattr(f, "data", None), dict) else {}
        stack = [{"file": str(names.get(fr.get("filename"), fr.get("filename"))), "line": fr.get("line"),
                  "name": fr.get("name"), "code": (fr.get("loc") or "").strip()}
                 for fr in data.get("user_stack") or [] if isinstance(fr, dict)]
        kind = getattr(f.failure_type, "name", str(f.failure_type))
        expr = str(data.get("expr", "?"))
        mine = [fr for fr in stack if Path(fr["file"]).name == Path(model_file).name]
        stack = mine or _defining_frames(ep, expr, model_file) or _quoted_frames(data, model_file) or stack
        out.append({"kind": kind, "expr": expr, "stack": stack, "text": str(f)})
    return out


def _quoted_frames(data: dict, model_file: str) -> list[dict]:
    """The model file's line whose code torch quoted in the failure's ``frame_locals`` (``loc``)."""
    locals_ = data.get("frame_locals")
    loc = (locals_.get("loc") if isinstance(locals_, dict) else None) or ""
    try:
        lines = Path(model_file).read_text().splitlines()
    except OSError:
        return []
    hits = [k for k, text in enumerate(lines, 1) if loc.strip() and text.strip() == loc.strip()]
    return [{"file": model_file, "line": hits[0], "name": "?", "code": loc.strip()}] if len(hits) == 1 else []


def _defining_frames(ep, expr: str, model_file: str) -> list[dict]:
    """The frames of the nodes whose value is one of ``expr``'s symbols (u0, zuf0: made by ``item()``)."""
    names = set(re.findall(r"\b[a-z]*u[a-z]*\d+\b", expr))
    frames = []
    for n in ep.graph.nodes:
        val = n.meta.get("val")
        node = getattr(val, "node", None)
        if node is not None and str(getattr(node, "expr", "")) in names:
            frame = frame_of(n, model_file)
            if frame is not None:
                frames.append({"file": frame[0], "line": frame[1], "name": frame[2], "code": frame[3]})
    return frames


def _decomposed(ep):
    out = ep.run_decompositions(decomposition_table())
    if hasattr(ep, "_tc_findings"):  # draft export's findings ride on the program
        out._tc_findings = ep._tc_findings
    return out


def _size_one_example(e: SpecializedDimError, spec: ModelSpec) -> SpecializedDimError:
    """A dim "fixed to the constant 1" whose example size is 1: the example is at fault, not the model code."""
    if e.value != 1 or e.input not in spec.input_names or e.dim is None:
        return e
    example = spec.example_inputs[spec.input_names.index(e.input)]
    if not isinstance(example, torch.Tensor) or e.dim >= example.dim() or example.shape[e.dim] != 1:
        return e
    return ExampleSizeOneError(
        f"input {e.input!r} dim {e.dim} is declared dynamic as {e.symbol!r}, but the example input has size 1 "
        f"there; torch.export treats a size-1 example dim as the constant 1 (it broadcasts), so it cannot stay "
        f"dynamic. Fix: use an example batch of at least 2 (make example_inputs() return size 2 or more in "
        f"{e.input}.{e.dim}).", input=e.input, dim=e.dim, symbol=e.symbol, reason=e.reason)


def _check_sizes_known(ep, rename, model_file: str | None = None) -> None:
    """Every size is over the declared dims: a size from the data (``nonzero()``, ``x[mask]``, ``unique()``) is
    a DataDependentError at the user's line."""
    for n in ep.graph.nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            for s in val.shape:
                if isinstance(s, torch.SymInt):
                    for free in s.node.expr.free_symbols:
                        if free not in rename:
                            raise _data_sized(n, free, model_file)


def _data_sized(node, free, model_file: str | None) -> DataDependentError:
    file, line, fn, code = frame_of(node, model_file) or (None, None, None, None)
    where = f"{file}:{line} in {fn}: {code}" if file else f"node {node.name} (torch recorded no source line)"
    fixes = ("keep the shape fixed: a mask multiplied in (x * mask) or torch.where(mask, x, 0) instead of "
             "selecting with it", "or move the selection out of forward(): do it on the model's outputs")
    return DataDependentError(
        f"cannot export a tensor whose size depends on the data ({free}, from {node.target}), which is not one "
        f"of the dynamic dims you declared\n  at {where}\nA package's sizes come from its input shapes. Fix:\n"
        + "\n".join(f"  - {f}" for f in fixes), file=file, line=line, code=code, expr=str(free), fixes=fixes)


def to_sympy(x, rename) -> sympy.Expr:
    """A size from a torch value (int or SymInt) as a sympy expression over our symbols."""
    if isinstance(x, torch.SymInt):
        return relations.subst(x.node.expr, rename)
    if isinstance(x, (int, sympy.Expr)):
        return relations.subst(x, rename) if isinstance(x, sympy.Expr) else sympy.Integer(x)
    raise TypeError(f"not a size: {x!r}")
