"""`tcpkg serve` over real HTTP on 127.0.0.1, the real server process: metadata, JSON and binary requests, every
bad-request class followed by a good request, 64 concurrent clients with merged batches, hot reload under load, a
bad new version refused, and SIGTERM draining what is in flight."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import tcexport.loader as L
from packages import EXAMPLES, MODELS, built, mlp_package

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *sources, extra=()):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "tcexport.serving", *map(str, sources), "--port",
                                      str(self.port), "--poll-seconds", "0.2", *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(self.url + "/v2/health/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"server did not start:\n{self.stop()}")

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=60)
        return out


def _v2(name, x, datatype="FP32"):
    return {"inputs": [{"name": name, "shape": list(x.shape), "datatype": datatype, "data": x.reshape(-1).tolist()}]}


def _out(resp) -> np.ndarray:
    o = resp.json()["outputs"][0]
    return np.asarray(o["data"], np.float32).reshape(o["shape"])


def _rows(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 64)).astype(np.float32)


@pytest.fixture(scope="module")
def packages():
    return {"mlp": mlp_package(), "ids": built(str(MODELS / "token_ids.py"))}


@pytest.fixture(scope="module")
def server(packages, tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    (repo / "mlp" / "1").mkdir(parents=True)
    shutil.copy(packages["mlp"], repo / "mlp" / "1" / "model.tcpkg")
    ids = tmp_path_factory.mktemp("files") / "ids.tcpkg"
    shutil.copy(packages["ids"], ids)
    s = Server(repo, ids, extra=("--max-delay-ms", "5", "--max-body-mb", "1"))
    yield s
    s.stop()


def test_metadata(server):
    assert httpx.get(server.url + "/v2/health/live").json() == {"live": True}
    meta = httpx.get(server.url + "/v2").json()
    assert meta["name"] == "tcexport" and "binary_tensor_data" in meta["extensions"]
    m = httpx.get(server.url + "/v2/models/mlp").json()
    assert m["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}]
    assert m["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 32]}]
    assert m["symbols"] == [{"name": "batch", "min": 1, "max": 1024}] and m["versions"] == ["1"]
    assert httpx.get(server.url + "/v2/models/mlp/versions/1").json()["version"] == "1"
    ids = httpx.get(server.url + "/v2/models/ids").json()  # a file package: served under its stem
    assert ids["inputs"][0] == {"name": "ids", "datatype": "INT64", "shape": [-1, -1]}
    assert httpx.get(server.url + "/v2/models/nope").status_code == 404
    assert httpx.get(server.url + "/v2/models/mlp/versions/7").status_code == 404


def test_json_and_binary_requests_equal_direct_calls(server, packages):
    model = L.load(packages["mlp"])
    x = _rows(3)
    r = httpx.post(server.url + "/v2/models/mlp/infer", json={**_v2("x", x), "id": "a1"})
    assert r.status_code == 200 and r.json()["id"] == "a1"
    np.testing.assert_allclose(_out(r), model(x), rtol=1e-5, atol=1e-6)
    header = json.dumps({"inputs": [{"name": "x", "shape": [3, 64], "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    r = httpx.post(server.url + "/v2/models/mlp/versions/1/infer", content=header + x.tobytes(),
                   headers={"Inference-Header-Content-Length": str(len(header))})
    assert r.status_code == 200
    n = int(r.headers["Inference-Header-Content-Length"])
    meta = json.loads(r.content[:n])
    assert meta["outputs"][0]["parameters"]["binary_data_size"] == 3 * 32 * 4
    np.testing.assert_allclose(np.frombuffer(r.content[n:], np.float32).reshape(3, 32), model(x), rtol=1e-5,
                               atol=1e-6)
    ids = np.array([[1, 2, 3]], np.int64)
    r = httpx.post(server.url + "/v2/models/ids/infer", json={"inputs": [
        {"name": "ids", "shape": [1, 3], "datatype": "INT64", "data": [1, 2, 3]},
        {"name": "scale", "shape": [1, 8], "datatype": "FP32", "data": [1.0] * 8}]})
    assert r.status_code == 200
    assert r.json()["outputs"][1]["data"] == (ids + 1).reshape(-1).tolist()


BAD = {
    "dtype": (_v2("x", _rows(1).astype(np.float64), "FP64"), 400, "DtypeError"),
    "rank": ({"inputs": [{"name": "x", "shape": [64], "datatype": "FP32", "data": [0.0] * 64}]}, 400, "RankError"),
    "static dim": (_v2("x", np.zeros((1, 63), np.float32)), 400, "StaticDimError"),
    "length": ({"inputs": [{"name": "x", "shape": [2, 64], "datatype": "FP32", "data": [0.0] * 5}]}, 400,
               "V2RequestError"),
    "unknown input": ({"inputs": [{"name": "y", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}, 400,
                      "V2RequestError"),
    "unknown datatype": ({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP8", "data": [0.0] * 64}]}, 400,
                         "V2RequestError"),
}


def test_every_bad_request_fails_alone_and_the_next_good_one_is_served(server, packages):
    model = L.load(packages["mlp"])
    good = _v2("x", _rows(2, 5))

    def check_good():
        r = httpx.post(server.url + "/v2/models/mlp/infer", json=good)
        assert r.status_code == 200
        np.testing.assert_allclose(_out(r), model(_rows(2, 5)), rtol=1e-5, atol=1e-6)

    for label, (body, status, error) in BAD.items():
        r = httpx.post(server.url + "/v2/models/mlp/infer", json=body)
        assert (r.status_code, r.json()["error_type"]) == (status, error), (label, r.text)
        check_good()
    r = httpx.post(server.url + "/v2/models/mlp/infer", json=BAD["static dim"][0])
    assert r.json() | {"error": None} == {"error": None, "error_type": "StaticDimError", "input": "x", "dim": 1,
                                          "expected": 64, "got": 63}
    for content, status in [(b"{not json", 400), (b"x" * (2 << 20), 413)]:
        assert httpx.post(server.url + "/v2/models/mlp/infer", content=content).status_code == status
        check_good()
    assert httpx.post(server.url + "/v2/models/nope/infer", json=good).status_code == 404
    # an id past the embedding: the kernel refuses that request alone
    r = httpx.post(server.url + "/v2/models/ids/infer", json={"inputs": [
        {"name": "ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 99]},
        {"name": "scale", "shape": [1, 8], "datatype": "FP32", "data": [1.0] * 8}]})
    assert r.status_code == 400 and r.json()["error_type"] == "RuntimeKernelError", r.text
    assert str(MODELS) not in r.json()["error"] and "token_ids.py:15" in r.json()["error"]  # file names only
    check_good()
    # batch 1025 is past the symbol's range (1..1024); as binary its 262 KB fit under the 1 MB body limit
    over = {"inputs": [{"name": "x", "shape": [1025, 64], "datatype": "FP32",
                        "parameters": {"binary_data_size": 1025 * 64 * 4}}]}
    header = json.dumps(over).encode()
    r = httpx.post(server.url + "/v2/models/mlp/infer", content=header + bytes(1025 * 64 * 4),
                   headers={"Inference-Header-Content-Length": str(len(header))})
    assert (r.status_code, r.json()["error_type"], r.json()["symbol"]) == (400, "SymbolRangeError", "batch")
    check_good()


async def _clients(url, n, rounds, stop=None):
    """``n`` clients, each sending ``rounds`` requests (or until ``stop`` is set); returns (x, status, output)."""
    results = []
    async with httpx.AsyncClient(timeout=60) as client:
        async def one(k):
            for r in range(rounds):
                if stop is not None and stop.is_set():
                    return
                x = _rows(1 + (k + r) % 3, 1000 * k + r)
                resp = await client.post(url + "/v2/models/mlp/infer", json=_v2("x", x))
                results.append((x, resp.status_code, _out(resp) if resp.status_code == 200 else resp.text,
                                resp.json().get("model_version") if resp.status_code == 200 else None))
        await asyncio.gather(*[one(k) for k in range(n)])
    return results


def _batch_histogram(url) -> dict:
    hist = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith('tcexport_batch_size_bucket{le="') and 'model="mlp"' in line:
            hist[float(line.split('le="')[1].split('"')[0])] = float(line.rsplit(" ", 1)[1])
    return hist


def test_64_concurrent_clients_get_direct_results_and_batches_merge(server, packages):
    model = L.load(packages["mlp"])
    results = asyncio.run(_clients(server.url, 64, 3))
    assert len(results) == 192 and all(status == 200 for _, status, _, _ in results)
    for x, _, y, _ in results:
        np.testing.assert_allclose(y, model(x), rtol=1e-5, atol=1e-6)
    hist = _batch_histogram(server.url)
    assert hist[float("inf")] > hist[4.0], hist  # some executed calls carried more than 4 rows


@pytest.fixture(scope="module")
def mlp_v2(tmp_path_factory):
    """The example MLP with other weights: the same interface, other outputs (which version answered shows)."""
    src = tmp_path_factory.mktemp("v2") / "mlp_v2.py"
    src.write_text((EXAMPLES / "mlp.py").read_text().replace("torch.manual_seed(0)", "torch.manual_seed(1)"))
    return built(str(src))


def test_hot_reload_under_load_and_a_bad_version_refused(packages, mlp_v2, tmp_path):
    repo = tmp_path / "repo"
    (repo / "mlp" / "1").mkdir(parents=True)
    shutil.copy(packages["mlp"], repo / "mlp" / "1" / "model.tcpkg")
    server = Server(repo)
    try:
        async def load_while_swapping():
            stop = asyncio.Event()
            clients = asyncio.create_task(_clients(server.url, 8, 1000, stop))
            await asyncio.sleep(0.5)
            (repo / "mlp" / "3").mkdir()
            (repo / "mlp" / "3" / "model.tcpkg").write_bytes(b"not a package")  # refused, never served
            (repo / "mlp" / "2").mkdir()
            shutil.copy(mlp_v2, repo / "mlp" / "2" / "partial")
            (repo / "mlp" / "2" / "partial").rename(repo / "mlp" / "2" / "model.tcpkg")  # appears whole
            for _ in range(100):
                await asyncio.sleep(0.1)
                if httpx.get(server.url + "/v2/models/mlp").json()["version"] == "2":
                    break
            await asyncio.sleep(0.5)
            stop.set()
            return await clients

        results = asyncio.run(load_while_swapping())
        meta = httpx.get(server.url + "/v2/models/mlp").json()
        assert meta["versions"] == ["1", "2"] and meta["version"] == "2"  # 3 refused; 2 serves by default
        assert all(status == 200 for _, status, _, _ in results), [r[2] for r in results if r[1] != 200][:3]
        versions = [v for *_, v in results]
        assert versions[0] == "1" and versions[-1] == "2"
        models = {"1": L.load(packages["mlp"]), "2": L.load(mlp_v2)}
        for x, _, y, v in results:  # each answer is the version's own result
            np.testing.assert_allclose(y, models[v](x), rtol=1e-5, atol=1e-6)
        r = httpx.post(server.url + "/v2/models/mlp/versions/1/infer", json=_v2("x", _rows(1)))
        assert r.status_code == 200  # the old version still serves by number
    finally:
        log = server.stop()
    assert "refused mlp version 3" in log and "loaded mlp version 2" in log


def test_sigterm_drains_requests_in_flight(packages, tmp_path):
    shutil.copy(packages["mlp"], tmp_path / "mlp.tcpkg")
    server = Server(tmp_path / "mlp.tcpkg", extra=("--max-delay-ms", "1500"))

    async def send_then_terminate():
        async with httpx.AsyncClient(timeout=60) as client:
            tasks = [asyncio.create_task(client.post(server.url + "/v2/models/mlp/infer", json=_v2("x", _rows(1, k))))
                     for k in range(8)]
            await asyncio.sleep(0.5)  # the requests wait in the batch queue (1.5 s delay)
            server.proc.send_signal(signal.SIGTERM)
            return await asyncio.gather(*tasks)

    responses = asyncio.run(send_then_terminate())
    assert [r.status_code for r in responses] == [200] * 8
    server.proc.wait(timeout=60)
    assert server.proc.returncode == 0


def test_tcpkg_hands_serve_to_the_serving_package():
    tcpkg = shutil.which("tcpkg") or str(Path(sys.executable).parent / "tcpkg")
    out = subprocess.run([tcpkg, "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "PKG_OR_REPO" in out.stdout, out.stderr
    bad = subprocess.run([tcpkg, "serve", "/nonexistent.tcpkg"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "no such package file" in bad.stderr


def test_workers_share_the_port(packages, tmp_path):
    shutil.copy(packages["mlp"], tmp_path / "mlp.tcpkg")
    server = Server(tmp_path / "mlp.tcpkg", extra=("--workers", "2"))
    try:
        model = L.load(packages["mlp"])
        for k in range(8):
            r = httpx.post(server.url + "/v2/models/mlp/infer", json=_v2("x", _rows(2, k)))
            assert r.status_code == 200
            np.testing.assert_allclose(_out(r), model(_rows(2, k)), rtol=1e-5, atol=1e-6)
    finally:
        log = server.stop()
    assert server.proc.returncode == 0 and log.count("Application shutdown complete") == 2, log
