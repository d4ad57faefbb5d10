"""serving/triton_repo.py and serving/triton_backend.py: the generated Triton model repository read back with a
pbtxt parser and checked against each package's signature; the backend's ``execute()`` driven through a stand-in
of ``triton_python_backend_utils`` (tests/triton_standin.py) on real packages, its results equal to direct
``load()`` calls, bad requests answered alone."""

import importlib.util
import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import triton_standin as pb
from packages import EXAMPLES, MODELS, built
from pbtxt import parse
from tcexport.formats.records import Symbol, TensorSpec
from tcexport.loader import load
from tcexport.loader.dtypes import BFLOAT16
from tcexport.serving.triton_backend import TritonPythonModel
from tcexport.serving.triton_repo import TritonRepoError, main, model_config, write_repository

pytestmark = pytest.mark.slow

FILES = {"mlp": EXAMPLES / "mlp.py", "two_inputs": MODELS / "two_inputs.py", "dyn_tied": MODELS / "dyn_tied.py",
         "mlp_bf16": MODELS / "mlp_bf16.py", "token_ids": MODELS / "token_ids.py"}

# What each package's config.pbtxt must say, written out by hand from the model files:
# (max_batch_size, inputs, outputs) with (name, data_type, dims) each.
EXPECTED = {
    "mlp": (1024, [("x", "TYPE_FP32", [64])], [("output", "TYPE_FP32", [32])]),
    "two_inputs": (64, [("a", "TYPE_FP32", [16]), ("b", "TYPE_FP32", [16])], [("output", "TYPE_FP32", [16])]),
    "dyn_tied": (0, [("x", "TYPE_FP32", [2, -1]), ("y", "TYPE_FP32", [2, -1])], [("output", "TYPE_FP32", [2, -1])]),
    "mlp_bf16": (1024, [("x", "TYPE_BF16", [64])], [("output", "TYPE_BF16", [32])]),
    "token_ids": (32, [("ids", "TYPE_INT64", [-1]), ("scale", "TYPE_FP32", [8])],
                  [("output0", "TYPE_FP32", [8]), ("output1", "TYPE_INT64", [-1])]),
}


def package(key: str):
    return built(str(FILES[key]))


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A repository with every test package, one model each."""
    root = tmp_path_factory.mktemp("triton") / "models"
    for key in FILES:
        write_repository(package(key), root, name=key)
    return root


def _tensors(entries) -> list[tuple]:
    return [(e["name"], e["data_type"], e["dims"]) for e in entries]


@pytest.mark.parametrize("key", list(EXPECTED))
def test_config_matches_manifest(repo, key):
    config = parse((repo / key / "config.pbtxt").read_text())
    max_batch, inputs, outputs = EXPECTED[key]
    assert config["name"] == key and config["backend"] == "python"
    assert config["max_batch_size"] == max_batch
    assert _tensors(config["input"]) == inputs and _tensors(config["output"]) == outputs
    assert ("dynamic_batching" in config) == (max_batch > 0)
    assert config["instance_group"] == [{"count": 1, "kind": "KIND_CPU"}]
    assert (repo / key / "1" / "model.tcpkg").read_bytes() == package(key).read_bytes()
    model_py = (repo / key / "1" / "model.py").read_text()
    assert "from tcexport.serving.triton_backend import TritonPythonModel" in model_py
    assert sorted(p.name for p in (repo / key).iterdir()) == ["1", "config.pbtxt"]  # no temporary left behind
    assert (repo / key).stat().st_mode & 0o055 == (repo / key / "1").stat().st_mode & 0o055  # not the temp's 0700


def _triton_model_config_schema():
    """Triton's own ModelConfig message (``model_config_pb2`` as tritonclient ships it), loaded by path so that
    tritonclient's grpc client and its dependencies are not needed; skips where tritonclient is not installed."""
    found = importlib.util.find_spec("tritonclient")
    if found is None or not found.submodule_search_locations:
        pytest.skip("tritonclient is not installed (pip install --no-deps tritonclient) to check Triton's schema")
    path = next(iter(found.submodule_search_locations)) + "/grpc/model_config_pb2.py"
    spec = importlib.util.spec_from_file_location("_triton_model_config_pb2", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_parses_as_tritons_model_config(request):
    """What Triton itself does with the file: parse it as protobuf text into its ModelConfig message."""
    from google.protobuf import text_format

    schema = _triton_model_config_schema()
    batch_only = text_format.Parse(model_config(BATCH_ONLY, "b", max_delay_ms=0.5, device="cuda:1", instances=2),
                                   schema.ModelConfig())
    assert batch_only.dynamic_batching.max_queue_delay_microseconds == 500
    assert list(batch_only.input[0].dims) == [1] and list(batch_only.input[0].reshape.shape) == []
    assert batch_only.instance_group[0].kind == schema.ModelInstanceGroup.KIND_GPU
    repo = request.getfixturevalue("repo")
    for key, (max_batch, inputs, outputs) in EXPECTED.items():
        config = text_format.Parse((repo / key / "config.pbtxt").read_text(), schema.ModelConfig())
        assert config.backend == "python" and config.max_batch_size == max_batch
        assert [(i.name, schema.DataType.Name(i.data_type), list(i.dims)) for i in config.input] == inputs
        assert [(o.name, schema.DataType.Name(o.data_type), list(o.dims)) for o in config.output] == outputs
        assert config.HasField("dynamic_batching") == (max_batch > 0)


def _spec(name, shape):
    return TensorSpec(name, "float32", shape)


BATCH_ONLY = SimpleNamespace(model="m", inputs=[_spec("x", ("batch",))], outputs=[_spec("y", ("batch",))],
                             symbols=[Symbol("batch", 1, 500)])


def test_config_options_and_batch_only_tensors():
    manifest, spec = BATCH_ONLY, _spec
    config = parse(model_config(manifest, "m", max_batch=16, device="cuda:1", instances=2))
    assert config["max_batch_size"] == 16
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [1], "reshape": {"shape": []}}]
    assert config["instance_group"] == [{"count": 2, "kind": "KIND_GPU", "gpus": [1]}]
    assert parse(model_config(manifest, "m", device="cuda"))["instance_group"] == [{"count": 1, "kind": "KIND_GPU"}]
    static = SimpleNamespace(model="s", inputs=[spec("x", (3, 4))], outputs=[spec("y", ())], symbols=[])
    config = parse(model_config(static, "s"))
    assert config["max_batch_size"] == 0 and config["input"][0]["dims"] == [3, 4]
    assert config["output"][0]["dims"] == [1] and config["output"][0]["reshape"] == {"shape": []}
    with pytest.raises(TritonRepoError, match="no batch axis"):
        model_config(static, "s", max_batch=4)


def test_versions_names_and_refusals(tmp_path):
    mlp = package("mlp")
    root = tmp_path / "repo"
    write_repository(mlp, root, name="mlp", max_batch=8, instances=2, max_delay_ms=2.5)
    config = parse((root / "mlp" / "config.pbtxt").read_text())
    assert config["max_batch_size"] == 8 and config["instance_group"] == [{"count": 2, "kind": "KIND_CPU"}]
    assert config["dynamic_batching"] == {"max_queue_delay_microseconds": 2500}
    with pytest.raises(TritonRepoError, match="already exists"):
        write_repository(mlp, root, name="mlp")
    write_repository(package("two_inputs"), root, name="mlp", version=2)  # a new version replaces the config
    assert sorted(p.name for p in (root / "mlp").iterdir()) == ["1", "2", "config.pbtxt"]
    assert [i["name"] for i in parse((root / "mlp" / "config.pbtxt").read_text())["input"]] == ["a", "b"]
    for kwargs, match in [({"name": "../x"}, "model name"), ({"version": 0}, "version"),
                          ({"device": "tpu"}, "device"), ({"instances": 0}, "instances"),
                          ({"max_delay_ms": -1}, "max-delay-ms"),
                          ({"device": "cuda"}, "no CUDA kernels")]:
        with pytest.raises(TritonRepoError, match=match):
            write_repository(mlp, root, name=kwargs.pop("name", "other"), **kwargs)
    assert sorted(p.name for p in root.iterdir()) == ["mlp"]


def test_damaged_package_is_refused(tmp_path, capsys):
    data = bytearray(package("mlp").read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "bad.tcpkg"
    bad.write_bytes(bytes(data))
    code = main([str(bad), str(tmp_path / "repo")])
    assert code == 3, capsys.readouterr()
    assert "error:" in capsys.readouterr().err
    assert list((tmp_path / "repo").iterdir()) == []  # nothing half-written
    assert main([str(tmp_path / "missing.tcpkg"), str(tmp_path / "repo")]) == 2
    assert main(["--bogus"]) == 2


def test_python_dash_m(tmp_path):
    r = subprocess.run([sys.executable, "-m", "tcexport.serving.triton_repo", str(package("mlp")),
                        str(tmp_path), "--name", "m", "--version", "3"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "m" / "3" / "model.tcpkg").is_file() and "wrote" in r.stdout


# --- the backend, through the stand-in ---------------------------------------------------------------------------

def _instance(repo, key) -> TritonPythonModel:
    """A model instance made the way Triton makes it: the class taken from the version's generated model.py,
    initialised with args of strings and the config as JSON."""
    spec = importlib.util.spec_from_file_location(f"_triton_model_{key}", repo / key / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.TritonPythonModel is TritonPythonModel
    model = module.TritonPythonModel(pb_utils=pb)
    config = parse((repo / key / "config.pbtxt").read_text())
    model.initialize({"model_config": json.dumps(config), "model_instance_kind": "CPU",
                      "model_instance_device_id": "0", "model_repository": str(repo / key),
                      "model_version": "1", "model_name": key})
    return model


def _request(**arrays) -> pb.InferenceRequest:
    return pb.InferenceRequest([pb.Tensor.bf16(n, a) if isinstance(a, torch.Tensor) else pb.Tensor(n, a)
                                for n, a in arrays.items()])


def _outputs(response, names) -> list[np.ndarray]:
    assert not response.has_error(), response.error().message()
    return [pb.get_output_tensor_by_name(response, n).as_numpy() for n in names]


def _close(got, want):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_execute_merges_and_answers_bad_requests_alone(repo):
    model = _instance(repo, "mlp")
    direct = load(package("mlp"))
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((n, 64), dtype=np.float32) for n in (1, 3, 2)]
    requests = [_request(x=xs[0]), _request(x=np.zeros((2, 63), np.float32)), _request(x=xs[1]),
                _request(y=xs[0]), _request(x=xs[0].astype(np.float64)), _request(x=xs[2])]
    responses = model.execute(requests)
    assert len(responses) == len(requests)
    for k, x in zip((0, 2, 5), xs):
        _close(_outputs(responses[k], ["output"]), [direct(x)])
    assert model.runner.batches == {6: 1}  # the three good requests ran as one call
    errors = [responses[k].error() for k in (1, 3, 4)]
    assert all(e.code() == pb.TritonError.INVALID_ARG for e in errors)
    assert errors[0].message().startswith("StaticDimError: ") and "'x'" in errors[0].message()
    assert "no input tensor 'x'" in errors[1].message()
    assert errors[2].message().startswith("DtypeError: ")
    _close(_outputs(model.execute([_request(x=xs[1])])[0], ["output"]), [direct(xs[1])])  # still serving
    model.finalize()


def test_execute_int_dtypes_groups_and_kernel_errors(repo):
    model = _instance(repo, "token_ids")
    direct = load(package("token_ids"))
    rng = np.random.default_rng(1)
    reqs = [(rng.integers(0, 32, (n, s)), rng.standard_normal((n, 8), dtype=np.float32))
            for n, s in ((2, 5), (1, 7), (3, 5), (2, 7))]
    bad_ids = reqs[2][0].copy()
    bad_ids[1, 3] = 1000  # out of the vocabulary: the kernel's index check fails this request alone
    requests = [_request(ids=i, scale=s) for i, s in reqs] + [_request(ids=bad_ids, scale=reqs[2][1])]
    responses = model.execute(requests)
    for (ids, scale), response in zip(reqs, responses):
        got = _outputs(response, ["output0", "output1"])
        want = direct(ids, scale)
        _close(got, want)
        np.testing.assert_array_equal(got[1], ids + 1)
    error = responses[4].error().message()
    assert error.startswith("RuntimeKernelError: ") and "out of range" in error
    assert responses[4].error().code() != pb.TritonError.INVALID_ARG
    # seq 5: 8 rows with the bad request, failed as one call and retried alone (2 and 3 rows; the bad one's call
    # failed); seq 7: 3 rows merged
    assert model.runner.batches == {2: 1, 3: 2}


def test_execute_bf16_through_dlpack(repo):
    model = _instance(repo, "mlp_bf16")
    direct = load(package("mlp_bf16"))
    xs = [torch.randn(n, 64, generator=torch.Generator().manual_seed(n)).to(torch.bfloat16) for n in (2, 1)]
    responses = model.execute([_request(x=x) for x in xs])
    for x, response in zip(xs, responses):
        assert not response.has_error(), response.error().message()
        got = pb.get_output_tensor_by_name(response, "output").to_dlpack()
        got = torch.utils.dlpack.from_dlpack(got)
        want = direct(x.view(torch.int16).numpy().view(BFLOAT16))
        assert got.dtype == torch.bfloat16
        np.testing.assert_array_equal(got.view(torch.int16).numpy().view(np.uint16), want.view(np.uint16))
    assert model.runner.batches == {3: 1}


def test_execute_unbatched_and_batch_limit(repo):
    tied = _instance(repo, "dyn_tied")
    direct = load(package("dyn_tied"))
    rng = np.random.default_rng(2)
    pairs = [(rng.standard_normal((2, k + 1), dtype=np.float32), rng.standard_normal((2, k), dtype=np.float32))
             for k in (3, 3, 5)]
    responses = tied.execute([_request(x=x, y=y) for x, y in pairs] + [_request(x=pairs[0][0], y=pairs[2][1])])
    for (x, y), response in zip(pairs, responses):
        _close(_outputs(response, ["output"]), [direct(x, y)])
    assert responses[3].error().message().startswith("SymbolConflictError: input 'x' dim 1")
    assert tied.runner.batches == {1: 3}  # no batch axis: every request alone
    two = _instance(repo, "two_inputs")  # unbounded batch symbol: max_batch_size 64 caps a merged call
    direct = load(package("two_inputs"))
    ab = [(rng.standard_normal((n, 16), dtype=np.float32), rng.standard_normal((n, 16), dtype=np.float32))
          for n in (40, 30, 10)]
    responses = two.execute([_request(a=a, b=b) for a, b in ab])
    for (a, b), response in zip(ab, responses):
        _close(_outputs(response, ["output"]), [direct(a, b)])
    assert two.runner.batches == {40: 2}
