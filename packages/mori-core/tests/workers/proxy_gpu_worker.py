# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One pe of the proxy's GPU tests: kernels push into the proxy's queues over a CUDA
heap. argv: seed pes_per_node

Every pe runs on GPU 0 (2 processes share it: correctness only). Nodes are emulated
with MORI_SHMEM_NODE_ID: pes_per_node 1 puts the two pes on two nodes (path tcp, the
CUDA heap staged through host buffers), 2 on one node (path mapped, CUDA IPC). A
kernel pushes a write+add of random bytes to the peer (then a device Quiet), the peer
checks them bit for bit after its signal; then 8 blocks push 1000 adds each and the
peer's word must reach exactly 8000; then 4 blocks push 250 adds each to the pe itself
(path mapped, applied by the proxy's own kernel while the pushing kernel spins) and
the own word must reach exactly 1000; then one thread times 1000 push -> retire round
trips. Prints "pe N ok" at the end.
"""

import os
import statistics
import sys

seed, per_node = int(sys.argv[1]), int(sys.argv[2])
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
os.environ["MORI_SHMEM_NODE_ID"] = f"n{rank // per_node}"

import torch  # noqa: E402

from mori.core import proxy as px  # noqa: E402
from mori.core import shmem  # noqa: E402
from mori.core.bootstrap import TcpBootstrap  # noqa: E402

torch.cuda.set_device(0)
boot = TcpBootstrap.from_env()
shmem.init(device=0, heap_size="64M", bootstrap=boot, timeout_s=120)
me, n = shmem.my_pe(), shmem.n_pes()
peer = (me + 1) % n
p = px.Proxy(boot, producer="cuda", timeout_s=120)
want_path = "mapped" if per_node == 2 else "tcp"
assert p.path_to(peer) == want_path, (p.path_to(peer), want_path)

N = (3 << 20) + 5  # more than one staging chunk, odd length


def data_of(pe):
    g = torch.Generator().manual_seed(seed * 1000003 + pe)
    return torch.randint(0, 256, (N,), dtype=torch.uint8, generator=g)


src = shmem.empty((N,), torch.uint8)
dst = shmem.empty((N,), torch.uint8)
sig = shmem.empty((3,), torch.int64)
src.copy_(data_of(me).cuda())
dst.zero_()
sig.zero_()
torch.cuda.synchronize()
shmem.barrier_all()
off = px.heap_offset
stream = torch.cuda.current_stream().cuda_stream

p._p._device_push("write_add", peer, off(dst), off(src), N, off(sig), 1, 1, 1, True, stream)
torch.cuda.synchronize()  # the kernel's Quiet returned: landed at the peer
shmem.wait_until(sig, "ge", 1, timeout_s=60)
got = dst.cpu()
want = data_of((me - 1) % n)
bad = (got != want).nonzero()
assert bad.numel() == 0, f"pe {me}: {bad.numel()} bytes differ, first at {bad[0].item()}"
print(f"pe {me}: {N} bytes over {want_path} bit for bit", flush=True)

p._p._device_push("atomic_add", peer, 0, 0, 0, off(sig) + 8, 1, 1000, 8, True, stream)
torch.cuda.synchronize()
shmem.wait_until(sig[1:], "ge", 8000, timeout_s=60)
shmem.barrier_all()
assert int(sig[1].item()) == 8000, int(sig[1].item())

assert p.path_to(me) == "mapped", p.path_to(me)
p._p._device_push("atomic_add", me, 0, 0, 0, off(sig) + 16, 1, 250, 4, True, stream)
torch.cuda.synchronize()  # the kernel's Quiets returned: every add applied here
assert int(sig[2].item()) == 1000, int(sig[2].item())

out = torch.zeros(1000, dtype=torch.int64, device="cuda")
p._p._device_push_latency("atomic_add", peer, 0, 0, 0, off(sig) + 8, 1000, out.data_ptr(), stream)
torch.cuda.synchronize()
lat = out.cpu().tolist()
print(f"pe {me}: kernel push -> retire median {statistics.median(lat) / 1000:.1f} us "
      f"(2 processes share one GPU)", flush=True)  # fmt: skip
shmem.barrier_all()
p.close()
del src, dst, sig
shmem.finalize(force=True)
print(f"pe {me} ok")
