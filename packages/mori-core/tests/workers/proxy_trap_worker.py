# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the proxy's device-trap test. argv: case placement

case dead_peer: two emulated nodes (path tcp), CUDA heaps, a proxy for kernel
producers with a 3 s timeout. Rank 1 leaves right after the setup (its streams close
without a goodbye); rank 0 then launches a kernel that pushes a write to rank 1 and
waits for it (device Quiet): the proxy has failed naming rank 1, so the kernel must
trap printing that, within the timeout. Reports through mori.core.testing.trap_case.
"""

import os
import sys
import time

case, placement = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
os.environ["MORI_SHMEM_NODE_ID"] = f"n{rank}"

import torch  # noqa: E402

from mori.core import proxy as px  # noqa: E402
from mori.core import shmem  # noqa: E402
from mori.core.bootstrap import TcpBootstrap  # noqa: E402
from mori.core.testing import trap_case, trap_report  # noqa: E402

dev = 0 if placement == "shared" else rank
torch.cuda.set_device(dev)
boot = TcpBootstrap.from_env()
shmem.init(device=dev, heap_size="8M", bootstrap=boot, timeout_s=60)
p = px.Proxy(boot, producer="cuda", timeout_s=3.0)
buf = shmem.empty((1 << 16,), torch.uint8)
torch.cuda.synchronize()
boot.barrier()
if case != "dead_peer":
    raise SystemExit(f"unknown case {case}")
if rank == 1:
    trap_report(1, "left")
time.sleep(1.0)  # rank 1 is gone; its streams' end has reached rank 0's proxy
off = px.heap_offset(buf)
stream = torch.cuda.current_stream().cuda_stream
trap_case(
    0,
    case,
    lambda: p._p._device_push("write", 1, off, off, 1 << 16, 0, 0, 1, 1, True, stream),
    completed="the kernel's quiet returned although rank 1 was gone",
)
