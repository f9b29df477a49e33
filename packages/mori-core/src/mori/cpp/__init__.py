# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""ROCm/mori's ``mori.cpp``: the names of MORI's raw bindings that code outside MORI
imports, resolved to the mori module that implements each one.

Serving stacks' MoRIIO connectors start with ``from mori.cpp import TransferStatus``;
MORI's own modules read their enums and configs from here. In mori each name lives in
the wheel that implements it (``mori.io``, ``mori.ops``, ``mori.shmem``; MORI's bound
dispatch/combine config ``EpDispatchCombineConfig``, which differs from the dataclass
``mori.ops.EpDispatchCombineConfig`` as it does in MORI, is ``mori.ep._C``'s); this module
loads that wheel on first use of one of its names, so ``import mori.cpp`` alone costs
nothing and imports neither torch nor a native library. A name whose wheel is not
installed raises ImportError naming the wheel; a MORI binding without a counterpart
here (MORI's internal kernel-argument builders, UMBP, ...) raises AttributeError
saying so.
"""

from __future__ import annotations

import importlib as _importlib
import importlib.util as _importlib_util

# module -> (wheel, names that module provides under MORI's binding names)
_PROVIDERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "mori.io": (
        "mori-io",
        (
            "BackendType",
            "EngineDesc",
            "FabricBackendConfig",
            "IOEngine",
            "IOEngineConfig",
            "IOEngineSession",
            "MemoryDesc",
            "MemoryLocationType",
            "PollCqMode",
            "RdmaBackendConfig",
            "StatusCode",
            "TcpBackendConfig",
            "TransferStatus",
            "XgmiBackendConfig",
            "fabric_alloc",
            "fabric_free",
            "set_log_level",
        ),
    ),
    "mori.ops": (
        "mori-ep",
        ("EpDispatchCombineKernelType", "EpDispatchCombineQuantType"),
    ),
    "mori.ops.local_expert_count": ("mori-ep", ("launch_local_expert_count",)),
    "mori.ep._C": ("mori-ep", ("EpDispatchCombineConfig",)),
    "mori.shmem": (
        "mori-core",
        (
            "MORI_SHMEM_INIT_WITH_MPI_COMM",
            "MORI_SHMEM_INIT_WITH_UNIQUEID",
            "shmem_barrier_all",
            "shmem_barrier_on_stream",
            "shmem_finalize",
            "shmem_free",
            "shmem_get_unique_id",
            "shmem_init_attr",
            "shmem_malloc",
            "shmem_malloc_align",
            "shmem_mpi_init",
            "shmem_mype",
            "shmem_npes",
            "shmem_num_qp_per_pe",
            "shmem_ptr_p2p",
        ),
    ),
}

_WHERE = {name: module for module, (_, names) in _PROVIDERS.items() for name in names}


def _installed(module: str) -> bool:
    # The wheel's package (mori.io, mori.ep, ...): finding a module inside it would
    # import the package (torch, for mori.ep).
    package = ".".join(module.split(".")[:2])
    try:
        return _importlib_util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def __getattr__(name: str):
    if name == "__all__":
        # `from mori.cpp import *`: the names whose wheels are installed.
        return sorted(n for n, m in _WHERE.items() if _installed(m))
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(
            f"mori.cpp has no {name!r}: ROCm/mori's raw binding {name} has no counterpart in "
            "mori; mori's Python API is mori.core, mori.shmem, mori.io and mori.ops"
        )
    try:
        provider = _importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or not module.startswith(e.name):
            raise  # the module exists but one of its own imports is missing
        wheel = _PROVIDERS[module][0]
        raise ImportError(
            f"mori.cpp.{name} is {module}.{name}, which ships in the {wheel} wheel "
            f"(pip install {wheel})",
            name=module,
        ) from None
    value = getattr(provider, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted({n for n in globals() if not n.startswith("_")} | set(_WHERE))
