"""The pytest entry on the numpy example: the correct cache passes, the one that keeps every query fails NO-Q.

    KVCHECK=build/bin/kvcheck python3 -m pytest -p kvcheck_client.pytest_plugin tools/python_client/tests
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from numpy_cache import CAPS, NumpyCache  # noqa: E402


class QKeepingCache(NumpyCache):
    def __init__(self, cfg):
        super().__init__(cfg, bug="keep-q")


def test_numpy_cache_is_conformant(kvcheck):
    report = kvcheck.validate(NumpyCache, CAPS, cases=3)
    assert report["implementations"][0]["conformant"]


def test_q_keeping_cache_fails_no_q(kvcheck):
    """Every property passes but NO-Q, which fails with its counterexample and replay command."""
    if kvcheck.property != "NO-Q":
        kvcheck.validate(QKeepingCache, CAPS, cases=2)
        return
    with pytest.raises(pytest.fail.Exception) as failure:
        kvcheck.validate(QKeepingCache, CAPS, cases=2)
    text = str(failure.value)
    assert "NO-Q" in text and "kvcheck replay" in text and "--connect" in text
