# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One pe of the verbs-transport selection tests. argv: mode seed

Two emulated nodes of one pe each (MORI_SHMEM_NODE_ID). Modes:
- "all": every pe asks for transport="verbs". Where no pe can open an RDMA port (no
  NIC: every machine of the project), construction must fail on every pe with
  NotSupportedError naming each pe and why. Where it succeeds (a NIC), one write and
  one add cross and are checked, bit for bit.
- "mixed": pe 0 asks for "verbs", pe 1 for "auto": both must refuse, naming the rule.
Prints "pe N ok" at the end.
"""

import ctypes
import os
import random
import sys
import time

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
mode, seed = sys.argv[1], int(sys.argv[2])
os.environ["MORI_SHMEM_NODE_ID"] = f"n{rank}"

import mori.core as mc  # noqa: E402
from mori.core import proxy as px  # noqa: E402
from mori.core import shmem  # noqa: E402
from mori.core.bootstrap import TcpBootstrap  # noqa: E402

TIMEOUT_S = 30.0
boot = TcpBootstrap.from_env()
shmem.init(device="cpu", heap_size="4M", bootstrap=boot, timeout_s=TIMEOUT_S)
me, n = shmem.my_pe(), shmem.n_pes()
transport = "verbs" if mode == "all" or me == 0 else "auto"
buf = shmem.malloc(4096)
dst = shmem.malloc(4096)
sig = shmem.malloc(8)
try:
    p = px.Proxy(boot, transport=transport, timeout_s=TIMEOUT_S)
except mc.NotSupportedError as e:
    assert mode == "all", e
    text = str(e)
    assert "MORI_PROXY_TRANSPORT=verbs cannot be used" in text, text
    for pe in range(n):
        assert f"pe {pe} (node 'env:n{pe}')" in text, text
    print(f"pe {me} refused: {text}", flush=True)
except mc.InvalidArgumentError as e:
    assert mode == "mixed", e
    assert "must be the same on every pe" in str(e), e
    print(f"pe {me} refused: {e}", flush=True)
else:
    assert mode == "all", "a mixed choice was accepted"
    # A NIC: one write and one add to the other pe, checked there.
    other = 1 - me
    data = random.Random(f"{seed}/{me}").randbytes(4096)
    ctypes.memmove(buf, data, len(data))
    assert p.path_to(other) == "verbs", p.path_to(other)
    p.write_add(other, px.heap_offset(dst), px.heap_offset(buf), 4096, px.heap_offset(sig), 1)
    deadline = time.monotonic() + TIMEOUT_S
    while ctypes.c_uint64.from_address(sig).value < 1:
        p.check_health()
        assert time.monotonic() < deadline, "the add over RDMA never arrived"
        time.sleep(0.001)
    expected = random.Random(f"{seed}/{other}").randbytes(4096)
    assert ctypes.string_at(dst, 4096) == expected, "the RDMA WRITE's bytes differ"
    p.barrier()
    p.close()
    print(f"pe {me}: verbs worked on this machine", flush=True)
shmem.finalize(force=True)
print(f"pe {me} ok", flush=True)
