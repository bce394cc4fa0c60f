"""A pytest plugin (``-p tests.nbval_env`` in the project's addopts): the arithmetic environment of nbval's
replays. A plugin, not a conftest hook, because the notebooks lie outside tests/.

nbval starts a notebook's kernel in the setup of its first cell, with this process's environment. For that
kernel the plugin sets the replay environment "check" (``tools/book.py``'s ARITHMETIC): other arithmetic
kernels than those the committed outputs were replayed with (`make notebooks` uses "commit"), so that every
test run checks that no output depends on them. A variable the caller set wins."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _book():
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tools import book

    return book


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    if type(item).__module__ != "nbval.plugin":
        yield
        return
    book = _book()
    saved = {k: os.environ.get(k) for k in book.ARITHMETIC["check"]}
    for key, value in book.arithmetic("check").items():
        os.environ.setdefault(key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
