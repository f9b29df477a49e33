# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Fixtures shared by mori-io's tests."""

import pytest

from mori.io import IOEngine


@pytest.fixture
def engine_pair():
    """make(*backends, configs={type: config}, mutual=True) -> (a, b): engines "a" and
    "b" of this process with those backends (TCP first when listed), a registered with
    b and, when mutual, b with a. Closed when the test ends."""
    made = []

    def make(*backends, configs=None, mutual=True):
        a, b = IOEngine("a"), IOEngine("b")
        made.extend((a, b))
        for e in (a, b):
            for t in backends:
                e.create_backend(t, (configs or {}).get(t))
        a.register_remote_engine(b.get_engine_desc())
        if mutual:
            b.register_remote_engine(a.get_engine_desc())
        return a, b

    yield make
    for e in made:
        e.close()
