"""Methods: several named entry points of one model, each captured as a graph of its own (formats/methods.py).

Prefill (over a prompt) and decode (over one token) want different kernels. A model file declares them as

    methods = {"prefill": {"example_inputs": (ids, positions), "dynamic_shapes": {...}},
               "decode": {"example_inputs": (ids[:, :1], positions[:1]), "function": "step"}}

(``tcexport.exporter.export(..., methods=...)`` takes the same dict): each method's example inputs, optionally its
dynamic shapes and the model's method it runs (``function``, default ``forward``). Each is captured on its own,
with its own symbols, ranges and guards; the package stores the weights once and keeps one state for all of them.
Checked here, before anything is captured, so a mistake is a MethodError naming the method and the fix.
"""

from __future__ import annotations

import inspect
import keyword
import types
from dataclasses import dataclass

import torch

from tcexport.exporter.errors import MethodError

KEYS = ("example_inputs", "dynamic_shapes", "function")
RESERVED = ("inference", "backward")  # the package's graph names (formats/methods.py); "forward" comes first
FIRST = "forward"  # the method a plain call of the package runs, and so the first when declared


@dataclass(frozen=True)
class MethodSpec:
    """One declared method: its name, the model's function it runs, its example inputs (a tuple of tensors), their
    names (the function's parameters) and its dynamic shapes (as a model file's ``dynamic_shapes``, or None)."""

    name: str
    function: str
    example_inputs: tuple
    input_names: tuple
    dynamic_shapes: dict | None


def parse_methods(module: torch.nn.Module, methods, where: str = "methods") -> tuple:
    """``methods`` (name -> declaration) checked, as MethodSpecs: ``forward`` first when declared, the others in
    declaration order (the first is the package's ``inference`` graph, SPEC §2c)."""
    if callable(methods):
        methods = methods()
    if not isinstance(methods, dict) or not methods:
        raise MethodError(f"{where} should be a non-empty dict from method name to {{'example_inputs': ..., "
                          f"'dynamic_shapes': ... (optional), 'function': ... (optional)}}, found "
                          f"{type(methods).__name__}", expected="dict", got=type(methods).__name__)
    specs = [_method(module, name, d, where) for name, d in methods.items()]
    return tuple(sorted(specs, key=lambda s: s.name != FIRST))


def _method(module: torch.nn.Module, name, d, where: str) -> MethodSpec:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) or len(name) > 200:
        raise MethodError(f"{where}: method name {name!r} should be a Python identifier (it names the package's "
                          f"entry point, m.methods[name]); rename it, e.g. 'prefill'", method=str(name),
                          expected="an identifier", got=name)
    if name in RESERVED:
        raise MethodError(f"{where}: method name {name!r} is reserved (a graph name of every package); rename it",
                          method=name, expected=f"not one of {list(RESERVED)}", got=name)
    here = f"{where}[{name!r}]"
    if not isinstance(d, dict):
        raise MethodError(f"{here} should be a dict with 'example_inputs' (and optionally 'dynamic_shapes', "
                          f"'function'), found {type(d).__name__}", method=name, expected="dict",
                          got=type(d).__name__)
    unknown = sorted(set(d) - set(KEYS))
    if unknown:
        raise MethodError(f"{here} has unknown key(s) {unknown}; a method takes {list(KEYS)}", method=name,
                          expected=list(KEYS), got=unknown)
    function = d.get("function", "forward")
    fn = getattr(module, function, None) if isinstance(function, str) else None
    if not callable(fn):
        raise MethodError(f"{here}: 'function' {function!r} is not a method of {type(module).__name__}; name one "
                          f"of the model's methods (default 'forward')", method=name, expected="a method name",
                          got=function)
    examples = d.get("example_inputs")
    if callable(examples):
        examples = examples()
    if isinstance(examples, torch.Tensor):
        examples = (examples,)
    if not isinstance(examples, (tuple, list)) or not examples \
            or not all(isinstance(t, torch.Tensor) for t in examples):
        raise MethodError(f"{here}: 'example_inputs' should be a non-empty tuple of tensors (one per argument of "
                          f"{function}()), found {type(examples).__name__}", method=name,
                          expected="tuple of tensors", got=type(examples).__name__)
    dyn = d.get("dynamic_shapes")
    if callable(dyn):
        dyn = dyn()
    if dyn is not None and not isinstance(dyn, dict):
        raise MethodError(f"{here}: 'dynamic_shapes' should be a dict from input name to {{dim: symbol}}, found "
                          f"{type(dyn).__name__}", method=name, expected="dict", got=type(dyn).__name__)
    return MethodSpec(name, function, tuple(examples), tuple(_input_names(fn, len(examples))), dyn)


def _input_names(fn, n: int) -> list[str]:
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params[:n]]
    return names + [f"input{k}" for k in range(len(names), n)]


def running(module: torch.nn.Module, function: str) -> torch.nn.Module:
    """What torch.export captures for method ``function`` of ``module``: the module itself for ``forward``, else a
    module whose forward calls ``module.<function>`` and which shares the module's parameters, buffers and
    submodules (the same dicts), so every name is the model's own (what lets the methods share weights and state
    by name) and ``function`` may call ``self.forward`` (the model's). Nothing of ``module`` changes.

    torch.export keeps only frames named ``forward`` in a node's stack trace, which is where an error finds the
    user's line; so the function runs as a copy of itself whose code is named ``forward`` (same file, same lines),
    and an op it cannot lower is reported at its own line, not at the call below."""
    if function == "forward":
        return module
    bound = getattr(module, function)
    signature = inspect.signature(bound)
    bound = _as_forward(bound)

    def forward(self, *args, **kwargs):
        return bound(*args, **kwargs)

    first = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    forward.__signature__ = signature.replace(parameters=[first, *signature.parameters.values()])
    cls = type(f"{type(module).__name__}_{function}", (torch.nn.Module,), {"forward": forward})
    view = cls.__new__(cls)
    view.__dict__.update({k: v for k, v in module.__dict__.items() if k != "forward"})
    return view


def _as_forward(bound):
    """``bound`` (a method of the model) with its code renamed ``forward``; anything else as it is."""
    fn = getattr(bound, "__func__", None)
    code = getattr(fn, "__code__", None)
    if not isinstance(fn, types.FunctionType) or code is None:
        return bound
    renamed = types.FunctionType(code.replace(co_name="forward"), fn.__globals__, fn.__name__, fn.__defaults__,
                                 fn.__closure__)
    renamed.__kwdefaults__ = fn.__kwdefaults__
    return types.MethodType(renamed, bound.__self__)


def split_dynamic(cli: list[str], names: tuple) -> dict[str, list[str]]:
    """``--dynamic`` strings per method: a plain SPEC applies to every method, ``METHOD:SPEC`` to that one
    (a SPEC's own ``:`` follows an ``=``, so the forms never meet)."""
    out: dict[str, list[str]] = {n: [] for n in names}
    for text in cli:
        head, colon, rest = text.partition(":")
        qualified = colon and head.strip().isidentifier()
        if not qualified:
            for n in names:
                out[n].append(text)
            continue
        method = head.strip()
        if not names:
            raise MethodError(f"--dynamic {text!r} names method {method!r}, but the model declares no methods; drop "
                              f"'{method}:' (a plain --dynamic SPEC applies to the model's forward)", method=method,
                              expected="no method prefix", got=method)
        if method not in out:
            raise MethodError(f"--dynamic {text!r} names method {method!r}; the methods are {list(names)}. Use "
                              f"--dynamic METHOD:SPEC with one of them, or a plain SPEC for every method",
                              method=method, expected=list(names), got=method)
        out[method].append(rest)
    return out


def check_shared_buffers(captured: dict) -> None:
    """Methods share one state by buffer name: a buffer one method writes (state) and another reads without writing
    would be a weight there, frozen at its export-time value while the state moves on, so it is refused, naming
    both methods. ``captured``: method name -> front.capture.Captured."""
    from torch.export.graph_signature import InputKind

    written = {b.name: name for name, c in captured.items() for b in c.state}
    initial = {b.name: (name, b.initial) for name, c in reversed(list(captured.items())) for b in c.state}
    for name, c in captured.items():
        for b in c.state:
            first, value = initial[b.name]
            if value.dtype != b.initial.dtype or value.shape != b.initial.shape or not torch.equal(value, b.initial):
                raise MethodError(f"buffer {b.name!r} starts from other values in method {name!r} than in method "
                                  f"{first!r} (its capture changed it?); methods share one state, which starts from "
                                  f"one value. Report this with the model", method=name, expected=first, got=name)
    for name, c in captured.items():
        own = {b.name for b in c.state}
        for s in c.program.graph_signature.input_specs:
            if s.kind == InputKind.BUFFER and s.target in written and s.target not in own:
                raise MethodError(f"buffer {s.target!r} is state in method {written[s.target]!r} (it writes it) but "
                                  f"method {name!r} only reads it, so it would read the value at export time, not "
                                  f"the session's. Make {name!r} write it too, or stop {written[s.target]!r} writing it",
                                  method=name, expected="written by every method that reads it", got=s.target)


class kept_buffers:
    """``with kept_buffers(module):`` puts every buffer of ``module`` back to the value it had when this was made
    (on leaving, however the block ends): tracing a method may run code that moves a buffer for real (a cache's
    length counter), and every method's state must start from the model's own values. Reusable: one instance
    serves every method's capture."""

    def __init__(self, module: torch.nn.Module):
        self._saved = [(b, b.detach().clone()) for _, b in module.named_buffers(remove_duplicate=True)]

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        with torch.no_grad():
            for b, value in self._saved:
                if b.shape == value.shape and b.dtype == value.dtype:
                    b.copy_(value)
