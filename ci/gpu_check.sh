#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
#
# The GPU check (H200, via the device tool): build the four packages in place with CUDA
# for sm_90, print the topology, run the tests (GPU tests included) and the benchmarks,
# with logs/JSON under $OUT. The machine has no network: a newer scikit-build-core can be
# carried as a wheel in .whl/ (see BENCHMARKS/README).
#
# One device call runs at most 10 minutes, and the whole check takes longer on a fresh
# 1 x H200 (build ~4 min, tests ~14). So it runs in named parts; each part first builds
# the packages whose sources changed since this machine installed them (none, on a warm
# machine that ran an earlier part of the same tree), so consecutive calls go:
#
#   ci/gpu_check.sh build core io ccl integration
#                                      # build (177 s on a fresh 1 x H200 for all four),
#                                      # topology, then mori-core (63 s), mori-io (41 s),
#                                      # mori-ccl (90 s) and tests_integration (16 s):
#                                      # 388 s in all with three xdist workers per file
#   ci/gpu_check.sh ep                 # mori-ep's GPU test files (test_*_gpu.py; the
#                                      # inter-node ones start 2-4 processes on the GPU
#                                      # and take 40-70 s each)
#   ci/gpu_check.sh ep-cpu bench       # mori-ep's other tests (its CPU implementation in
#                                      # the CUDA build), then the benchmarks
#
# Test files run one pytest each with MORI_GPU_CHECK_WORKERS xdist workers (default 3;
# more made the trap tests' timing bounds and the 4-process inter-node tests flaky when
# they shared one GPU).
#   ci/gpu_check.sh all                # every part in one call (a machine with more time)
#   MORI_GPU_CHECK_TESTS="packages/mori-ep/tests/test_low_latency_gpu.py -k graph" ci/gpu_check.sh tests
#
# Parts: build, core, io, ep, ep-cpu, ccl, integration, tests (the paths in MORI_GPU_CHECK_TESTS),
# bench (the commands in MORI_GPU_CHECK_BENCH, default below), all. No part: all.
set -uo pipefail
cd "$(dirname "$0")/.."
# At most 8 files come back from the device tool: keep the outputs few.
OUT="${OUT:-$PWD/build/gpu-check}"
mkdir -p "$OUT"

# NVLink multicast stays off on shared hosts: it can take every GPU out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export MORI_CUDA=on MORI_CUDA_ARCHS="${MORI_CUDA_ARCHS:-90}" PYTHONUNBUFFERED=1
export CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)"
# The H200 image sets CC/CXX to a GCC under /opt/gcc that links libstdc++ statically;
# a static copy beside torch's shared libstdc++ crashes (two runtimes, one process).
# Build with the system compiler, which links libstdc++.so like torch does.
if [ -x /usr/bin/g++ ]; then
  export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
fi
PY="${PYTHON:-python3}"
PACKAGES="${MORI_GPU_CHECK_PACKAGES:-mori-core mori-io mori-ep mori-ccl}"
WORKERS="${MORI_GPU_CHECK_WORKERS:-3}"

parts=("$@")
[ "${#parts[@]}" -eq 0 ] && parts=(all)
for p in "${parts[@]}"; do
  case "$p" in
    build | core | io | ep | ep-cpu | ccl | integration | tests | bench | all) ;;
    *) echo "gpu_check: unknown part '$p' (build core io ep ep-cpu ccl integration tests bench all)"; exit 2 ;;
  esac
done
[ "${parts[*]}" = all ] && parts=(build core io ep ep-cpu ccl integration bench)

status=0
step() { echo; echo "=== $*"; }

if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/mori-site .whl/*.whl
  export PYTHONPATH="/tmp/mori-site${PYTHONPATH:+:$PYTHONPATH}"
fi

# What a package's build depends on: mori-core's sources (every package builds against
# it) and its own, not its tests.
source_hash() {
  find shared_native packages/mori-core/csrc packages/mori-core/src packages/mori-core/CMakeLists.txt \
    packages/mori-core/pyproject.toml "$@" -type f ! -path '*/__pycache__/*' -print0 |
    sort -z | xargs -0 sha1sum | sha1sum | cut -d' ' -f1
}

# Builds and installs each package unless this machine installed it from these very
# sources already (a warm machine that ran an earlier part rebuilds only what changed).
ensure_built() {
  local pkg want stamp t0=$SECONDS built=0
  mkdir -p build/gpu
  for pkg in $PACKAGES; do
    stamp="build/gpu/.installed-$pkg"
    if [ "$pkg" = mori-core ]; then
      want="$(source_hash) ${MORI_CUDA_ARCHS}"
    else
      want="$(source_hash "packages/$pkg/csrc" "packages/$pkg/src" "packages/$pkg/CMakeLists.txt" \
        "packages/$pkg/pyproject.toml") ${MORI_CUDA_ARCHS}"
    fi
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
      echo "build: $pkg up to date"
      continue
    fi
    if [ "$built" -eq 0 ]; then
      step "machine"
      { nvidia-smi; nvidia-smi topo -m; "$PY" -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count())'; } 2>&1 | tee "$OUT/machine.txt"
      step "build (MORI_CUDA=on, sm_${MORI_CUDA_ARCHS})"
      built=1
    fi
    # Test builds: mori-io's test hooks (mori.io._C._testing) are compiled in.
    if ! "$PY" -m pip install --no-build-isolation --no-deps -v -C build-dir=build/gpu \
        -C cmake.define.MORI_IO_TESTING=ON "./packages/$pkg" >"$OUT/build-$pkg.log.tmp" 2>&1; then
      echo "BUILD FAILED: $pkg"; tail -40 "$OUT/build-$pkg.log.tmp"; cat "$OUT/build-$pkg.log.tmp" >>"$OUT/build.log"
      exit 1
    fi
    cat "$OUT/build-$pkg.log.tmp" >>"$OUT/build.log"; rm -f "$OUT/build-$pkg.log.tmp"
    echo "$want" >"$stamp"
    echo "built $pkg ($((SECONDS - t0)) s)"
    # A new mori-core (new headers) means every package after it builds again.
    [ "$pkg" = mori-core ] && rm -f build/gpu/.installed-mori-{io,ep,ccl}
  done
  if [ "$built" -eq 1 ]; then
    step "topology"
    "$PY" -m mori.core.topology 2>&1 | tee "$OUT/topology.txt" || status=1
    "$PY" -c 'import json,mori.core as m; print(json.dumps(m.build_info()))' | tee "$OUT/build_info.json"
  fi
}

# One pytest per path: a call cut
# off at the device's time limit then loses only the running file's failure details,
# not those of every file before it (pytest prints them at the end of its run).
failed=()
run_tests() {
  local opts=() paths=() groups=() w path rc t0 takes_value=0 together=0
  # Words starting with "-" are options for every run; -n, -k, -m and -p take the next
  # word as their value ("-n 2 packages/mori-ep/tests": two xdist workers). --together:
  # one verbose pytest over every path (its workers share the files; a run cut off at
  # the device's limit still shows each finished test's PASSED/FAILED line).
  for w in "$@"; do
    if [ "$takes_value" -eq 1 ]; then opts+=("$w"); takes_value=0; continue; fi
    case "$w" in
      --together) together=1 ;;
      -n | -k | -m | -p) opts+=("$w"); takes_value=1 ;;
      -*) opts+=("$w") ;;
      *) paths+=("$w") ;;
    esac
  done
  if [ "$together" -eq 1 ]; then
    opts+=(-v)
    groups=("${paths[*]}")
  else
    groups=("${paths[@]}")
  fi
  for path in "${groups[@]}"; do
    echo "=== pytest $path" | tee -a "$OUT/pytest.log"
    t0=$SECONDS
    # shellcheck disable=SC2086  # a group is space-separated paths without spaces
    "$PY" -m pytest -ra --durations=10 --import-mode=importlib -p no:cacheprovider --timeout=600 "${opts[@]}" \
      $path 2>&1 | tee -a "$OUT/pytest.log"
    rc="${PIPESTATUS[0]}"
    echo "=== $path: rc $rc, $((SECONDS - t0)) s" | tee -a "$OUT/pytest.log"
    # 5: nothing collected (e.g. a directory whose every test is for another machine).
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then status=1; failed+=("$path (rc $rc)"); fi
  done
}

# Benchmarks: MORI_GPU_CHECK_BENCH holds shell commands (output in $OUT/bench.log), e.g.
# "python3 -m mori.io.bench --backend p2p --all --json $OUT/p2p.json". Unset: at the
# machine's world size (every visible GPU: 2, 4 or 8) mori-ep's bench over the EP8 table's
# token counts, its low-latency kernel types over decode's token counts (with the AsyncLL
# overlap), mori-ccl's collectives and the symmetric heap's bench, each writing its JSON as
# it ends (a run cut off at the device's time limit keeps the ones done); on one GPU, the
# one-rank mori-ep bench of every kernel type (fixed costs and local work).
run_bench() {
  local ngpu
  if [ -z "${MORI_GPU_CHECK_BENCH+x}" ]; then
    ngpu="$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)"
    MORI_GPU_CHECK_BENCH=""
    if [ "$ngpu" -ge 2 ]; then
      MORI_GPU_CHECK_BENCH="$PY -m mori.ep.bench --world-size $ngpu --tokens 128,512,1024,2048,4096 --json $OUT/ep_bench.json; \
$PY -m mori.ep.bench --world-size $ngpu --max-tokens 256 --tokens 1,8,32,128,256 --kernel-type IntraNode,IntraNodeLL,AsyncLL,AsyncLL-ce,standard-moe,standard-moe-rows,deepep-ll --overlap --json $OUT/ep_ll_bench.json; \
$PY -m mori.ccl.bench --world-size $ngpu --json $OUT/ccl_bench.json; \
$PY -m mori.core.bench_shmem --max-size 256M --json $OUT/shmem_bench.json"
    elif [ "$ngpu" -eq 1 ]; then
      MORI_GPU_CHECK_BENCH="$PY -m mori.ep.bench --world-size 1 --max-tokens 128 --tokens 1,128 \
--hidden-dim 7168 --num-experts-per-token 8 --num-experts-per-rank 256 --dtype bf16,fp8 --block-num 24 \
--iters 10 --reps 5 --no-baseline --kernel-type IntraNode,IntraNodeLL,AsyncLL,standard-moe,standard-moe-rows,deepep-ll \
--json $OUT/ep_1rank_bench.json"
    fi
  fi
  [ -n "$MORI_GPU_CHECK_BENCH" ] || return 0
  step "benchmarks"
  bash -c "$MORI_GPU_CHECK_BENCH" 2>&1 | tee -a "$OUT/bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}

ensure_built
for p in "${parts[@]}"; do
  case "$p" in
    build) ;;
    core) run_tests -n "$WORKERS" packages/mori-core/tests ;;
    io) run_tests -n "$WORKERS" packages/mori-io/tests ;;
    ep) run_tests --together -n "$WORKERS" packages/mori-ep/tests/test_*_gpu.py ;;
    ep-cpu)
      cpu_files=()
      for f in packages/mori-ep/tests/test_*.py; do
        case "$f" in *_gpu.py) ;; *) cpu_files+=("$f") ;; esac
      done
      run_tests --together -n "$WORKERS" "${cpu_files[@]}" ;;
    ccl) run_tests -n "$WORKERS" packages/mori-ccl/tests ;;
    integration) run_tests -n "$WORKERS" tests_integration ;;
    tests)
      # shellcheck disable=SC2086
      run_tests ${MORI_GPU_CHECK_TESTS:?MORI_GPU_CHECK_TESTS names the test paths of part tests} ;;
    bench) run_bench ;;
  esac
done

step "summary"
echo "parts: ${parts[*]}; failed: ${failed[*]:-none}" | tee -a "$OUT/pytest.log"
exit $status
