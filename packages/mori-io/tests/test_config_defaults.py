# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Each backend config's defaults live in one place, the native config's default
constructor: every field of the Python dataclasses defaults to the native value, so a
backend the engine creates implicitly (TCP under SHM, P2P or RDMA) behaves as one
created from Python with defaults. Iterates over fields: a field added on either side
without its twin, or a default changed on one side, fails here."""

import dataclasses

import pytest

import mori.core as mc
from mori.io import (
    _C,
    BackendType,
    IOEngine,
    P2pBackendConfig,
    RdmaBackendConfig,
    TcpBackendConfig,
)


def _native_fields(obj):
    """{name: value} of a pybind11 config object's read-write fields."""
    return {
        name: getattr(obj, name)
        for name, attr in vars(type(obj)).items()
        if isinstance(attr, property) and not name.startswith("_")
    }


@pytest.mark.parametrize(
    "py_cls, native_cls",
    [(TcpBackendConfig, _C.TcpBackendConfig), (P2pBackendConfig, _C.P2pBackendConfig)],
)
def test_every_python_default_is_the_native_default(py_cls, native_cls):
    native = _native_fields(native_cls())
    fields = {f.name: f.default for f in dataclasses.fields(py_cls)}
    assert set(fields) == set(native), set(fields) ^ set(native)
    for name, default in fields.items():
        assert default == native[name], f"{py_cls.__name__}.{name}: {default} vs {native[name]}"
    # and what the engine receives from a default Python config is the native default
    assert _native_fields(py_cls().to_native()) == native


def test_tcp_sock_buf_default_is_kernel_autotuning_on_both_sides():
    # The value the two sides used to disagree on (4 MiB native, 0 in Python).
    assert TcpBackendConfig().sock_buf_bytes == _C.TcpBackendConfig().sock_buf_bytes == 0


def test_rdma_defaults_are_the_native_defaults():
    native = _C.rdma.BackendConfig()
    ours = RdmaBackendConfig().to_native()  # every Python field mapped onto the native one
    theirs, mine = _native_fields(native), _native_fields(ours)
    qp_native, qp_ours = _native_fields(theirs.pop("qp")), _native_fields(mine.pop("qp"))
    assert mine == theirs
    assert qp_ours == qp_native
    # Every native field has its Python twin (by name, or for the QP settings by the
    # IB attribute name; path_mtu is max_path_mtu in bytes, 0 = the maximum).
    # max_recv_wr is MORI's notif_per_qp.
    py_fields = {f.name for f in dataclasses.fields(RdmaBackendConfig)} | {"max_recv_wr"}
    assert set(theirs) <= py_fields, set(theirs) - py_fields
    assert set(qp_native) - {"port_num", "pkey_index", "max_path_mtu"} <= py_fields


@pytest.mark.parametrize("field", ["max_pending_hellos", "max_connections_per_peer"])
def test_connection_bounds_are_checked_naming_the_value(field):
    engine = IOEngine("bounds")
    try:
        with pytest.raises(mc.InvalidArgumentError, match=rf"{field} 0 not in \[1, 2\^20\]"):
            engine.create_backend(BackendType.TCP, TcpBackendConfig(**{field: 0}))
    finally:
        engine.close()
