"""Fixtures the loader tests share: the hand-written add kernel (tests/loader_helpers.py) and a package of it."""

import pytest

from loader_helpers import build_package, compile_kernel, default_members


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """The add kernel library, with the interface descriptor of ``make_manifest()``, built once per module."""
    return compile_kernel(tmp_path_factory.mktemp("kernel"))


@pytest.fixture
def package(tmp_path, kernel):
    """A valid format-1.7 package of the add kernel: y = x + w, x float32[batch, 4]."""
    return build_package(tmp_path / "add.tcpkg", members=default_members(kernel))
