# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The top-level ``mori`` package: owned by mori-core, lazy submodules, clear errors
for wheels that are not installed, one package across sys.path entries."""

import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mori

# Prepended to the subprocess scripts: makes the named modules (and their
# submodules) unimportable, as if their wheels were not installed.
BLOCKER = textwrap.dedent(
    """
    import sys

    class _Blocker:
        def __init__(self, names):
            self.names = names

        def find_spec(self, fullname, path=None, target=None):
            if any(fullname == n or fullname.startswith(n + ".") for n in self.names):
                raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
            return None

    sys.meta_path.insert(0, _Blocker(BLOCKED))
    """
)


def run_python(code: str, blocked=(), env_extra=None) -> str:
    script = f"BLOCKED = {list(blocked)!r}\n" + BLOCKER + textwrap.dedent(code)
    env = dict(os.environ, **(env_extra or {}))
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


def test_mori_init_ships_in_mori_core_only():
    def ships_init(dist: str) -> bool:
        files = importlib.metadata.files(dist) or []
        return any(str(f) == "mori/__init__.py" for f in files)

    assert ships_init("mori-core")
    for dist in ("mori-io", "mori-ep", "mori-ccl"):
        try:
            importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        assert not ships_init(dist), f"{dist} ships mori/__init__.py"
    owned = importlib.metadata.distribution("mori-core").locate_file("mori/__init__.py")
    assert Path(mori.__file__).resolve() == Path(owned).resolve()


def test_import_mori_loads_nothing():
    out = run_python(
        """
        import mori
        loaded = sorted(m for m in sys.modules if m.startswith("mori.") or m == "torch")
        print(loaded)
        """
    )
    assert out.strip() == "[]"


def test_submodules_resolve_on_attribute_access():
    run_python(
        """
        import mori
        assert mori.shmem.shmem_mype is sys.modules["mori.shmem.api"].shmem_mype
        assert mori.core.shmem.my_pe is sys.modules["mori.core.shmem"].my_pe
        assert "torch" not in sys.modules, "mori.shmem imported torch"
        assert {"core", "shmem"} <= set(dir(mori))
        """
    )


def test_missing_wheel_names_the_wheel_to_install():
    run_python(
        """
        import mori
        for name, wheel in (("ops", "mori-ep"), ("ep", "mori-ep"), ("ccl", "mori-ccl")):
            try:
                getattr(mori, name)
            except ModuleNotFoundError as e:
                assert e.name == f"mori.{name}", e.name
                assert f"pip install {wheel}" in str(e), str(e)
            else:
                raise AssertionError(f"mori.{name} resolved although it is blocked")
        assert "ops" not in dir(mori) and "ccl" not in dir(mori)
        try:
            from mori import ops  # noqa: F401
        except ModuleNotFoundError as e:
            assert "pip install mori-ep" in str(e), str(e)
        else:
            raise AssertionError("from mori import ops succeeded although it is blocked")
        try:
            mori.jax
        except AttributeError as e:
            assert "JAX integration" in str(e), str(e)
        else:
            raise AssertionError("mori.jax resolved")
        assert not hasattr(mori, "no_such_thing")
        """,
        blocked=["mori.ep", "mori.ops", "mori.ccl"],
    )


def test_mori_cpp_resolves_moris_binding_names_to_the_modules_that_implement_them():
    """MoRIIO connectors start with ``from mori.cpp import TransferStatus``."""
    pytest.importorskip("mori.io")
    run_python(
        """
        import mori.cpp
        assert not [m for m in sys.modules if m in ("mori.io", "mori.ops", "torch")]
        from mori.cpp import TransferStatus, StatusCode, BackendType, PollCqMode
        import mori.io
        assert TransferStatus is mori.io.TransferStatus and StatusCode is mori.io.StatusCode
        assert BackendType is mori.io.BackendType and PollCqMode is mori.io.PollCqMode
        assert mori.cpp.shmem_mype is sys.modules["mori.shmem"].shmem_mype
        assert "torch" not in sys.modules, "a mori.io name imported torch"
        status = TransferStatus()
        status.SetCode(StatusCode.IN_PROGRESS)
        assert status.InProgress()
        try:
            mori.cpp.build_args  # MORI's internal kernel-argument builder
        except AttributeError as e:
            assert "no counterpart in mori" in str(e), str(e)
        else:
            raise AssertionError("mori.cpp.build_args resolved")
        try:
            from mori.cpp import build_args  # noqa: F401
        except ImportError:
            pass
        else:
            raise AssertionError("from mori.cpp import build_args succeeded")
        assert "TransferStatus" in dir(mori.cpp) and "TransferStatus" in mori.cpp.__all__
        assert "torch" not in sys.modules, "listing mori.cpp's names imported torch"
        """
    )
    # The EP names load mori.ops (torch) only when asked for; a missing wheel is named.
    run_python(
        """
        from mori.cpp import StatusCode  # noqa: F401  (mori-io still resolves)
        try:
            from mori.cpp import EpDispatchCombineKernelType  # noqa: F401
        except ImportError as e:
            assert "pip install mori-ep" in str(e), str(e)
        else:
            raise AssertionError("mori.ops resolved although it is blocked")
        try:
            from mori.cpp import EpDispatchCombineConfig  # noqa: F401  (mori.ep._C's)
        except ImportError as e:
            assert "pip install mori-ep" in str(e), str(e)
        else:
            raise AssertionError("mori.ep._C resolved although mori.ep is blocked")
        import mori.cpp
        assert "EpDispatchCombineKernelType" not in mori.cpp.__all__
        assert "launch_local_expert_count" not in mori.cpp.__all__
        """,
        blocked=["mori.ops", "mori.ep"],
    )


def test_a_missing_dependency_of_an_installed_submodule_is_not_reported_as_its_wheel():
    pytest.importorskip("mori.ops")
    run_python(
        """
        import mori
        try:
            mori.ops
        except ModuleNotFoundError as e:
            assert e.name == "torch", (e.name, str(e))
            assert "pip install mori-ep" not in str(e), str(e)
        else:
            raise AssertionError("mori.ops imported without torch")
        """,
        blocked=["torch"],
    )


def test_mori_spans_mori_directories_on_other_sys_path_entries(tmp_path):
    portion = tmp_path / "mori" / "extra_portion"
    portion.mkdir(parents=True)
    (portion / "__init__.py").write_text("VALUE = 42\n")
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    run_python(
        """
        import mori
        assert mori.__file__.endswith("site-packages/mori/__init__.py"), mori.__file__
        import mori.extra_portion
        assert mori.extra_portion.VALUE == 42
        assert mori.shmem.shmem_npes  # mori-core's submodules still resolve
        """,
        env_extra={"PYTHONPATH": path},
    )


def test_shmem_is_torch_free_until_its_tensor_helpers():
    run_python(
        """
        from mori.shmem import *  # noqa: F403
        import mori.core as mc
        import mori.shmem
        uid = shmem_get_unique_id()
        assert isinstance(uid, bytes) and len(uid) == 128
        try:
            shmem_mype()
        except mc.InvalidStateError as e:
            assert "not initialized" in str(e)
        else:
            raise AssertionError("shmem_mype() before init did not raise")
        assert "torch" not in sys.modules
        try:
            mori.shmem.mori_shmem_create_tensor
        except ModuleNotFoundError as e:
            assert e.name == "torch"
        else:
            raise AssertionError("tensor helpers imported without torch")
        try:
            shmem_torch_process_group_init("default")
        except mc.NotSupportedError as e:
            assert "shmem_init_attr" in str(e), str(e)
        else:
            raise AssertionError("shmem_torch_process_group_init ran without torch")
        """,
        blocked=["torch"],
    )
