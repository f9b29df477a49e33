# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori: one import package across the mori wheels.

mori-core owns this file (every other wheel depends on mori-core and ships only
its own ``mori/<pkg>/`` directory). Submodules load on first attribute access, so
``import mori`` costs nothing, imports neither torch nor the native library, and
``mori.io.IOEngine`` / ``mori.shmem.shmem_mype()`` / ``mori.ops.EpDispatchCombineOp``
work after a bare ``import mori`` as they do with ROCm/mori.

``__path__`` is extended over every ``mori/`` directory on ``sys.path``, so wheels
installed into different site directories (user site beside system site,
``pip install --target``) still form one package.
"""

import importlib as _importlib
import importlib.util as _importlib_util
import pkgutil as _pkgutil

__path__ = _pkgutil.extend_path(__path__, __name__)

# Submodule -> the wheel that ships it.
_SUBMODULES = {
    "core": "mori-core",
    "shmem": "mori-core",
    "cpp": "mori-core",
    "io": "mori-io",
    "ep": "mori-ep",
    "ops": "mori-ep",
    "ccl": "mori-ccl",
}

# ROCm/mori submodules with no counterpart here, and what to use instead.
_ROCM_ONLY = {
    "jax": "ROCm/mori's JAX integration; mori supports torch tensors only",
    "ir": "ROCm/mori's Triton/MLIR device bindings; mori's device API is the CUDA headers "
    "under mori.core.include_dir()",
    "kernel_profiler": "ROCm/mori's kernel profiler; mori's telemetry is mori.core.telemetry",
}


def __getattr__(name: str):
    wheel = _SUBMODULES.get(name)
    if wheel is None:
        if name in _ROCM_ONLY:
            raise AttributeError(f"module 'mori' has no submodule {name!r}: {_ROCM_ONLY[name]}")
        raise AttributeError(f"module 'mori' has no attribute {name!r}")
    fullname = f"{__name__}.{name}"
    try:
        return _importlib.import_module(fullname)
    except ModuleNotFoundError as e:
        if e.name != fullname:
            raise  # the submodule exists but one of its own imports is missing
        raise ModuleNotFoundError(
            f"{fullname} is not installed: it ships in the {wheel} wheel (pip install {wheel})",
            name=fullname,
        ) from None


def _installed(name: str) -> bool:
    try:
        return _importlib_util.find_spec(f"{__name__}.{name}") is not None
    except (ImportError, ValueError):  # a finder refused it, or a half-imported module
        return False


def __dir__():
    installed = {n for n in _SUBMODULES if _installed(n)}
    return sorted({n for n in globals() if not n.startswith("_")} | installed)
