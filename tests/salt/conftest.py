"""Shared by the Salt tests: where the modules under test live."""

import importlib.util
from pathlib import Path

import pytest

SALT_PACKAGING = Path(__file__).resolve().parents[2] / "packaging" / "salt"
EXECUTION_MODULE = SALT_PACKAGING / "_modules" / "sparse_volume.py"
STATE_MODULE = SALT_PACKAGING / "_states" / "sparse_volume.py"


def load(path, name):
    """Import a Salt module file on its own, as Salt's loader would, so the
    test can give it the dunder globals (__salt__, __opts__) itself."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def execution_module():
    return load(EXECUTION_MODULE, "sv_execution_module")


@pytest.fixture
def state_module():
    return load(STATE_MODULE, "sv_state_module")
