# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One pe of the bad-input tests of mori.core.shmem. argv: mode

Modes: "overflow" (a heap size whose node-wide total overflows), "mismatch" /
"mismatch-tcp" (pe 0 in malloc while the others are in finalize, over gloo's
TorchBootstrap or the native TcpBootstrap). Prints "pe N ok" at the end.
"""

import os
import sys
import time

import mori.core as mc
from mori.core import shmem
from mori.core.launch import expect_raises

mode = sys.argv[1]
rank = int(os.environ["RANK"])

if mode == "overflow":
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://")
    size = 2**63 + 2**22
    expect_raises(mc.InvalidArgumentError, str(size), shmem.init, None, "cpu", size, timeout_s=30)
    assert not shmem.initialized()
    # The heap is still usable with a sane size afterwards.
    shmem.init(device="cpu", heap_size="4M", timeout_s=30)
    shmem.finalize()
    dist.destroy_process_group()
elif mode in ("mismatch", "mismatch-tcp"):
    if mode == "mismatch-tcp":
        from mori.core.bootstrap import TcpBootstrap

        boot = TcpBootstrap.from_env()
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="env://")
        boot = None
    shmem.init(device="cpu", heap_size="4M", bootstrap=boot, timeout_s=20)
    start = time.monotonic()
    if rank == 0:
        msg = expect_raises(mc.MoriError, "collective mismatch", shmem.malloc, 64)
    else:
        msg = expect_raises(mc.MoriError, "collective mismatch", shmem.finalize)
    elapsed = time.monotonic() - start
    assert elapsed < 20, f"the mismatch took {elapsed:.1f} s to report"
    print(f"pe {rank}: {msg}")
    # Every pe raised; the allocator of pe 0 did not keep the failed block.
    assert shmem.info()["live_allocations"] == 0, shmem.info()
else:
    raise SystemExit(f"unknown mode {mode}")
print(f"pe {rank} ok")
sys.stdout.flush()
# The bootstrap may be unusable after the mismatch: skip teardown that needs it.
os._exit(0)
