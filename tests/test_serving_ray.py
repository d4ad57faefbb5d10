"""serving/ray.py on a local Ray: a two-replica deployment of a real package, concurrent requests over Ray
Serve's HTTP proxy (v2 JSON) and through a Python handle, results equal to direct ``load()`` calls, merged
batches, bad requests failing alone, then shutdown. Skipped where Ray is not installed."""

import socket
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
httpx = pytest.importorskip("httpx")

from packages import MODELS, built  # noqa: E402
from tcexport.formats.errors import DtypeError, GuardError, StaticDimError, TcError  # noqa: E402
from tcexport.loader import load  # noqa: E402
from tcexport.serving.ray import deployment  # noqa: E402

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served():
    """token_ids (int64 and float inputs, two outputs, batch 1..32) on two replicas; (handle, base URL, pkg)."""
    pkg = built(str(MODELS / "token_ids.py"))
    port = _free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = deployment(pkg, name="tokens", num_replicas=2, num_cpus=0.5, max_batch_size=8,
                         batch_wait_timeout_s=0.05)
        handle = serve.run(app, name="tokens", route_prefix="/v2/models/tokens")
        yield handle, f"http://127.0.0.1:{port}/v2/models/tokens", pkg
    finally:
        serve.shutdown()
        ray.shutdown()


def _inputs(rng, n, seq=5):
    return rng.integers(0, 32, (n, seq)), rng.standard_normal((n, 8), dtype=np.float32)


def _v2(ids, scale) -> dict:
    return {"id": "r", "inputs": [
        {"name": "ids", "shape": list(ids.shape), "datatype": "INT64", "data": ids.reshape(-1).tolist()},
        {"name": "scale", "shape": list(scale.shape), "datatype": "FP32", "data": scale.reshape(-1).tolist()}]}


def test_http_concurrent_requests_and_bad_ones_alone(served):
    _, url, pkg = served
    direct = load(pkg)
    rng = np.random.default_rng(0)
    reqs = [_inputs(rng, 1 + k % 3, seq=5 + k % 2) for k in range(24)]
    bodies = [_v2(*r) for r in reqs]
    bodies[5] = {"inputs": [{"name": "ids", "shape": [1, 5], "datatype": "INT64", "data": [1, 2, 3]}]}
    bodies[9] = _v2(reqs[9][0], np.zeros((reqs[9][0].shape[0], 7), np.float32))   # scale's static dim is 8
    bodies[13] = _v2(reqs[13][0].copy() + 1000, reqs[13][1])                       # ids out of the vocabulary
    with httpx.Client(timeout=60) as client:
        meta = client.get(url).json()
        assert meta["inputs"] == [{"name": "ids", "datatype": "INT64", "shape": [-1, -1]},
                                  {"name": "scale", "datatype": "FP32", "shape": [-1, 8]}]
        with ThreadPoolExecutor(16) as pool:
            replies = list(pool.map(lambda b: client.post(url + "/infer", json=b), bodies))
        bad_json = client.post(url + "/infer", content=b"{not json")
    for k, (r, reply) in enumerate(zip(reqs, replies)):
        if k in (5, 9, 13):
            continue
        assert reply.status_code == 200, reply.text
        out = {o["name"]: o for o in reply.json()["outputs"]}
        want = direct(*r)
        np.testing.assert_allclose(np.array(out["output0"]["data"], np.float32).reshape(out["output0"]["shape"]),
                                   want[0], rtol=1e-5, atol=1e-6)
        assert out["output1"]["datatype"] == "INT64" and out["output1"]["data"] == want[1].reshape(-1).tolist()
    assert replies[5].status_code == 400 and replies[5].json()["error_type"] == "V2RequestError"
    assert "holds 5 values, data has 3" in replies[5].json()["error"]
    err = replies[9].json()
    assert replies[9].status_code == 400 and err["error_type"] == "StaticDimError"
    assert (err["input"], err["dim"], err["expected"], err["got"]) == ("scale", 1, 8, 7)
    assert replies[13].status_code == 400 and replies[13].json()["error_type"] == "RuntimeKernelError"
    assert bad_json.status_code == 400


def test_handle_concurrent_calls_merge_and_raise_typed_errors(served):
    handle, _, pkg = served
    direct = load(pkg)
    rng = np.random.default_rng(1)
    reqs = [_inputs(rng, 1) for _ in range(32)]
    responses = [handle.infer.remote({"ids": i, "scale": s}) for i, s in reqs]
    bad = handle.infer.remote({"ids": reqs[0][0], "scale": np.zeros((1, 3), np.float32)})
    for (ids, scale), response in zip(reqs, responses):
        got = response.result()
        want = direct(ids, scale)
        np.testing.assert_allclose(got["output0"], want[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(got["output1"], want[1])
    with pytest.raises(StaticDimError) as info:
        bad.result()
    assert isinstance(info.value, GuardError) and "'scale'" in str(info.value)
    with pytest.raises(TcError, match="takes inputs ids, scale"):
        handle.infer.remote({"ids": reqs[0][0]}).result()
    with pytest.raises(DtypeError, match="expected a numpy array"):
        handle.infer.remote([[[1, 2]], reqs[0][1]]).result()
    v2 = handle.infer_v2.remote(_v2(*reqs[1])).result()
    assert v2["model_name"] == "tokens" and v2["id"] == "r"
    # single-row requests that arrived together ran as merged calls on at least one replica
    sizes = {}
    for _ in range(8):
        for rows, count in handle.batch_sizes.remote().result().items():
            sizes[rows] = max(sizes.get(rows, 0), count)
    assert max(sizes) > 1, sizes
