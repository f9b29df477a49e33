# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the bootstrap tests. argv: mode seed

mode: tcp    native TcpBootstrap from torchrun's environment
      torch  TorchBootstrap over a gloo ProcessGroup, driven through libmori_core's
             native interface (mori::bootstrap::AllGatherBytes / BroadcastBytes)
      dies   like tcp, but rank 1 exits before the first collective; the others
             must raise TransportError/MoriTimeoutError, not hang
"""

import os
import random
import sys

import mori.core as mc
from mori.core.bootstrap import TcpBootstrap, TorchBootstrap


def blob(seed: int, rank: int, round_: int) -> bytes:
    rng = random.Random(seed * 1000003 + rank * 7919 + round_)
    size = 0 if (rank + round_) % 5 == 0 else rng.randrange(1, 70000)
    return rng.randbytes(size)


def exercise(b, seed: int, rounds: int) -> None:
    world = b.world_size
    for rnd in range(rounds):
        got = b.all_gather(blob(seed, b.rank, rnd))
        want = [blob(seed, r, rnd) for r in range(world)]
        assert got == want, f"all_gather mismatch in round {rnd}"
        for root in range(world):
            mine = blob(seed, root, rnd + 100) if b.rank == root else None
            out = b.broadcast(mine, root)
            assert out == blob(seed, root, rnd + 100), f"broadcast from {root} mismatch"
        b.barrier()


def main() -> None:
    mode, seed = sys.argv[1], int(sys.argv[2])
    rank = int(os.environ["RANK"])
    if mode == "torch":
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="env://")
        b = TorchBootstrap()
        # The same object driven from Python and through the native interface.
        exercise(b, seed, rounds=4)
        fixed = b.all_gather_fixed(bytes([rank]) * 3)
        assert fixed == b"".join(bytes([r]) * 3 for r in range(b.world_size)), fixed
        mc._C.bootstrap_barrier(b)
        dist.destroy_process_group()
    elif mode == "tcp":
        b = TcpBootstrap.from_env()
        assert b.rank == rank
        exercise(b, seed, rounds=6)
    elif mode == "dies":
        os.environ["MORI_BOOTSTRAP_TIMEOUT_S"] = "20"
        b = TcpBootstrap.from_env()
        if rank == 1:
            os._exit(0)
        try:
            b.barrier()
            b.barrier()
        except (mc.TransportError, mc.MoriTimeoutError) as e:
            print(f"rank {rank} raised {type(e).__name__}: {e}")
            return
        raise AssertionError("barrier with a dead rank returned")
    print(f"rank {rank} ok")


if __name__ == "__main__":
    main()
