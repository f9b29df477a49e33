#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
#
# One call on a GPU machine (H200, via the device tool): build the four packages in
# place with CUDA for sm_90, print the topology, run every test (GPU tests included)
# and write logs/JSON under $OUT. The machine has no network: a newer
# scikit-build-core can be carried as a wheel in .whl/ (see BENCHMARKS/README).
#
#   ci/gpu_check.sh            # everything
#   MORI_GPU_CHECK_PACKAGES=mori-core MORI_GPU_CHECK_TESTS="packages/mori-core/tests" ci/gpu_check.sh
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

status=0
step() { echo; echo "=== $*"; }

step "machine"
{ nvidia-smi; nvidia-smi topo -m; "$PY" -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count())'; } 2>&1 | tee "$OUT/machine.txt"

if compgen -G ".whl/*.whl" >/dev/null; then
  step "carried wheels"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/mori-site .whl/*.whl
  export PYTHONPATH="/tmp/mori-site${PYTHONPATH:+:$PYTHONPATH}"
fi

step "build (MORI_CUDA=on, sm_${MORI_CUDA_ARCHS})"
for pkg in ${MORI_GPU_CHECK_PACKAGES:-mori-core mori-io mori-ep mori-ccl}; do
  if ! "$PY" -m pip install --no-build-isolation --no-deps -v -C build-dir=build/gpu \
      "./packages/$pkg" >"$OUT/build-$pkg.log.tmp" 2>&1; then
    echo "BUILD FAILED: $pkg"; tail -40 "$OUT/build-$pkg.log.tmp"; cat "$OUT/build-$pkg.log.tmp" >>"$OUT/build.log"
    exit 1
  fi
  cat "$OUT/build-$pkg.log.tmp" >>"$OUT/build.log"; rm -f "$OUT/build-$pkg.log.tmp"
  echo "built $pkg"
done

step "topology"
"$PY" -m mori.core.topology 2>&1 | tee "$OUT/topology.txt" || status=1
"$PY" -m mori.core.topology --json >"$OUT/topology.json" || status=1
"$PY" -c 'import json,mori.core as m; print(json.dumps(m.build_info()))' | tee "$OUT/build_info.json"

step "tests"
tests="${MORI_GPU_CHECK_TESTS:-packages/mori-core/tests packages/mori-io/tests packages/mori-ep/tests packages/mori-ccl/tests tests_integration}"
# One pytest per path (words starting with "-" are options for every run): a call cut
# off at the device's time limit then loses only the running file's failure details,
# not those of every file before it (pytest prints them at the end of its run).
opts=() paths=() failed=()
for w in $tests; do case "$w" in -*) opts+=("$w") ;; *) paths+=("$w") ;; esac; done
: >"$OUT/pytest.log"
for path in "${paths[@]}"; do
  echo "=== pytest $path" | tee -a "$OUT/pytest.log"
  "$PY" -m pytest -ra --import-mode=importlib -p no:cacheprovider --timeout=600 "${opts[@]}" \
    "$path" 2>&1 | tee -a "$OUT/pytest.log"
  rc="${PIPESTATUS[0]}"
  # 5: nothing collected (e.g. a directory whose every test is for another machine).
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then status=1; failed+=("$path (rc $rc)"); fi
done
echo "=== pytest: ${#paths[@]} path(s), failed: ${failed[*]:-none}" | tee -a "$OUT/pytest.log"

# Benchmarks: MORI_GPU_CHECK_BENCH holds shell commands (run after the tests, output
# in $OUT/bench.log), e.g. "python3 -m mori.io.bench --backend p2p --all --json $OUT/p2p.json".
# Unset: at the machine's world size (every visible GPU: 2, 4 or 8) mori-ep's bench over
# the EP8 table's token counts, its low-latency kernel types over decode's token counts
# (with the AsyncLL overlap), mori-ccl's collectives and the symmetric heap's bench, each
# writing its JSON as it ends (a run cut off at the device's time limit keeps the ones
# done; pick fewer with this variable); set to "" for none.
if [ -z "${MORI_GPU_CHECK_BENCH+x}" ]; then
  ngpu="$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)"
  MORI_GPU_CHECK_BENCH=""
  if [ "$ngpu" -ge 2 ]; then
    MORI_GPU_CHECK_BENCH="$PY -m mori.ep.bench --world-size $ngpu --tokens 128,512,1024,2048,4096 --json $OUT/ep_bench.json; \
$PY -m mori.ep.bench --world-size $ngpu --max-tokens 256 --tokens 1,8,32,128,256 --kernel-type IntraNode,IntraNodeLL,AsyncLL,AsyncLL-ce,standard-moe,standard-moe-rows,deepep-ll --overlap --json $OUT/ep_ll_bench.json; \
$PY -m mori.ccl.bench --world-size $ngpu --json $OUT/ccl_bench.json; \
$PY -m mori.core.bench_shmem --max-size 256M --json $OUT/shmem_bench.json"
  fi
fi
if [ -n "${MORI_GPU_CHECK_BENCH:-}" ]; then
  step "benchmarks"
  bash -c "$MORI_GPU_CHECK_BENCH" 2>&1 | tee "$OUT/bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

step "summary"
tail -3 "$OUT/pytest.log"
exit $status
