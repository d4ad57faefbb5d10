"""The training graphs of a manifest (``graphs.forward``/``graphs.backward`` since 1.8; the ``training`` section of
1.2-1.7, CUDA kernels 1.3): round trip, older manifests parsing into the same graphs, and a FormatError naming the
field for each broken rule of SPEC §2a and §6b."""

from __future__ import annotations

import copy
import json

import pytest

from tcexport.formats.errors import FormatError
from tcexport.formats.manifest import FORMAT_VERSION, GRAPHS_VERSION, parse_manifest
from tcexport.loader.archive import open_archive
from loader_helpers import as_1_7
from training_packages import training_package

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def manifest_json() -> dict:
    return json.loads(open_archive(training_package("mlp", "x")).manifest.dumps())


def test_round_trip(manifest_json):
    m = parse_manifest(manifest_json)
    assert tuple(manifest_json["format_version"]) == GRAPHS_VERSION == (1, 8)  # no state: 1.8 bytes
    assert FORMAT_VERSION == (1, 10)  # what this loader reads; a training package is still written as 1.8
    assert json.loads(m.dumps()) == manifest_json
    assert set(m.graphs) == {"inference", "forward", "backward"} and "training" not in manifest_json
    assert m.training.sources[0] == ("input", 0) and m.training.gradients[-1] == ("input", "x")
    assert m.graphs["backward"].cpu.entry == "tc_run_backward" and m.trainable == m.training.trainable


def test_a_1_7_manifest_parses_into_the_same_graphs(manifest_json):
    new, old = parse_manifest(manifest_json), parse_manifest(as_1_7(manifest_json))
    assert old.graphs == new.graphs and old.trainable == new.trainable and old.format_version == (1, 7)


def test_older_manifest_has_no_training(manifest_json):
    d = as_1_7(manifest_json)
    del d["training"]
    d["format_version"] = [1, 1]
    m = parse_manifest(d)
    assert m.training is None and set(m.graphs) == {"inference"}


def _broken(d: dict, path: str, value) -> dict:
    d = copy.deepcopy(d)
    keys = path.split("/")
    target = d
    for k in keys[:-1]:
        target = target[int(k)] if isinstance(target, list) else target[k]
    last = keys[-1]
    if value is _DELETE:
        del target[last]
    elif isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return d


_DELETE = object()


@pytest.mark.parametrize("path, value, message", [
    ("weights/trainable/0", "no.such.weight", r"weights.trainable\[0\] names 'no.such.weight'"),
    ("graphs/forward/cpu/entry", "tc run",
     "graphs.forward.cpu.entry should be 'tc_run_train_forward' \\(fixed by the ABI\\)"),
    ("graphs/forward/outputs", [], "graphs.forward.outputs should start with the model's outputs"),
    ("graphs/backward/inputs/0/from", ["saved", 0], r"'from' should be \[kind, index\]"),
    ("graphs/backward/inputs/0/from", ["forward", 99], r"'from' \['forward', 99\] is out of range"),
    ("graphs/backward/inputs/0/from", ["grad", 0], "dtype and shape should equal those of grad 0"),
    ("graphs/backward/outputs/0/of", ["weight", "x"], "which is not a trainable weight"),
    ("graphs/backward/outputs/0/of", ["input", "x"], "should have the dtype and shape of input 'x'"),
    ("graphs/backward/cpu/workspace_bytes", ["*", 8, "nosuchsymbol"], "workspace_bytes"),
    ("graphs/backward/inputs", _DELETE, "graphs.backward has no field 'inputs'"),
    ("graphs/backward", _DELETE, "should have both 'forward' and 'backward' or neither"),
    ("graphs/inference/cpu", _DELETE, "graphs.inference has no 'cpu' part"),
    ("graphs/nosuch", {}, None),  # a graph a later version may add, without a CPU part: parsed, unused
    ("graphs/nosuch", {"cpu": {"entry": "tc_run"}}, "the CPU ABI has no entry point for a graph named 'nosuch'"),
    ("plan/workspace_bytes", 0, "plan.workspace_bytes, kept for loaders before 1.8, disagrees with graphs.inference"),
])
def test_broken_training_graphs(manifest_json, path, value, message):
    if message is None:
        parse_manifest(_broken(manifest_json, path, value))
        return
    with pytest.raises(FormatError, match=message):
        parse_manifest(_broken(manifest_json, path, value))


@pytest.mark.parametrize("path, value, message", [
    ("training/trainable/0", "no.such.weight", r"training.trainable\[0\] names 'no.such.weight'"),
    ("training/forward/entry", "tc run", "graphs.forward.cpu.entry should be 'tc_run_train_forward'"),
    ("training/backward/inputs", _DELETE, "training.backward has no field 'inputs'"),
])
def test_broken_1_7_training_section(manifest_json, path, value, message):
    with pytest.raises(FormatError, match=message):
        parse_manifest(_broken(as_1_7(manifest_json), path, value))
