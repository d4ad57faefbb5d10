"""Lowering rule tables are values (exporter/lower/rules.py, composed in exporter/lower/core.py): a duplicate op in
one composition is a typed error naming the op and both modules, and what lowers an op does not depend on what
was exported before in the same process (it once did: ``~x`` after a --backward export)."""

from __future__ import annotations

import textwrap

import pytest
import torch

from tcexport.exporter.errors import DuplicateRuleError
from tcexport.exporter.front import autograd, capture
from tcexport.exporter.front.model_file import load_model_file
from tcexport.exporter.lower import core, grad, grad_conv, index, ops, training
from tcexport.exporter.lower.rules import RuleTable, compose

aten = torch.ops.aten

NOT_MODEL = """
import torch

class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x, i):
        y = self.lin(x)
        return torch.where(~(y > 0), y, -y), ~i

model = M()
example_inputs = (torch.randn(4, 8), torch.arange(32, dtype=torch.int32).reshape(4, 8))
"""


def _rule(*args):
    return None


def test_duplicate_op_in_a_composition_names_op_and_both_modules():
    a, b = RuleTable("rules.a"), RuleTable("rules.b")
    a.rule(aten.neg, aten.abs)(_rule)
    b.rule(aten.abs)(_rule)
    with pytest.raises(DuplicateRuleError) as e:
        compose("both", a, b)
    assert e.value.op == "aten.abs" and e.value.modules == ("rules.a", "rules.b")
    assert "aten.abs" in str(e.value) and "rules.a" in str(e.value) and "rules.b" in str(e.value)


def test_duplicate_op_in_one_table_is_an_error():
    t = RuleTable("rules.a")
    t.rule(aten.neg)(_rule)
    with pytest.raises(DuplicateRuleError, match="aten.neg"):
        t.rule(aten.neg)(_rule)


def test_a_composed_table_is_frozen():
    with pytest.raises(TypeError, match="frozen"):
        core.INFERENCE_RULES.rule(aten.neg)(_rule)


def test_training_table_is_inference_plus_gradient_rules():
    inf, tr = core.INFERENCE_RULES, core.TRAINING_RULES
    assert all(tr.origin(op) == inf.origin(op) for op in inf._rules)
    assert len(tr) == len(inf) + len(grad.RULES) + len(grad_conv.RULES)
    assert aten.index_put in inf and tr.origin(aten.index_put) == index.RULES.module  # a KV cache write, too
    assert inf.origin(aten.bitwise_not) == tr.origin(aten.bitwise_not) == ops.RULES.module


def test_bitwise_not_lowers_the_same_before_and_after_a_training_lowering(tmp_path):
    path = tmp_path / "not_model.py"
    path.write_text(textwrap.dedent(NOT_MODEL))
    spec = load_model_file(path)
    captured = capture.capture(spec, ["batch"], fold=False)
    before = str(core.lower_inference(captured)[0])
    graphs = autograd.capture_training(spec, captured)
    for _, g in autograd.entries(graphs):
        training.lower_training(g)
    after = str(core.lower_inference(captured)[0])
    assert before == after
    assert "bitnot(in_i" in before and "logical_not(" in before
