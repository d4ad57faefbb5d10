"""Structure-aware mutation fuzz of the loader: mutants of real packages, each loaded and called in a child.

Each mutant is made from a base package by one operator, chosen at random:

    flip          1-8 random bytes anywhere in the file XORed with random values
    zip_field     one field of a local header, a central header or the end record set to a telling value
    cut           the file truncated, or bytes inserted or appended
    manifest      one value of the manifest's JSON replaced, deleted, duplicated or reordered (no re-hashing)
    manifest+     the same, then every hash re-computed as an attacker who edits the manifest would
    expression    a shape, guard, workspace or grid expression replaced by a hostile one (re-hashed)
    weights+      one field of the safetensors header changed, the member and the digest re-hashed
    attestation   one value of the attestation (the archive comment) changed

A pool of worker processes loads each mutant (``tcexport.loader.load``, with the base's trusted key when the base
is signed) and calls it on fixed inputs; a worker that dies or runs past the timeout is replaced, so a crash or a
hang is counted, not fatal. Outcomes:

    typed         a TcError (the loader refused it, or a guard did): correct
    same          it loaded and gave the base's answers: correct (the mutated bytes did not matter)
    changed       it loaded and gave other answers: correct only where the mutant changed the weights' content
                  (weights+), or edited the manifest of a package from before 1.7 (nothing covers it, SPEC §8);
                  anywhere else a WRONG ANSWER
    untyped       any other exception: a bug (the error set must be closed)
    crash, hang   the worker died, or took longer than --timeout

    python tests/fuzz/mutate.py --mutants 100000 --jobs 2 --report bench/results/fuzz-mutants.json

(tests/test_fuzz.py runs a slice of about a minute in CI.)
"""

from __future__ import annotations

import argparse
import base64
import copy
import hashlib
import io
import json
import os
import random
import select
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

BAD = ("untyped", "crash", "hang", "wrong")
INTERESTING_INTS = [0, 1, -1, 2, 3, 7, 63, 64, 255, 256, 4095, 65535, 65536, 2 ** 31 - 1, 2 ** 31, 2 ** 32,
                    2 ** 62, 2 ** 63 - 1, 2 ** 63, -2 ** 63, 2 ** 64, 10 ** 30]


# ---------------------------------------------------------------------------------------------------------
# the base packages


@dataclass
class Base:
    """A package to mutate, the inputs a worker calls it with and the answers it must give."""
    name: str
    path: str
    inputs: list            # .npy paths, one per input
    outputs: list           # .npy paths, one per output, of every call
    calls: list             # per call: the indices into inputs (each call's inputs, in order)
    trusted_key: str | None = None  # a PEM public key: the worker loads with trusted_keys=[it]
    data: bytes = b""
    device: str = "cpu"

    def to_json(self) -> dict:
        return {"name": self.name, "path": self.path, "inputs": self.inputs, "outputs": self.outputs,
                "calls": self.calls, "trusted_key": self.trusted_key, "device": self.device}


def make_bases(work: Path, which: list[str], packages: tuple = (), device: str = "cpu") -> list[Base]:
    """The base packages (built once into ``work``, or given as ``packages`` paths, whose inputs are made from
    their manifests), their inputs, and their answers from an unmutated load on ``device``."""
    import numpy as np

    from tcexport.loader import load

    bases = []
    built = [(name, *_build(name, work)) for name in which]
    built += [(Path(p).stem, Path(p), [_inputs_for(Path(p))]) for p in packages]
    for name, path, inputs in built:
        calls, flat, outs = [], [], []
        model = load(path, device=device)
        for k, arrays in enumerate(inputs):
            ids = []
            for j, a in enumerate(arrays):
                p = work / f"{name}-in{k}-{j}.npy"
                np.save(p, a)
                ids.append(len(flat))
                flat.append(str(p))
            result = model(*arrays)
            for j, r in enumerate(result if isinstance(result, tuple) else (result,)):
                p = work / f"{name}-out{k}-{j}.npy"
                np.save(p, r)
                outs.append(str(p))
            calls.append(ids)
        base = Base(name, str(path), flat, outs, calls, data=path.read_bytes(), device=device)
        bases.append(base)
        if name in ("add", "mlp") and _have_cryptography():
            bases.append(_signed_twin(base, work))
        if name == "golden16" and _have_cryptography():  # unsigned by nature: with a trusted key, all refused
            key = next(b for b in bases if b.trusted_key) if any(b.trusted_key for b in bases) else None
            if key is not None:
                bases.append(Base("golden16-trusted", base.path, base.inputs, base.outputs, base.calls,
                                  key.trusted_key, base.data, device))
    return bases


def _have_cryptography() -> bool:
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return False
    return True


def _inputs_for(path: Path) -> list:
    """Inputs that pass a package's guards: every symbol bound to the first of a few small sizes that does."""
    import numpy as np

    from tcexport.formats import expr as ex
    from tcexport.formats.errors import GuardError
    from tcexport.loader.archive import open_archive
    from tcexport.loader.dtypes import numpy_dtype
    from tcexport.loader.guards import GuardPlan

    m = open_archive(path).manifest
    plan, rng = GuardPlan(m), np.random.default_rng(0)
    for size in (3, 4, 8, 2, 16, 1, 32):
        env = {s.name: min(max(size, s.min), s.max if s.max is not None else size) for s in m.symbols}
        arrays = []
        for spec in m.inputs:
            shape = tuple(ex.evaluate(d, env) for d in spec.shape)
            dtype = numpy_dtype(spec.dtype)
            arrays.append(rng.standard_normal(shape).astype(dtype) if dtype.kind == "f" else np.zeros(shape, dtype))
        try:
            plan.check(arrays)
            return arrays
        except GuardError:
            continue
    raise SystemExit(f"{path}: no small sizes pass its guards; give it as a named base instead")


def _build(name: str, work: Path):
    import numpy as np

    rng = np.random.default_rng(0)
    if name == "add":
        from loader_helpers import build_package, compile_kernel, default_members
        path = build_package(work / "add.tcpkg", members=default_members(compile_kernel(work)))
        return path, [[rng.standard_normal((3, 4)).astype(np.float32)], [np.ones((1, 4), np.float32)]]
    from packages import MODELS, built, mlp_package
    if name == "mlp":
        return mlp_package(), [[rng.standard_normal((5, 64)).astype(np.float32)],
                               [rng.standard_normal((1, 64)).astype(np.float32)]]
    if name == "derived":
        x = rng.standard_normal((2, 6, 8)).astype(np.float32)
        return built(str(MODELS / "dyn_derived.py")), [[x, rng.standard_normal((2, 12, 8)).astype(np.float32),
                                                        rng.standard_normal((2, 5, 8)).astype(np.float32)]]
    if name == "golden16":  # a package of format 1.6, built by that version's code (tests/golden)
        x = ((np.arange(40).reshape(5, 8) % 17 - 8) / 8).astype(np.float32)
        return TESTS / "golden" / "v1_6.tcpkg", [[x], [x[:1]]]
    if name == "divisible":
        return built(str(MODELS / "dyn_divisible.py")), [[rng.standard_normal((2, 8, 16)).astype(np.float32)],
                                                         [rng.standard_normal((1, 12, 16)).astype(np.float32)]]
    raise SystemExit(f"unknown base package {name!r}; known: add, mlp, derived, divisible")


def _signed_twin(base: Base, work: Path) -> Base:
    """The same package signed, loaded with its key trusted: every mutation must then be a SignatureError (or
    not matter)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from tcexport.loader.signing import sign_package

    key = Ed25519PrivateKey.generate()
    private, public = work / f"{base.name}.key.pem", work / f"{base.name}.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    signed = work / f"{base.name}-signed.tcpkg"
    signed.write_bytes(base.data)
    sign_package(signed, private)
    return Base(f"{base.name}-signed", str(signed), base.inputs, base.outputs, base.calls, str(public),
                signed.read_bytes())


# ---------------------------------------------------------------------------------------------------------
# mutation


@dataclass
class Mutant:
    data: bytes
    op: str
    content_changed: bool = False   # the weights' bytes differ: other answers are legitimate
    note: str = ""


class Mutator:
    """Mutants of one base package; the package is parsed once (zip directory, manifest, weights header)."""

    def __init__(self, data: bytes, rng: random.Random):
        from tcexport.formats.container import read_directory

        self.data, self.rng = data, rng
        directory = read_directory(lambda o, n: data[o:o + n], len(data), "base")
        self.entries, self.comment = directory.entries, directory.comment
        self.members = [(e.name, data[e.offset:e.offset + e.size]) for e in self.entries]
        by_name = dict(self.members)
        self.manifest = json.loads(by_name["manifest.json"])
        self.weights_name = self.manifest["weights"]["file"]
        # before 1.7 nothing covers the manifest and no library carries a descriptor: an edited manifest is as
        # authentic as the original (SPEC §6, §8), so other answers from one are not the loader's fault
        self.legacy = tuple(self.manifest["format_version"]) < (1, 7)
        self.strings = sorted({n for n, _ in self.members} | {"tc_run", "abort", "exit", "system", "libc.so.6",
                                                               "/tmp/x.so", "../../etc/passwd", "", "x" * 300,
                                                               "batch", "__sm_count", "float32", "bfloat16"})
        self._cd = self._central_offsets()
        self.ops = [("flip", self.flip, 3), ("zip_field", self.zip_field, 3), ("cut", self.cut, 1),
                    ("manifest", lambda: self.manifest_value(False), 2),
                    ("manifest+", lambda: self.manifest_value(True), 6), ("expression", self.expression, 3),
                    ("weights+", self.weights_header, 2), ("attestation", self.attestation, 1)]

    def mutate(self) -> Mutant:
        op = self.rng.choices(self.ops, weights=[w for _, _, w in self.ops])[0]
        return op[1]()

    # -- byte level ----------------------------------------------------------------------------------------

    def flip(self) -> Mutant:
        raw = bytearray(self.data)
        for _ in range(self.rng.randint(1, 8)):
            at = self.rng.randrange(len(raw))
            raw[at] ^= self.rng.randint(1, 255)
        return Mutant(bytes(raw), "flip")

    def cut(self) -> Mutant:
        raw, r = self.data, self.rng.random()
        at = self.rng.randrange(len(raw))
        if r < 0.4:
            return Mutant(raw[:at], "cut", note=f"truncated at {at}")
        junk = self.rng.randbytes(self.rng.choice([1, 7, 64, 4096]))
        if r < 0.8:
            return Mutant(raw[:at] + junk + raw[at:], "cut", note=f"{len(junk)} bytes inserted at {at}")
        return Mutant(raw + junk, "cut", note=f"{len(junk)} bytes appended")

    def _central_offsets(self) -> list[int]:
        out, at = [], self.data.rfind(b"PK\x05\x06")  # the comment is ASCII: this is the end record
        cd = struct.unpack_from("<I", self.data, at + 16)[0]
        while self.data[cd:cd + 4] == b"PK\x01\x02":
            out.append(cd)
            n, e, c = struct.unpack_from("<HHH", self.data, cd + 28)
            cd += 46 + n + e + c
        return out

    def zip_field(self) -> Mutant:
        raw = bytearray(self.data)
        kind = self.rng.choice(["local", "central", "end"])
        if kind == "end":
            at = raw.rfind(b"PK\x05\x06")
            fields = [(4, "H"), (6, "H"), (8, "H"), (10, "H"), (12, "I"), (16, "I"), (20, "H")]
        elif kind == "central":
            at = self.rng.choice(self._cd)
            fields = [(6, "H"), (8, "H"), (10, "H"), (16, "I"), (20, "I"), (24, "I"), (28, "H"), (30, "H"),
                      (32, "H"), (34, "H"), (42, "I")]
        else:
            at = self.rng.choice(self.entries).header_offset
            fields = [(6, "H"), (8, "H"), (14, "I"), (18, "I"), (22, "I"), (26, "H"), (28, "H")]
        off, fmt = self.rng.choice(fields)
        size = struct.calcsize("<" + fmt)
        old = struct.unpack_from("<" + fmt, raw, at + off)[0]
        limit = (1 << (8 * size)) - 1
        value = self.rng.choice([0, 1, limit, limit - 1, old + 1, old - 1 if old else 1, old * 2,
                                 self.rng.randint(0, limit), len(raw), len(raw) - 22]) & limit
        struct.pack_into("<" + fmt, raw, at + off, value)
        return Mutant(bytes(raw), "zip_field", note=f"{kind} field at +{off}: {old} -> {value}")

    # -- structure level -------------------------------------------------------------------------------------

    def _rebuild(self, manifest_bytes: bytes, rehash: bool, members: dict | None = None) -> bytes:
        """The archive with this manifest (and members replaced), written canonically; ``rehash`` recomputes the
        members' hashes (when members changed) and the attestation's digest."""
        from tcexport.formats import attestation as att
        from tcexport.formats.container import write_container

        parts = dict(self.members)
        parts.pop("manifest.json")
        parts.update(members or {})
        attestation = att.unsigned(manifest_bytes, (1, 7)).to_bytes() if rehash else self.comment
        buf = io.BytesIO()
        write_container(buf, [("manifest.json", manifest_bytes)] + sorted(parts.items()), attestation)
        return buf.getvalue()

    def _paths(self, node, prefix=()) -> list:
        out = [prefix]
        if isinstance(node, dict):
            for k, v in node.items():
                out += self._paths(v, prefix + (k,))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                out += self._paths(v, prefix + (i,))
        return out

    def _value(self, old):
        r = self.rng.random()
        if r < 0.25 and isinstance(old, int) and not isinstance(old, bool):
            return self.rng.choice([old + 1, old - 1, -old, old * 2, old * 1000] + INTERESTING_INTS)
        if r < 0.45:
            return self.rng.choice(INTERESTING_INTS)
        if r < 0.6:
            return self.rng.choice(self.strings)
        if r < 0.75:
            return self.rng.choice([None, True, False, 1.5, -0.0, 1e308, [], {}, [0], {"a": 1}, "", [[[[1]]]]])
        if r < 0.8:
            return _deep(self.rng.choice([10, 60, 70, 90]))  # a chain: its JSON grows with its depth only
        if r < 0.85:
            return DEEP  # _dumps writes it as thousands of nested lists (too deep for json.dumps itself)
        return copy.deepcopy(self._random_subtree())

    def _random_subtree(self):
        path = self.rng.choice(self._paths(self.manifest))
        return _get(self.manifest, path)

    def manifest_value(self, rehash: bool) -> Mutant:
        m = copy.deepcopy(self.manifest)
        path = self.rng.choice(self._paths(m)[1:])
        parent, key = _get(m, path[:-1]), path[-1]
        r, note = self.rng.random(), ""
        if r < 0.6:
            old = parent[key]
            parent[key] = self._value(old)
            note = f"{_show(path)}: {_note(old)} -> {_note(parent[key])}"
        elif r < 0.75:
            del parent[key]
            note = f"deleted {_show(path)}"
        elif isinstance(parent, list) and r < 0.85:
            parent.insert(key, copy.deepcopy(parent[key]))
            note = f"duplicated {_show(path)}"
        elif isinstance(parent, list) and len(parent) > 1:
            j = self.rng.randrange(len(parent))
            parent[key], parent[j] = parent[j], parent[key]
            note = f"swapped {_show(path)} and [{j}]"
        elif isinstance(parent, dict):
            parent[f"extra{self.rng.randint(0, 9)}"] = self._value(None)
            note = f"added a field beside {_show(path)}"
        else:
            parent.append(self._value(None))
            note = f"appended to {_show(path[:-1])}"
        raw = _dumps(m, self.rng)
        return Mutant(self._rebuild(raw, rehash), "manifest+" if rehash else "manifest", content_changed=self.legacy,
                      note=note)

    def expression(self) -> Mutant:
        m = copy.deepcopy(self.manifest)
        slots = [p for p in self._paths(m) if p[-1:] in (("shape",), ("expr",), ("workspace_bytes",), ("grid",))
                 or (len(p) > 1 and p[-2] in ("shape", "grid"))]
        slots = [p for p in slots if p] or [("plan", "workspace_bytes")]
        path = self.rng.choice(slots)
        syms = [s["name"] for s in m["symbols"]] or ["batch"]
        expr = _hostile_expr(self.rng, syms)
        parent = _get(m, path[:-1])
        if isinstance(parent, (dict, list)):
            try:
                parent[path[-1]] = expr
            except (IndexError, TypeError):
                pass
        return Mutant(self._rebuild(_dumps(m, self.rng), True), "expression", content_changed=self.legacy,
                      note=f"{_show(path)} = {_note(expr)}")

    def weights_header(self) -> Mutant:
        data = dict(self.members)[self.weights_name]
        (n,) = struct.unpack_from("<Q", data, 0)
        header = json.loads(data[8:8 + n])
        names = [k for k in header if k != "__metadata__"] or ["new"]
        name = self.rng.choice(names)
        entry = header.get(name)
        r = self.rng.random()
        if r < 0.35 and isinstance(entry, dict):
            entry["data_offsets"] = [self.rng.choice(INTERESTING_INTS + [entry["data_offsets"][1]]),
                                     self.rng.choice(INTERESTING_INTS + [entry["data_offsets"][0]])]
        elif r < 0.5 and isinstance(entry, dict):
            entry["dtype"] = self.rng.choice(["F32", "F16", "BF16", "I64", "U8", "BOOL", "F8", "", 3])
        elif r < 0.65 and isinstance(entry, dict):
            entry["shape"] = self.rng.choice([[], [0], [1 << 62, 4], [-1], list(reversed(entry["shape"])),
                                              entry["shape"] + [1], [1] * 70])
        elif r < 0.8 and len(names) > 1:
            other = self.rng.choice(names)
            header[name], header[other] = header[other], header[name]
        else:
            header[self.rng.choice([name, "__metadata__", "new"])] = self._value(None)
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        new = struct.pack("<Q", len(text)) + text + data[8 + n:]
        if self.rng.random() < 0.1:
            new = struct.pack("<Q", self.rng.choice(INTERESTING_INTS) & ((1 << 64) - 1)) + new[8:]
        m = copy.deepcopy(self.manifest)
        m["members"][self.weights_name] = {"sha256": hashlib.sha256(new).hexdigest(), "size": len(new)}
        raw = _dumps(m, self.rng)
        return Mutant(self._rebuild(raw, True, {self.weights_name: new}), "weights+", content_changed=True,
                      note=f"header of {name!r}")

    def attestation(self) -> Mutant:
        if not self.comment:  # a package from before 1.7 has none: add one, valid or not
            raw = self.rng.choice([b"{}", b"[]", b"x", att_bytes(self.members)])
            from tcexport.formats.container import write_container
            buf = io.BytesIO()
            write_container(buf, self.members, raw)
            return Mutant(buf.getvalue(), "attestation", note="an attestation added")
        env = json.loads(self.comment)
        statement = json.loads(base64.b64decode(env["payload"]))
        r = self.rng.random()
        if r < 0.5:
            path = self.rng.choice(self._paths(statement)[1:])
            parent = _get(statement, path[:-1])
            parent[path[-1]] = self._value(parent[path[-1]])
            env["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
        else:
            path = self.rng.choice(self._paths(env)[1:])
            parent = _get(env, path[:-1])
            parent[path[-1]] = self._value(parent[path[-1]])
        raw = json.dumps(env).encode()
        if self.rng.random() < 0.1:
            raw = self.rng.choice([b"", raw[:len(raw) // 2], raw + b"\x00", raw * 20, b"{}"])
        from tcexport.formats.container import write_container
        buf = io.BytesIO()
        try:
            write_container(buf, self.members, raw)
        except Exception:  # noqa: BLE001 - a comment too long for a zip: keep the original
            buf = io.BytesIO()
            write_container(buf, self.members, self.comment)
        return Mutant(buf.getvalue(), "attestation")


def att_bytes(members: list) -> bytes:
    """A valid attestation for these members' manifest."""
    from tcexport.formats import attestation as att

    manifest = dict(members)["manifest.json"]
    return att.unsigned(manifest, (1, 7)).to_bytes()


def _get(node, path):
    for p in path:
        node = node[p]
    return node


def _deep(n: int):
    v = 1
    for _ in range(n):
        v = ["+", v, 1]
    return v


def _hostile_expr(rng: random.Random, syms: list):
    s = rng.choice(syms)
    big = rng.choice([2 ** 62, 2 ** 63 - 1, 2 ** 64, 10 ** 18])
    choices = [
        ["*"] + [big] * rng.randint(2, 40),
        ["*", s, big],
        ["//", s, 0], ["%", s, 0], ["//", s, ["-", s, s]],
        ["-", 0, big], ["+", big, big],
        _nested_product(rng.randint(20, 80)),
        ["max", s, ["*", s, s, s, s, s, s, s, s]],
        [rng.choice(["**", "pow", "eval", "", "and"])] + [s] * rng.randint(0, 3),
        ["==", s, ["+", s, 1]], ["<", s, 0],
        "__sm_count", "undeclared", -1, 0, True, 1.5, None, {"op": "+"},
        ["*", s, -1],
    ]
    return rng.choice(choices)


def _nested_product(depth: int):
    """A product nested ``depth`` levels (a chain: JSON cannot share subtrees), whose value doubles each level."""
    e = 2
    for _ in range(depth):
        e = ["*", e, 2]
    return e


DEEP = "@deep-nesting@"


def _dumps(m, rng: random.Random) -> bytes:
    """Manifest bytes: usually canonical, sometimes compact or with duplicate keys (which JSON allows)."""
    r = rng.random()
    if r < 0.8:
        text = json.dumps(m, sort_keys=True, indent=1) + "\n"
    elif r < 0.95:
        text = json.dumps(m, separators=(",", ":"))
    else:
        text = json.dumps(m)
        text = text[:-1] + ', "format": "tcpkg", "symbols": []}'
    n = rng.choice([1000, 5000, 100000])
    return text.replace(f'"{DEEP}"', "[" * n + "1" + "]" * n).encode()


def _note(v) -> str:
    from tcexport.formats.errors import clip

    return clip(v, 60)


def _show(path) -> str:
    return "".join(f"[{p!r}]" for p in path)



# ---------------------------------------------------------------------------------------------------------
# workers


WORKER_READY = "ready"


def worker_main() -> None:
    """Read one JSON job per line on stdin (a mutant's path and its base), answer one JSON outcome per line."""
    import numpy as np

    from tcexport.formats.errors import TcError
    from tcexport.loader import load

    config = json.loads(sys.stdin.readline())
    bases = {}
    for b in config["bases"]:
        ins = [np.load(p) for p in b["inputs"]]
        outs = [np.load(p) for p in b["outputs"]]
        bases[b["name"]] = (b, ins, outs)
    print(WORKER_READY, flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        b, ins, outs = bases[job["base"]]
        try:
            keys = [b["trusted_key"]] if b["trusted_key"] else None
            model = load(job["path"], b["device"], trusted_keys=keys)
            got = []
            for call in b["calls"]:
                result = model(*[ins[i] for i in call])
                got += list(result if isinstance(result, tuple) else (result,))
            same = len(got) == len(outs) and all(
                g.shape == o.shape and g.dtype == o.dtype and np.allclose(g, o, rtol=1e-4, atol=1e-6, equal_nan=True)
                for g, o in zip(got, outs))
            answer = {"outcome": "same" if same else "changed"}
        except TcError as e:
            # the manifest parser's last-resort net (an unexpected field type) counts as typed, and is reported
            # apart so that its causes can be given messages of their own
            net = "unexpected field type" in str(e)
            answer = {"outcome": "typed", "detail": type(e).__name__ + (f" (net: {str(e)[:160]})" if net else "")}
        except BaseException as e:  # noqa: BLE001 - the point: anything not a TcError is a bug to report
            import traceback
            tb = traceback.extract_tb(e.__traceback__)[-3:]
            answer = {"outcome": "untyped", "detail": f"{type(e).__name__}: {str(e)[:300]}",
                      "where": [f"{f.filename}:{f.lineno} {f.name}" for f in tb]}
        print(json.dumps(answer), flush=True)


class Worker:
    def __init__(self, bases: list[Base]):
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self.proc.stdin.write(json.dumps({"bases": [b.to_json() for b in bases]}) + "\n")
        self.proc.stdin.flush()
        ready = self._readline(300)
        if ready != WORKER_READY:
            raise SystemExit(f"a fuzz worker did not start (said {ready!r})")

    def _readline(self, timeout: float) -> str | None:
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not r:
            return None
        line = self.proc.stdout.readline()
        return line.strip() if line else None

    def send(self, path: str, base: str) -> bool:
        self.sent = time.monotonic()
        try:
            self.proc.stdin.write(json.dumps({"path": path, "base": base}) + "\n")
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def receive(self, timeout: float) -> dict:
        """The answer to the job sent last; the timeout counts from when it was sent."""
        line = self._readline(max(0.0, self.sent + timeout - time.monotonic()))
        if line is None:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
                return {"outcome": "hang"}
            return self._dead()
        return json.loads(line)

    def _dead(self) -> dict:
        code = self.proc.wait()
        return {"outcome": "crash", "detail": f"worker exit status {code}"}

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.alive():
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


# ---------------------------------------------------------------------------------------------------------
# the campaign


@dataclass
class Report:
    mutants: int = 0
    outcomes: Counter = field(default_factory=Counter)
    by_op: dict = field(default_factory=lambda: defaultdict(Counter))
    by_base: dict = field(default_factory=lambda: defaultdict(Counter))
    bad: list = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)  # typed errors by class
    seconds: float = 0.0

    def add(self, base: str, m: Mutant, answer: dict, kept: str | None) -> None:
        outcome = answer["outcome"]
        if outcome == "typed":
            self.errors[answer.get("detail", "")[:200]] += 1
        if outcome == "changed" and not m.content_changed:
            outcome = "wrong"
        self.mutants += 1
        self.outcomes[outcome] += 1
        self.by_op[m.op][outcome] += 1
        self.by_base[base][outcome] += 1
        if outcome in BAD and len(self.bad) < 200:
            self.bad.append({"base": base, "op": m.op, "note": m.note, "outcome": outcome, **answer,
                             "file": kept})

    def failures(self) -> int:
        return sum(self.outcomes[o] for o in BAD)

    def to_json(self) -> dict:
        return {"mutants": self.mutants, "seconds": round(self.seconds, 1), "outcomes": dict(self.outcomes),
                "by_op": {k: dict(v) for k, v in sorted(self.by_op.items())},
                "by_base": {k: dict(v) for k, v in sorted(self.by_base.items())},
                "typed_errors": dict(self.errors.most_common()), "bad": self.bad}


def campaign(bases: list[Base], mutants: int, seconds: float, jobs: int, seed: int, timeout: float,
             keep: Path | None, work: Path) -> Report:
    """Run until ``mutants`` mutants or ``seconds`` have passed, ``jobs`` workers at a time."""
    rng = random.Random(seed)
    mutators = {b.name: Mutator(b.data, random.Random(rng.random())) for b in bases}
    workers = [Worker(bases) for _ in range(jobs)]
    report, start, k = Report(), time.monotonic(), 0
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else work
    pending = []  # (worker, base, mutant, path) in flight, one per worker
    try:
        while report.mutants < mutants and time.monotonic() - start < seconds:
            for i, w in enumerate(workers):
                if report.mutants + len(pending) >= mutants:
                    break
                base = rng.choice(bases)
                m = mutators[base.name].mutate()
                path = shm / f"tcfuzz-{os.getpid()}-{i}.tcpkg"
                path.write_bytes(m.data)
                pending.append((i, base, m, path))
            sent = [workers[i].send(str(path), base.name) for i, base, m, path in pending]
            for ok, (i, base, m, path) in zip(sent, pending):
                answer = workers[i].receive(timeout) if ok else workers[i]._dead()
                kept = None
                if answer["outcome"] in BAD or (answer["outcome"] == "changed" and not m.content_changed):
                    if keep is not None:
                        keep.mkdir(parents=True, exist_ok=True)
                        kept = str(keep / f"{base.name}-{m.op}-{k}.tcpkg")
                        Path(kept).write_bytes(m.data)
                k += 1
                report.add(base.name, m, answer, kept)
                if not workers[i].alive():
                    workers[i] = Worker(bases)
            pending = []
    finally:
        for w in workers:
            w.close()
        for i in range(jobs):
            (shm / f"tcfuzz-{os.getpid()}-{i}.tcpkg").unlink(missing_ok=True)
    report.seconds = time.monotonic() - start
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mutants", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=float("inf"), help="stop after this long")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds one mutant may take before it is a hang")
    p.add_argument("--bases", default="add,mlp,derived,divisible",
                   help="built-in base packages ('' for none); golden16, a format 1.6 package, runs best alone: "
                        "its manifest is covered by nothing, so an edit of it may overflow a kernel's buffers and "
                        "crash a worker later, on another base's mutant")
    p.add_argument("--package", action="append", default=[], help="also mutate this package (repeatable)")
    p.add_argument("--device", default="cpu", help="load the mutants on this device (cpu, cuda)")
    p.add_argument("--keep", type=Path, help="save every bad mutant here, to replay")
    p.add_argument("--report", type=Path, help="write the report as JSON here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker_main()
        return 0
    work = Path(tempfile.mkdtemp(prefix="tcfuzz-"))
    os.environ.setdefault("TCEXPORT_CACHE", str(work / "cache"))
    bases = make_bases(work, [b for b in args.bases.split(",") if b], tuple(args.package), args.device)
    report = campaign(bases, args.mutants, args.seconds, args.jobs, args.seed, args.timeout, args.keep, work)
    text = json.dumps(report.to_json(), indent=1)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text + "\n")
    print(json.dumps({k: v for k, v in report.to_json().items() if k != "bad"}, indent=1))
    for b in report.bad[:20]:
        print("BAD", json.dumps(b))
    return 1 if report.failures() else 0


if __name__ == "__main__":
    sys.exit(main())
