"""A bounded slice of both fuzzers, in every CI run (about a minute): the structure-aware mutator (tests/fuzz/mutate.py:
each mutant loaded and called in a child, with and without re-hashing) and the coverage-guided atheris targets
(tests/fuzz/atheris_targets.py). Any crash, hang, wrong answer or untyped error fails the test, with the mutants
kept for replay."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.mutate import campaign, make_bases

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
@pytest.mark.long  # the atheris targets and the fuzz corpus replay run in every run
def test_structure_aware_mutants(tmp_path):
    bases = make_bases(tmp_path, ["add", "mlp"])
    report = campaign(bases, mutants=1_000_000, seconds=40, jobs=2, seed=0, timeout=60, keep=tmp_path / "bad",
                      work=tmp_path)
    summary = report.to_json()
    assert report.mutants >= 500, summary
    assert report.failures() == 0, json.dumps(summary["bad"][:5], indent=1)
    assert set(summary["by_op"]) >= {"flip", "zip_field", "manifest", "manifest+", "expression", "weights+"}


def test_atheris_targets(tmp_path):
    pytest.importorskip("atheris")
    corpus = tmp_path / "corpus"
    target = HERE / "fuzz" / "atheris_targets.py"
    subprocess.run([sys.executable, str(target), "--make-corpus", str(corpus)], check=True)
    r = subprocess.run([sys.executable, str(target), "-max_total_time=20", "-max_len=400000", "-rss_limit_mb=4096",
                        f"-artifact_prefix={tmp_path}/", str(corpus)], capture_output=True, text=True, cwd=tmp_path,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "Done" in r.stderr and not list(tmp_path.glob("crash-*")), r.stderr[-2000:]
