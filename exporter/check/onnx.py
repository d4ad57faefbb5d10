"""`--onnx`: the same model, with the same dynamic dimensions, as an ONNX file (for ONNX Runtime users and
for the benchmark harness, which compares against ONNX Runtime on exactly this file).

Export goes through ``torch.onnx.export(..., dynamo=True, dynamic_shapes=...)`` and the result is checked with
``onnx.checker`` before anything is written.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from tcexport.formats.files import write_atomically

from tcexport.exporter.build_cache import build_folder
from tcexport.exporter.errors import ExportError, output_error
from tcexport.exporter.front.model_file import ModelSpec


class OnnxExportError(ExportError):
    exit_code = 16


def export_onnx_bytes(spec: ModelSpec, shapes: dict | None) -> tuple[bytes, int]:
    """The model as ONNX bytes and its default-domain opset; ``shapes`` are torch.export dynamic_shapes (the ones
    capture succeeded with, so fixes it accepted, such as ``seq = 4*_seq``, hold here too)."""
    try:
        import onnx
    except ImportError as e:
        raise OnnxExportError("--onnx needs the `onnx` and `onnxscript` packages: pip install 'tcexport[export]'") from e
    # torch.onnx logs a warning per missing torchvision op; none of them concern the user's model
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    try:
        with torch.no_grad():
            program = torch.onnx.export(spec.module, spec.example_inputs, dynamo=True, dynamic_shapes=shapes,
                                        input_names=list(spec.input_names), verbose=False)
    except Exception as e:
        raise OnnxExportError(f"torch.onnx.export failed for {spec.path}: {type(e).__name__}: {e}") from e
    with build_folder("tcexport-onnx-") as tmp:
        path = Path(tmp) / "model.onnx"
        program.save(str(path))
        if any(p.name != "model.onnx" for p in Path(tmp).iterdir()):
            raise OnnxExportError("the ONNX model needs external data files (over 2 GB); not supported yet")
        try:
            onnx.checker.check_model(str(path), full_check=True)
        except Exception as e:
            raise OnnxExportError(f"onnx.checker rejected the exported model: {e}") from e
        data = path.read_bytes()
    model = onnx.load_from_string(data)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return data, int(opset)


def write_onnx(data: bytes, path: Path) -> Path:
    """Atomically, like the archive: a temp file in the same folder, then rename; failing is an OutputError."""
    try:
        return write_atomically(path, data)
    except OSError as e:
        raise output_error("the ONNX file", path, e, "pass another path with -o (the ONNX file goes next to the "
                           "package)") from e
