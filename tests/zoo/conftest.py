"""The zoo's fixtures: timm and torchvision imported once per session, before any zoo test runs (transformers
imports torchvision when it is installed, so a broken one must be made importable first: vision_libs.py)."""

import pytest

from vision_libs import define_missing_ops


@pytest.fixture(scope="session", autouse=True)
def vision_libs():
    """None when timm and torchvision import, else why not (their models then skip with that reason)."""
    lib, why = define_missing_ops()
    yield why
    del lib
