"""The lowering walk and the context a rule receives: the decomposed FX graph -> a loop-IR Program, one node per
op; views become index arithmetic.

The walk looks each op up in the rule table it is given (rules.RuleTable, composed per pipeline in core.py). A
rule receives the Lowering context and the op's arguments (FX nodes replaced by TensorRefs, sizes by sympy
expressions over our symbols, via capture.to_sympy) and returns a TensorRef. values.py holds the helpers rules share.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, replace

import sympy
import torch
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils._sympy.functions import FloorDiv

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.front.capture import Captured, to_sympy
from tcexport.exporter.front.source_line import frame_of, source_of
from tcexport.exporter.errors import CaptureError, UnsupportedOpError, unsupported_ops_error
from tcexport.exporter.lower.rules import RuleTable

TORCH_DTYPES = {
    torch.float64: "float64", torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8",
    torch.bool: "bool",
}

@dataclass(frozen=True)
class TensorRef:
    """A tensor as lowering sees it: a view of a buffer. ``index`` gives the buffer index for the view
    position (i0, i1, ...); a contiguous full view has index == (i0, i1, ...)."""

    buffer: ir.Buffer
    shape: tuple
    index: tuple

    @property
    def dtype(self) -> str:
        return self.buffer.dtype

    def load(self, idx) -> ir.Load:
        mapping = {ir.ivar(k): sympy.sympify(e) for k, e in enumerate(idx)}
        return ir.Load(self.dtype, self.buffer.name,
                       tuple(sympy.sympify(e).xreplace(mapping) for e in self.index))

    def is_identity(self) -> bool:
        return tuple(self.index) == tuple(ir.ivar(k) for k in range(len(self.shape))) \
            and tuple(self.shape) == tuple(self.buffer.shape)


def identity_ref(buf: ir.Buffer) -> TensorRef:
    return TensorRef(buf, tuple(buf.shape), tuple(ir.ivar(k) for k in range(len(buf.shape))))


def torch_dtype_name(dtype) -> str:
    try:
        return TORCH_DTYPES[dtype]
    except KeyError:
        raise UnsupportedOpError(f"dtype {dtype} is not supported yet (supported: {sorted(TORCH_DTYPES.values())})",
                                 op=str(dtype)) from None


class Lowering:
    """One lowering of one captured graph with one rule table: the buffers and nodes built so far, and the FX
    node being lowered (for error messages and each IR node's source line)."""

    def __init__(self, captured: Captured, rules: RuleTable):
        self.cap = captured
        self.rules = rules
        self.buffers: dict[str, ir.Buffer] = {}
        self.nodes: list[ir.Node] = []
        self.current: torch.fx.Node | None = None
        self.public_names: dict[str, str] = {}  # buffer name -> the name users see (input, weight key, output)
        self.weight_values: dict[str, torch.Tensor] = {}
        self._count = 0

    # --- building blocks used by the op rules -------------------------------------------------------------

    def fresh(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def new_buffer(self, dtype: str, shape, kind: str = "temp", name: str | None = None) -> ir.Buffer:
        name = name or self.fresh("buf")
        buf = ir.Buffer(name, dtype, tuple(sympy.sympify(s) for s in shape), kind)
        self.buffers[name] = buf
        return buf

    def source(self) -> str | None:
        return source_of(self.current, self.cap.model_file) if self.current is not None else None

    def pointwise(self, shape, dtype: str, body: ir.Value) -> TensorRef:
        """A node computing ``body`` (a value over i0, i1, ...) at every position of ``shape``."""
        buf = self.new_buffer(dtype, shape)
        self.nodes.append(ir.Node(self.fresh("n"), "pointwise", buf, body=body, source=self.source()))
        return identity_ref(buf)

    def reduction(self, shape, dtype: str, op: str, reduce_ranges, body: ir.Value) -> TensorRef:
        buf = self.new_buffer(dtype, shape)
        self.nodes.append(ir.Node(self.fresh("n"), "reduction", buf, body=body, reduce_op=op,
                                  reduce_ranges=tuple(reduce_ranges), source=self.source()))
        return identity_ref(buf)

    def realize(self, ref: TensorRef) -> TensorRef:
        """A contiguous copy of a view (for consumers that need real strides, e.g. GEMM or outputs)."""
        idx = tuple(ir.ivar(k) for k in range(len(ref.shape)))
        return self.pointwise(ref.shape, ref.dtype, ref.load(idx))

    def unsupported(self, what: str, op: str | None = None) -> UnsupportedOpError:
        """The error for ``what`` at the node being lowered; ``op`` is the op's name (default: ``what``)."""
        frame = frame_of(self.current, self.cap.model_file) if self.current is not None else None
        src = self.source()
        where = f"\n  at {src}" if src else ""
        return UnsupportedOpError(f"cannot export {what}{where}\nThis op (or this use of it) has no lowering yet; "
                                  f"rewrite that line with supported ops or file an issue with this message.",
                                  op=op or what, source=src, file=frame[0] if frame else None,
                                  line=frame[1] if frame else None)

    # --- the walk -----------------------------------------------------------------------------------------

    def run(self) -> ir.Program:
        ep = self.cap.program
        env: dict = {}
        inputs, weights = [], []
        kinds = {s.arg.name: s for s in ep.graph_signature.input_specs}
        state_names = [b.name for b in self.cap.state]
        states: dict[str, ir.Buffer] = {}  # state name -> its input buffer (two placeholders may name one buffer)
        user_k = 0
        missing: list[UnsupportedOpError] = []
        skipped = assert_only(ep.graph)
        for node in ep.graph.nodes:
            if node in skipped:
                continue
            self.current = node
            if node.op == "placeholder":
                spec = kinds[node.name]
                val = node.meta["val"]
                shape = tuple(to_sympy(s, self.cap.rename) for s in val.shape)
                dtype = torch_dtype_name(val.dtype)
                if spec.kind == InputKind.USER_INPUT:
                    name = self.cap.input_names[user_k] if user_k < len(self.cap.input_names) else node.name
                    user_k += 1
                    buf = self.new_buffer(dtype, shape, "input", name=_c_name("in_", name))
                    inputs.append(buf.name)
                    self.public_names[buf.name] = name
                elif spec.kind == InputKind.BUFFER and spec.target in state_names:
                    buf = states.get(spec.target)
                    if buf is None:
                        buf = states[spec.target] = self.new_buffer(dtype, shape, "input",
                                                                    name=_c_name("state_", spec.target))
                        self.public_names[buf.name] = spec.target
                elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                    key = spec.target
                    tensor = ep.state_dict.get(key) if key in ep.state_dict else ep.constants.get(key)
                    if tensor is None:
                        raise CaptureError(f"weight {key!r} has no value in the exported program")
                    buf = self.new_buffer(dtype, shape, "weight", name=_c_name("w_", key))
                    weights.append(buf.name)
                    self.public_names[buf.name] = key
                    self.weight_values[buf.name] = tensor.detach()
                else:
                    raise self.unsupported(f"input of kind {spec.kind.name} ({node.name})")
                env[node] = identity_ref(buf)
            elif node.op == "call_function":
                env[node] = self.call_or_note(node, env, missing)
            elif node.op == "output":
                if missing:  # every unsupported op at once, each with its line, not only the first
                    raise unsupported_ops_error(missing)
                outputs = self.finish_outputs(node, env)
        self.current = None
        inputs += [states[name].name for name in state_names]  # the ABI: the model's inputs, then its state
        prog = ir.Program(self.buffers, self.nodes, inputs, weights, outputs)
        eliminate_dead_nodes(prog)
        return prog

    def call_or_note(self, node: torch.fx.Node, env, missing: list):
        """``call``; an unsupported op is noted in ``missing`` and the walk goes on (what depends on it is
        skipped: it cannot be lowered without its input), so one error can name every unsupported op."""
        if any(isinstance(a, torch.fx.Node) and env.get(a) is _MISSING for a in node.all_input_nodes):
            return _MISSING
        try:
            return self.call(node, env)
        except UnsupportedOpError as e:
            missing.extend(e.ops)
            return _MISSING

    def call(self, node: torch.fx.Node, env):
        def resolve(a):
            if isinstance(a, torch.fx.Node):
                return env[a]
            if isinstance(a, (list, tuple)):
                return type(a)(resolve(x) for x in a)
            if isinstance(a, torch.SymInt):
                return to_sympy(a, self.cap.rename)
            return a

        args, kwargs = resolve(node.args), {k: resolve(v) for k, v in node.kwargs.items()}
        target = node.target
        if target in _SYM_OPS:
            return _SYM_OPS[target](*args)
        rule = self.rules.lookup(target)
        if rule is None:
            raise self.unsupported(f"op {_op_name(target)}", _op_name(target))
        val = node.meta.get("val")
        try:
            return rule(self, node, val, *args, **kwargs)
        except UnsupportedOpError:
            raise
        except NotImplementedError as e:
            raise self.unsupported(f"op {_op_name(target)} ({e})", _op_name(target)) from e

    def finish_outputs(self, node, env) -> list[str]:
        ep = self.cap.program
        specs = ep.graph_signature.output_specs
        for s in specs:
            if s.kind not in (OutputKind.USER_OUTPUT, OutputKind.BUFFER_MUTATION):
                raise self.unsupported(f"output of kind {s.kind.name} (in-place mutation of a model input; "
                                       "write into a registered buffer instead, which becomes the package's state)")
        values = [env[a] if isinstance(a, torch.fx.Node) else a for a in node.args[0]]
        user = [v for s, v in zip(specs, values) if s.kind == OutputKind.USER_OUTPUT]
        written = {s.target: v for s, v in zip(specs, values) if s.kind == OutputKind.BUFFER_MUTATION}
        # the ABI: the model's outputs, then the state's new values in the order of the state inputs
        refs = user + [written[b.name] for b in self.cap.state]
        public = ["output" if len(user) == 1 else f"output{k}" for k in range(len(user))] + \
            [b.name for b in self.cap.state]
        names, used = [], set()
        for k, (ref, out_name) in enumerate(zip(refs, public)):
            if not isinstance(ref, TensorRef):
                raise self.unsupported(f"non-tensor output #{k} ({type(ref).__name__})")
            prefix = "out_" if k < len(user) else "state_out_"
            if not ref.is_identity() or ref.buffer.kind != "temp" or ref.buffer.name in used:
                ref = self.realize(ref)
            buf, old = ref.buffer, ref.buffer.name
            del self.buffers[old]
            buf.name, buf.kind = _c_name(prefix, out_name), "output"
            self.buffers[buf.name] = buf
            _rename_loads(self.nodes, old, buf.name)
            names.append(buf.name)
            used.add(buf.name)
            self.public_names[buf.name] = out_name
        return names


_MISSING = object()  # the value of a node that could not be lowered (an unsupported op, or fed by one)


def _rename_loads(nodes, old: str, new: str) -> None:
    """Every read of buffer ``old`` now reads ``new``: in node bodies and in GEMM operands (an output that a
    later GEMM also reads: attention probabilities returned, a training forward's saved activations)."""
    for n in nodes:
        if n.body is not None:
            n.body = ir.rename_buffer(n.body, old, new)
        if n.gemm is not None:
            for side in ("a", "b"):
                op = getattr(n.gemm, side)
                if op.buffer == old:
                    setattr(n.gemm, side, replace(op, buffer=new))


def _c_name(prefix: str, name: str) -> str:
    return prefix + re.sub(r"[^A-Za-z0-9_]", "_", name)


def _op_name(target) -> str:
    name = getattr(target, "__name__", str(target))
    ns = getattr(target, "namespace", None)
    return f"{ns}.{name}" if ns else str(target)


_SYM_OPS = {
    torch.ops.aten.sym_size.int: lambda ref, d: ref.shape[d],
    operator.add: lambda a, b: a + b, operator.sub: lambda a, b: a - b, operator.mul: lambda a, b: a * b,
    operator.floordiv: lambda a, b: FloorDiv(a, b), operator.neg: lambda a: -a,
    operator.getitem: lambda a, k: a[k],
    torch.sym_float: lambda a: a,  # a size used as a float (layer_norm over a symbolic dim): still exact
    # a ratio of sizes (interpolate to a symbolic size: its scale): an exact rational, rounded where it is used
    operator.truediv: lambda a, b: sympy.sympify(a) / sympy.sympify(b),
    torch.sym_min: lambda a, b: sympy.Min(a, b), torch.sym_max: lambda a, b: sympy.Max(a, b),
}
_ASSERTS = (torch.ops.aten._assert_scalar.default,)


def assert_only(graph: torch.fx.Graph) -> set:
    """The runtime asserts, and the size arithmetic that feeds only them or nothing (what an assert torch deferred
    computes, front/capture.py _export_deferring; decomposition may drop the assert and leave its inputs). The
    package checks those asserts as guards (relations.collect_guards), so nothing of them is lowered."""
    out = set()
    for node in reversed(graph.nodes):
        if node.op == "call_function" and (node.target in _ASSERTS or
                                           (all(u in out for u in node.users)
                                            and not isinstance(node.meta.get("val"), torch.Tensor))):
            out.add(node)
    return out


def eliminate_dead_nodes(prog: ir.Program) -> None:
    live = set(prog.outputs)
    keep = []
    for n in reversed(prog.nodes):
        if n.out.name in live:
            keep.append(n)
            live |= n.inputs()
    prog.nodes[:] = list(reversed(keep))
    written = {n.out.name for n in prog.nodes} | set(prog.inputs) | set(prog.weights)
    for name in list(prog.buffers):
        if name not in written:
            del prog.buffers[name]
