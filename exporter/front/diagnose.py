"""torch.export's capture failures in the user's terms: which line of the model file, what about it cannot be
captured, and the rewrites that exist. torch's own message speaks to torch developers (``guard_or_false``,
"replace your export() call with draft_export()", TORCHDYNAMO_* variables); it is kept whole in the error's
``torch_log`` (written to ``--dump DIR/capture_log.txt``), and the message leads with what a user can act on."""

from __future__ import annotations

import re
import traceback
from pathlib import Path

from tcexport.exporter.errors import CaptureError, DataDependentError

# torch's exceptions for a guard or a size on a value only known when the model runs (torch 2.4 … 2.13 names)
DATA_DEPENDENT = {"GuardOnDataDependentSymNode", "PendingUnbackedSymbolNotFound", "DataDependentOutputException"}
_DATA_WORDS = re.compile(r"data-dependent|data dependent|GuardOnDataDependentSymNode")
_EXPR_RE = re.compile(r"data-dependent expression (?P<expr>.+?) \((?:unhinted|$)", re.M)
_FILE_RE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)\n\s*(?P<code>[^\n]*)')
_TORCH_ONLY = re.compile(r"(consider using data-dependent friendly APIs[^\n]*|For more information, run with[^\n]*|"
                         r"For extended logs[^\n]*|If you suspect the guard[^\n]*|For more debugging help[^\n]*|"
                         r"For C\+\+ stack trace[^\n]*|The error above occurred when calling torch\.export[^\n]*)\n?")

BRANCH_FIXES = (
    "compute both results and pick per element with torch.where(cond, a, b)",
    "or branch with torch.cond(pred, true_fn, false_fn), which export keeps as one graph with both branches",
    "or move the check out of forward(): validate the inputs before calling the model",
)
VALUE_FIXES = (
    "keep the value a tensor (no .item(), int(), float() or bool() on it) and use torch ops on it",
    "if the value is a size, take it from an input's shape (x.shape[0]) or make it a constant of the model "
    "(a static dim)",
    "or move the computation out of forward(): do it before calling the model and pass the result in",
)


def user_frame(error: BaseException, model_file: str | None):
    """(file, line, function, code) of the innermost frame in the model file: from the traceback (non-strict
    export runs forward() in Python), else from the frame torch's message quotes."""
    mine = Path(model_file).name if model_file else None
    frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ is not None else []
    hits = [f for f in frames if mine and Path(f.filename).name == mine]
    if hits:
        f = hits[-1]
        return f.filename, f.lineno, f.name, (f.line or "").strip()
    quoted = [m for m in _FILE_RE.finditer(str(error)) if not mine or Path(m["file"]).name == mine]
    if quoted:
        m = quoted[-1]
        return m["file"], int(m["line"]), m["fn"], m["code"].strip()
    return None, None, None, None


def is_data_dependent(error: BaseException) -> bool:
    chain, e = [], error
    while e is not None and len(chain) < 8:
        chain.append(e)
        e = e.__cause__ or e.__context__
    return any(type(x).__name__ in DATA_DEPENDENT or _DATA_WORDS.search(str(x)[:2000]) for x in chain)


def torch_words(error: BaseException) -> str:
    """torch's message without the advice meant for torch developers."""
    return _TORCH_ONLY.sub("", str(error)).strip()


def capture_error(error: BaseException, model_file: str | None, log: list[str]) -> CaptureError:
    """The typed error for a failed torch.export: DataDependentError at the user's line, else a CaptureError
    carrying torch's words. Either way ``torch_log`` holds everything torch printed and said."""
    what = f"{model_file}" if model_file else "the model"
    full = "\n".join(log + [f"{type(error).__name__}: {error}"])
    if is_data_dependent(error):
        file, line, fn, code = user_frame(error, model_file)
        m = _EXPR_RE.search(str(error))
        expr = m["expr"].strip() if m else "?"
        branch = code is not None and re.match(r"(if|elif|while|assert)\b", code) is not None
        fixes = BRANCH_FIXES if branch else VALUE_FIXES
        where = f"{file}:{line} in {fn}: {code}" if file else "a line of the model (torch could not say which)"
        kind = "control flow depends on a tensor's values" if branch else "a Python value is read from a tensor"
        out = DataDependentError(
            f"cannot capture {what}: {kind}\n  at {where}\nAn exported graph has one fixed control flow and sizes "
            f"known from the input shapes; this line needs the data ({expr}). Fix:\n"
            + "\n".join(f"  - {f}" for f in fixes)
            + "\n(torch's own report and graph: pass --dump DIR, then read DIR/capture_log.txt)",
            file=file, line=line, code=code, expr=expr, fixes=fixes)
    else:
        out = CaptureError(f"torch.export could not capture {what}: {type(error).__name__}: {torch_words(error)}\n"
                           f"Fix the model (or the --dynamic spec) as the message above suggests.")
    out.torch_log = full
    return out
