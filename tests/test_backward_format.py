"""The manifest's ``training`` section (format 1.2, CUDA kernels 1.3): round trip, defaults for older manifests, and a FormatError
naming the field for each broken rule of SPEC §6b."""

from __future__ import annotations

import copy
import json

import pytest

from tcexport.formats.errors import FormatError
from tcexport.formats.manifest import FORMAT_VERSION, parse_manifest
from tcexport.loader.archive import open_archive
from training_packages import training_package

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def manifest_json() -> dict:
    return json.loads(open_archive(training_package("mlp", "x")).manifest.dumps())


def test_round_trip(manifest_json):
    m = parse_manifest(manifest_json)
    assert tuple(manifest_json["format_version"]) == FORMAT_VERSION == (1, 7)
    assert json.loads(m.dumps()) == manifest_json
    assert m.training.sources[0] == ("input", 0) and m.training.gradients[-1] == ("input", "x")


def test_older_manifest_has_no_training(manifest_json):
    d = copy.deepcopy(manifest_json)
    del d["training"]
    d["format_version"] = [1, 1]
    assert parse_manifest(d).training is None


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
    ("training/trainable/0", "no.such.weight", r"training.trainable\[0\] names 'no.such.weight'"),
    ("training/forward/entry", "tc run", "training.forward.entry should be 'tc_run_train_forward' \\(fixed by the ABI\\)"),
    ("training/forward/outputs", [], "training.forward.outputs should start with the model's outputs"),
    ("training/backward/inputs/0/from", ["saved", 0], r"'from' should be \[kind, index\]"),
    ("training/backward/inputs/0/from", ["forward", 99], r"'from' \['forward', 99\] is out of range"),
    ("training/backward/inputs/0/from", ["grad", 0], "dtype and shape should equal those of grad 0"),
    ("training/backward/outputs/0/of", ["weight", "x"], "which is not a trainable weight"),
    ("training/backward/outputs/0/of", ["input", "x"], "should have the dtype and shape of input 'x'"),
    ("training/backward/workspace_bytes", ["*", 8, "nosuchsymbol"], "workspace_bytes"),
    ("training/backward/inputs", _DELETE, "training.backward has no field 'inputs'"),
])
def test_broken_training_section(manifest_json, path, value, message):
    with pytest.raises(FormatError, match=message):
        parse_manifest(_broken(manifest_json, path, value))
