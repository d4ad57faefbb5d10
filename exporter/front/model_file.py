"""Load a user's MODEL.py: ``model()`` (or a module instance ``model``), ``example_inputs()``, ``dynamic_shapes``,
or instead of the last two ``methods`` (several named entry points, front/methods.py).

Errors in the file are reported as ModelFileError naming the file and the missing or mistyped name, never as a
traceback from deep inside the exporter.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import dataclasses

import torch

from tcexport.exporter.errors import MethodError, ModelFileError
from tcexport.exporter.front.methods import MethodSpec, parse_methods


@dataclass
class ModelSpec:
    path: Path
    module: torch.nn.Module
    example_inputs: tuple
    input_names: list[str]
    dynamic_shapes: dict | None  # input name -> {dim: "sym" | ("sym", min, max)}
    methods: tuple = ()          # MethodSpec per declared method (the fields above are the first's), or ()
    function: str = "forward"    # the module's method this spec captures

    def for_method(self, m: MethodSpec) -> "ModelSpec":
        """The spec that captures method ``m`` (its examples, names, dynamic shapes and function)."""
        return dataclasses.replace(self, example_inputs=m.example_inputs, input_names=list(m.input_names),
                                   dynamic_shapes=m.dynamic_shapes, function=m.function, methods=())

    def __post_init__(self):
        # a view (``base[:2]``) makes torch.export add symbols for its storage; only shapes and values matter here
        self.example_inputs = tuple(x.contiguous().clone() if isinstance(x, torch.Tensor) and x._base is not None
                                    else x for x in self.example_inputs)


def _import_file(path: Path):
    if not path.is_file():
        raise ModelFileError(f"{path}: no such file. Pass the path of a Python file that defines model() "
                             f"and example_inputs().")
    name = f"_tcexport_model_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ModelFileError(f"{path}: cannot be imported as a Python module (is it a .py file?)")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception as e:  # the user's code: report its own traceback, trimmed to their frames
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__.tb_next))
        raise ModelFileError(f"{path}: importing the model file failed:\n{tb}") from e
    return mod


def forward_input_names(module: torch.nn.Module, n: int) -> list[str]:
    """Names of forward()'s positional parameters, used for `--dynamic name.dim` and loader signatures."""
    try:
        params = [p for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params[:n]]
    return names + [f"input{k}" for k in range(len(names), n)]


def load_model_file(path: str | Path) -> ModelSpec:
    path = Path(path)
    mod = _import_file(path)
    if not hasattr(mod, "model"):
        raise ModelFileError(f"{path}: defines no `model`. Add `def model() -> torch.nn.Module` "
                             f"(or a module instance named `model`).")
    obj = mod.model
    if not isinstance(obj, torch.nn.Module):
        if not callable(obj):
            raise ModelFileError(f"{path}: `model` should be an nn.Module or a function returning one, "
                                 f"found {type(obj).__name__}")
        try:
            obj = obj()
        except Exception as e:
            raise ModelFileError(f"{path}: calling model() raised {type(e).__name__}: {e}") from e
        if not isinstance(obj, torch.nn.Module):
            raise ModelFileError(f"{path}: model() should return a torch.nn.Module, returned {type(obj).__name__}")
    if hasattr(mod, "methods"):
        return _with_methods(path, mod, obj.eval())
    if not hasattr(mod, "example_inputs"):
        raise ModelFileError(f"{path}: defines no `example_inputs`. Add `def example_inputs() -> tuple` "
                             f"returning one tensor per forward() argument.")
    ex = mod.example_inputs
    if callable(ex):
        try:
            ex = ex()
        except Exception as e:
            raise ModelFileError(f"{path}: calling example_inputs() raised {type(e).__name__}: {e}") from e
    if isinstance(ex, torch.Tensor):
        ex = (ex,)
    if not isinstance(ex, (tuple, list)) or not ex:
        raise ModelFileError(f"{path}: example_inputs() should return a non-empty tuple of tensors, "
                             f"returned {type(ex).__name__}")
    for k, t in enumerate(ex):
        if not isinstance(t, torch.Tensor):
            raise ModelFileError(f"{path}: example_inputs()[{k}] should be a torch.Tensor, found {type(t).__name__}")
    dyn = getattr(mod, "dynamic_shapes", None)
    if callable(dyn):
        dyn = dyn()
    if dyn is not None and not isinstance(dyn, dict):
        raise ModelFileError(f"{path}: dynamic_shapes should be a dict from input name to {{dim: symbol}}, "
                             f"found {type(dyn).__name__}")
    return ModelSpec(path=path, module=obj.eval(), example_inputs=tuple(ex),
                     input_names=forward_input_names(obj, len(ex)), dynamic_shapes=dyn)


def _with_methods(path: Path, mod, module: torch.nn.Module) -> ModelSpec:
    """A model file declaring ``methods``: its ``example_inputs``/``dynamic_shapes`` would describe no method, so
    they are an error rather than silently ignored."""
    both = [name for name in ("example_inputs", "dynamic_shapes") if hasattr(mod, name)]
    if both:
        raise MethodError(f"{path}: defines `methods` and {' and '.join(f'`{n}`' for n in both)}; with methods each "
                          f"method declares its own (methods = {{'forward': {{'example_inputs': ..., "
                          f"'dynamic_shapes': ...}}, ...}}). Move them into a method or drop them.",
                          expected="methods alone", got=both)
    methods = parse_methods(module, mod.methods, f"{path}: methods")
    return with_methods(ModelSpec(path=path, module=module, example_inputs=methods[0].example_inputs,
                                  input_names=[], dynamic_shapes=None), methods)


def with_methods(spec: ModelSpec, methods: tuple) -> ModelSpec:
    """``spec`` carrying ``methods``, its own fields the first method's."""
    return dataclasses.replace(spec.for_method(methods[0]), methods=methods)
