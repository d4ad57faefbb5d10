"""``tcexport --report``: everything that blocks an export, found in one pass, so a user fixes a model in one
round instead of one error per run. The front end and the lowering are where a model's own code can block an
export (later stages failing is a tcexport bug, reported by the export itself); the report runs them like the
export does, and where the export would stop it goes on:

- capture: a data-dependent line stops torch.export at the first one; torch.export.draft_export goes on past
  each and lists them all (``Captured.draft_failures``), each at the user's file:line;
- lowering: every op without a rule, each with its line (lower/context.py collects them all), on the program
  the capture (or the draft capture) produced. Ops a data-dependent line left in the draft program (``item``,
  runtime asserts) are that line's problem, not a separate blocker.

``report()`` returns ``Blocker`` values with the typed errors' structured fields; the CLI prints them (text, or
a list in the JSON summary) and exits 0 when the list is empty, else with the first blocker's exit code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import tcexport.exporter.pipeline as pipeline
from tcexport.exporter.errors import CaptureError, DataDependentError, UnsupportedOpError
from tcexport.exporter.front import diagnose, torch_logs
from tcexport.formats.errors import TcError

FIELDS = ("op", "file", "line", "input", "dim", "symbol", "expected", "got")
_DRAFT_LEFTOVERS = ("aten.item", "aten._local_scalar_dense", "aten._assert_scalar", "aten.sym_constrain_range",
                    "aten._assert_async")


@dataclass(frozen=True)
class Blocker:
    """One thing that blocks the export: the typed error it would raise (``error``, ``exit_code``), its message,
    and the structured fields that apply (None otherwise)."""

    error: str
    message: str
    exit_code: int
    op: str | None = None
    file: str | None = None
    line: int | None = None
    input: str | None = None
    dim: int | None = None
    symbol: str | None = None
    expected: object = None
    got: object = None
    method: str | None = None  # with methods, the method it blocks

    def to_json(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def __str__(self) -> str:
        return f"[{self.error}]{f' method {self.method}:' if self.method else ''} {self.message}"


def blocker(e: TcError) -> Blocker:
    """The Blocker for a typed error, its structured attributes copied."""
    fields = {k: getattr(e, k) for k in FIELDS if getattr(e, k, None) is not None}
    for k in ("expected", "got"):
        if k in fields and not isinstance(fields[k], (str, int, float, bool, list)):
            fields[k] = str(fields[k])
    return Blocker(type(e).__name__, str(e), e.exit_code, **fields)


def report(model, example_inputs, dynamic_shapes: dict | None = None, targets=("cpu",), *, dynamic=(),
           source_path: str | None = None, backward: bool = False, grad_inputs=(),
           precision: str | None = None) -> list[Blocker]:
    """Everything that blocks exporting ``model`` (arguments as ``tcexport.exporter.export``); [] when nothing
    does. Writes nothing."""
    try:
        job = pipeline.make_job(model, example_inputs, dynamic_shapes, targets, dynamic=dynamic,
                                source_path=source_path, backward=backward, grad_inputs=grad_inputs,
                                precision=precision)
    except TcError as e:
        return [blocker(e)]
    r = pipeline.Results(job)
    found: list[Blocker] = []
    try:
        pipeline.stage_capture(r)
        if job.backward:
            pipeline.stage_autograd(r)
    except CaptureError as e:
        found = _draft_capture(r, e)
        if not r.graphs:
            return found
    except TcError as e:
        return [blocker(e)]
    return found + _lowering_blockers(r, {b.line for b in found if b.file})


def _draft_capture(r: pipeline.Results, first: CaptureError) -> list[Blocker]:
    """The capture problems torch's draft export finds past ``first``, and its program in ``r`` for lowering."""
    from tcexport.exporter.front import capture

    try:
        captured = capture.capture(r.job.spec, list(r.job.dynamic), fold=not r.job.backward,
                                   precision=r.job.precision, draft=True)
    except Exception:  # noqa: BLE001 - past the first problem the draft program may be beyond the front end;
        return [blocker(first)]  # the report then says what the export says
    found = [_failure_blocker(f, r.job.spec.path, first) for f in captured.draft_failures] or [blocker(first)]
    r.graphs[pipeline.INFERENCE] = pipeline.Graph(pipeline.INFERENCE, captured)
    return found


def _failure_blocker(failure: dict, model_file: Path, first: CaptureError) -> Blocker:
    """A draft export finding (capture._draft_findings) as a Blocker: a data-dependent one at the user's line,
    with the fixes, as the export's own DataDependentError says it. torch does not always record the user's
    frame (its stack filter drops some); the finding the export itself stopped at then takes the export's
    error, which has the frame from the traceback."""
    if failure["kind"] != "DATA_DEPENDENT_ERROR":
        return Blocker("CaptureError", f"torch.export: {failure['kind'].lower().replace('_', ' ')}: "
                       f"{failure['text']}", CaptureError.exit_code)
    mine = [f for f in failure["stack"] if Path(f["file"]).name == model_file.name]
    if not mine and isinstance(first, DataDependentError) and first.expr == failure["expr"]:
        return blocker(first)
    mine = mine or failure["stack"][-1:]
    frame = mine[-1] if mine else None
    quoted = f'\n  File "{frame["file"]}", line {frame["line"]}, in {frame["name"]}\n    {frame["code"]}' \
        if frame else ""
    recorded = _Recorded(f"Could not guard on data-dependent expression {failure['expr']} (unhinted){quoted}")
    return blocker(diagnose.capture_error(recorded, str(model_file), []))


class _Recorded(Exception):
    """A failure draft export recorded (and got past), in the form diagnose reads: torch's message, its frame."""


def _lowering_blockers(r: pipeline.Results, blocked_lines: set) -> list[Blocker]:
    """Every unsupported op in every graph, each once, with its line."""
    from tcexport.exporter.lower import core

    found: list[Blocker] = []
    seen = set()
    for g in r.graphs.values():
        rules = core.INFERENCE_RULES if g.name == pipeline.INFERENCE else core.TRAINING_RULES
        try:
            with torch_logs.kept():
                core.lower(g.captured, rules)
        except UnsupportedOpError as e:
            for op in e.ops:
                leftover = op.line in blocked_lines and op.op.startswith(_DRAFT_LEFTOVERS)
                if (op.op, op.source) not in seen and not leftover:
                    seen.add((op.op, op.source))
                    found.append(blocker(op))
        except TcError as e:
            found.append(blocker(e))
    return found
