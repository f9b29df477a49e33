# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Native errors reach Python as the MoriError subclass for their code."""

import pytest

import mori.core as mc
from mori.core import _C
from mori.core.errors import error_class_for_code

CASES = [
    (_C.ErrorCode.Internal, mc.InternalError, None),
    (_C.ErrorCode.InvalidArgument, mc.InvalidArgumentError, ValueError),
    (_C.ErrorCode.OutOfMemory, mc.OutOfMemoryError, MemoryError),
    (_C.ErrorCode.Timeout, mc.MoriTimeoutError, TimeoutError),
    (_C.ErrorCode.Transport, mc.TransportError, ConnectionError),
    (_C.ErrorCode.NotSupported, mc.NotSupportedError, NotImplementedError),
    (_C.ErrorCode.Cuda, mc.CudaError, None),
    (_C.ErrorCode.InvalidState, mc.InvalidStateError, None),
    (_C.ErrorCode.NotFound, mc.NotFoundError, LookupError),
]


@pytest.mark.parametrize(("code", "cls", "builtin"), CASES)
def test_native_error_maps_to_class(code, cls, builtin):
    message = f"expert id 300 out of range [0, 256) at token 17 ({code.name})"
    with pytest.raises(cls) as info:
        _C.throw_error(code, message)
    assert type(info.value) is cls
    assert str(info.value) == message
    assert info.value.code == int(code)
    assert isinstance(info.value, mc.MoriError)
    if builtin is not None:
        assert isinstance(info.value, builtin)


def test_every_native_code_has_a_class():
    for code in _C.ErrorCode.__members__.values():
        assert error_class_for_code(int(code)).code == int(code)
    assert error_class_for_code(12345) is mc.MoriError


def test_unknown_native_code_is_itself_an_error():
    with pytest.raises(TypeError):
        _C.throw_error(999, "x")
