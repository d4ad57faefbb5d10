"""Errors in the user's terms (issue 19 item 4): data-dependent lines named at the model's file:line with the
fixes that exist, torch's graph dumps kept off stderr (in --dump instead), a batch-1 example diagnosed as such,
every unsupported op in one error, and ``report()`` / ``tcexport --report`` listing every blocker in one pass."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from packages import EXAMPLES, MODELS

from tcexport.exporter import errors as E
from tcexport.exporter.front import torch_logs
from tcexport.exporter.front.model_file import load_model_file
from tcexport.exporter.pipeline import export
from tcexport.exporter import report


def _line(path, marker: str) -> int:
    return next(k for k, text in enumerate(path.read_text().splitlines(), 1) if marker in text)


def _export(name: str, **kw):
    path = MODELS / name
    spec = load_model_file(path)
    return export(spec.module, spec.example_inputs, spec.dynamic_shapes, source_path=str(path), **kw)


def _report(path):
    spec = load_model_file(path)
    return report(spec.module, spec.example_inputs, spec.dynamic_shapes, source_path=str(path))


def test_branch_on_data_named_at_user_line_with_fixes(tmp_path, capfd):
    with pytest.raises(E.DataDependentError) as info:
        _export("data_branch.py", dump=tmp_path / "dump")
    e, msg = info.value, str(info.value)
    assert e.exit_code == 13 and e.file.endswith("data_branch.py")
    assert e.line == _line(MODELS / "data_branch.py", "h.sum() > 0") and "h.sum() > 0" in e.code
    assert f"data_branch.py:{e.line}" in msg and "torch.where" in msg and "torch.cond" in msg
    assert "out of forward()" in msg
    for torch_only in ("guard_or_false", "draft_export", "TORCHDYNAMO", "def forward"):
        assert torch_only not in msg
    err = capfd.readouterr().err
    assert "def forward" not in err and "guard_or_false" not in err  # torch's graph dump and advice: not on stderr
    log = (tmp_path / "dump" / "capture_log.txt").read_text()
    assert "def forward" in log and "GuardOnDataDependentSymNode" in log  # ... but kept for --dump


def test_item_named_at_user_line_with_value_fixes():
    with pytest.raises(E.DataDependentError) as info:
        _export("data_item.py")
    e = info.value
    assert e.line == _line(MODELS / "data_item.py", "int(x[0, 0]") and ".item()" in e.code
    assert any("static dim" in f for f in e.fixes) and any("out of forward()" in f for f in e.fixes)


def test_data_dependent_size_named_at_user_line():
    with pytest.raises(E.DataDependentError) as info:
        _export("data_size.py")
    e = info.value
    assert e.line == _line(MODELS / "data_size.py", "kept = x[x > 0]") and "x[x > 0]" in e.code and e.exit_code == 13
    assert "torch.where" in str(e) and f"data_size.py:{e.line}" in str(e)


def test_torch_logs_kept_restores_handlers_and_replays_other_stderr(capfd):
    torch_logger = logging.getLogger("torch")
    before = {lg.name: list(lg.handlers) for lg in torch_logs._torch_loggers()}
    stream = sys.stderr
    assert before, "torch installs console handlers on its loggers"
    with torch_logs.kept() as kept:
        torch_logger.warning("torch chatter")
        print("the model's own message", file=sys.stderr)
        print("GRAPH DUMP", file=sys.stderr)
        kept.withhold(type("E", (Exception,), {"partial_fx_graph": "GRAPH DUMP"})())
    after = {lg.name: list(lg.handlers) for lg in torch_logs._torch_loggers()}
    assert after == before and sys.stderr is stream  # nothing outlives the block
    err = capfd.readouterr().err
    assert "the model's own message" in err and "GRAPH DUMP" not in err and "torch chatter" not in err
    assert any("torch chatter" in ln for ln in kept.lines) and "GRAPH DUMP" in kept.lines


def test_batch_one_example_diagnosed_as_such():
    with pytest.raises(E.ExampleSizeOneError) as info:
        _export("batch_one.py")
    e = info.value
    assert e.exit_code == 12 and isinstance(e, E.SpecializedDimError)  # exit code unchanged
    assert "use an example batch of at least 2" in str(e) and "literal 1" not in str(e)
    assert (e.input, e.dim, e.symbol, e.expected, e.got) == ("x", 0, "batch", ">= 2", 1)


def test_every_unsupported_op_reported_at_once_with_its_line():
    with pytest.raises(E.UnsupportedOpError) as info:
        _export("unsupported_many.py")
    e, path = info.value, MODELS / "unsupported_many.py"
    want = [("aten.sort.default", _line(path, "unsupported 1")), ("aten.kthvalue.default", _line(path, "unsupported 2")),
            ("aten.topk.default", _line(path, "unsupported 3"))]
    assert [(op.op, op.line) for op in e.ops] == want and e.exit_code == 14
    assert all(f"unsupported_many.py:{line}" in str(e) for _, line in want)
    assert (e.op, e.line) == want[0]


def test_report_lists_every_blocker_in_one_pass():
    ops = _report(MODELS / "unsupported_many.py")
    assert [(b.error, b.op) for b in ops] == [("UnsupportedOpError", "aten.sort.default"),
                                              ("UnsupportedOpError", "aten.kthvalue.default"),
                                              ("UnsupportedOpError", "aten.topk.default")]
    data = _report(MODELS / "data_branch.py")  # draft export goes past the data-dependent line
    assert [b.error for b in data] == ["DataDependentError"], data  # its leftover .item() is no second blocker
    assert data[0].line == _line(MODELS / "data_branch.py", "h.sum() > 0") and data[0].exit_code == 13
    two, path = _report(MODELS / "data_two.py"), MODELS / "data_two.py"  # two data-dependent lines + an op
    assert [(b.error, b.line) for b in two if b.error == "DataDependentError"] == [
        ("DataDependentError", _line(path, "data-dependent 1")), ("DataDependentError", _line(path, "data-dependent 2"))]
    assert ("aten.sort.default", _line(path, "# unsupported")) in [(b.op, b.line) for b in two]
    one = _report(MODELS / "batch_one.py")
    assert [(b.error, b.exit_code, b.to_json()["got"]) for b in one] == [("ExampleSizeOneError", 12, 1)]
    assert _report(EXAMPLES / "mlp.py") == []


def _tcexport(*args):
    return subprocess.run([sys.executable, "-m", "tcexport.exporter.cli", *map(str, args)], capture_output=True,
                          text=True)


@pytest.mark.slow
def test_cli_report_lists_blockers_and_exits_with_the_export_code(tmp_path):
    out = tmp_path / "x.tcpkg"
    r = _tcexport(MODELS / "unsupported_many.py", "--report", "--json", "-o", out)
    body = json.loads(r.stdout)
    assert r.returncode == 14 and body["ok"] is False and body["exit_code"] == 14, r.stderr
    path = MODELS / "unsupported_many.py"
    assert [(b["op"], b["line"]) for b in body["blockers"]] == [
        ("aten.sort.default", _line(path, "unsupported 1")), ("aten.kthvalue.default", _line(path, "unsupported 2")),
        ("aten.topk.default", _line(path, "unsupported 3"))]
    assert not out.exists()  # a report writes nothing
    r = _tcexport(MODELS / "data_branch.py", "--report")
    assert r.returncode == 13 and "blocker 1/1 (DataDependentError" in r.stderr
    assert "def forward" not in r.stderr and "guard_or_false" not in r.stderr  # (exit 0: report() == [] above)
