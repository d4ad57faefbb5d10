"""`tcexport --backward` on the command line: the summary, the dump, and the typed errors (exit codes)."""

from __future__ import annotations

import json

import pytest

from packages import EXAMPLES
from test_cli import tcexport

pytestmark = pytest.mark.slow


def test_backward_summary_and_dump(tmp_path):
    out, dump = tmp_path / "mlp.tcpkg", tmp_path / "dump"
    r = tcexport(EXAMPLES / "mlp.py", "--backward", "--grad-inputs", "x", "-o", out, "--json", "--dump", dump)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["training"]["trainable"][0] == "fc1.weight" and summary["training"]["gradients"][-1] == "x"
    assert 0 < summary["training"]["saved"] <= 4
    assert "autograd" in summary["stages"]
    graphs = (dump / "graph_train.txt").read_text()
    assert "== tc_run_train_forward ==" in graphs and "== tc_run_backward ==" in graphs
    cpp = (dump / "model.cpp").read_text()
    for entry in ("tc_run", "tc_run_train_forward", "tc_run_backward"):
        assert f'extern "C" int32_t {entry}(' in cpp
    assert "== tc_run_backward ==" in (dump / "kernels.txt").read_text()


@pytest.mark.parametrize("args, code, message", [
    (["--grad-inputs", "ids"], 13, "only floating-point inputs have gradients"),
    (["--grad-inputs", "nope"], 13, "which is not an input of"),
])
def test_backward_errors(tmp_path, args, code, message):
    r = tcexport(EXAMPLES / "decoder.py", "--backward", *args, "-o", tmp_path / "d.tcpkg", "--json")
    assert r.returncode == code, r.stderr
    assert message in json.loads(r.stdout)["error"]["message"]
