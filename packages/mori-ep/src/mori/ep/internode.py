# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The inter-node modes: MORI's ``InterNode``, ``InterNodeV1`` and ``InterNodeV1LL``.

Pes are grouped into nodes of ``L = min(gpu_per_node, pes of the heap's local group)``
consecutive ranks (rank ``r`` on node ``r // L``); the pes of one node reach each other
through the symmetric heap, every byte to another node goes through the op's
inter-node link (``csrc/internode/link.hpp``). ``InterNode`` sends each token straight
to every destination rank; ``InterNodeV1`` sends it once per destination node, to the
rank with the sender's local index there, which forwards it to the node's other
destinations, and combine sums within each node before one partial per (token, node)
crosses back; ``InterNodeV1LL`` is V1 without the count exchange (fixed slots per source,
"count + 1" flags). The protocols, their row and summation orders and byte formulas are
in ``csrc/internode/protocol.hpp`` and the package README ("Inter-node"). Dispatch and
combine take and return what the intra-node calls do; the checks are the same
(:mod:`mori.ep.checks`). On a host heap every kind runs (``InterNodeCpu``); on a CUDA
heap every kind runs as kernels (``InterNodeCuda``: this node's ranks by load/store,
other nodes through the proxy's queues, pushed by the kernel). On CUDA, synchronize the
stream before copying results to pageable host memory (``tensor.cpu()``): such a copy
holds the CUDA context while the kernel waits for the proxy, which needs it.

CUDA graphs (every kind): the kernels number their calls in the op's block and never
wait for the host, so dispatch and combine can be captured and replayed, each replay a
new call on every rank with the proxy thread serving it as it serves eager calls. The
host's checks (a combine needs a dispatch before it, a routing handle's order) run when
a call is captured, not per replay; ``bytes()`` reports the last replay's counts, its
``moved`` everything the proxy moved since the capture. Every rank must capture the same
calls and replay the graph as many times; finish the capture on every rank before any
rank replays (a barrier: a replay waits for its peers' calls, and its traffic may reach
a peer's proxy while that peer still captures).
"""

from __future__ import annotations

import contextlib

import torch

from mori.core import (
    InvalidArgumentError,
    MoriTimeoutError,
    NotSupportedError,
    TransportError,
    env,
    shmem,
)

from ._C import InterNodeCpu, internode_buffer_layout
from .config import EpDispatchCombineKernelType, EpDispatchCombineQuantType
from .intranode import IntraNodeMode
from .mode import Mode

try:  # a build with CUDA
    from ._C import InterNodeCuda
except ImportError:
    InterNodeCuda = None

# How bytes reach other nodes (docs/configuration.md): "proxy" (mori-core's proxy) or
# "heap" (direct copies through the host heap: a baseline without the proxy).
LINK_ENV = "MORI_EP_INTERNODE_LINK"

KINDS = (
    EpDispatchCombineKernelType.InterNode,
    EpDispatchCombineKernelType.InterNodeV1,
    EpDispatchCombineKernelType.InterNodeV1LL,
)


def pes_per_node(config) -> int:
    """``L``, the ranks per node of an inter-node op of ``config`` on the initialised
    heap: ``min(gpu_per_node, world_size, pes of this pe's local group)`` (the heap's
    local group: same host, or same ``MORI_SHMEM_NODE_ID``). Raises
    InvalidArgumentError when it does not divide ``world_size``."""
    g = config.gpu_per_node
    if not isinstance(g, int) or isinstance(g, bool) or g < 1:
        raise InvalidArgumentError(f"gpu_per_node {g!r} must be a positive int")
    local = len(shmem.info()["local_pes"])
    size = min(g, config.world_size, local)
    if config.world_size % size:
        raise InvalidArgumentError(
            f"{size} ranks per node (min(gpu_per_node {g}, world_size {config.world_size}, "
            f"{local} pes on this host)) do not divide world_size {config.world_size}"
        )
    return size


class InterNodeMode(IntraNodeMode):
    """The strategy behind the inter-node kernel types (the public contract is
    :class:`~mori.ep.EpDispatchCombineOp`'s). Dispatch's rows are ordered by source
    rank, then source token, as intra-node; routing handles (:mod:`mori.ep.routing`)
    work as intra-node: a replay sends each token to the ranks it went to then, a
    handle's combine reverses its dispatch."""

    def __init__(self, config, place, timeout_s: float) -> None:
        Mode.__init__(self, config, place, timeout_s)
        c = config
        if not place.host and InterNodeCuda is None:
            raise NotSupportedError(
                f"kernel_type {c.kernel_type.name} has no CUDA kernels in this build; use a host "
                "heap (the CPU implementation)"
            )
        self.local_size = pes_per_node(c)
        cap = c.max_num_tokens_to_recv
        self.layout = internode_buffer_layout(
            *self.shape, recv_capacity=cap, kind=int(c.kernel_type), local_size=self.local_size,
            device=not place.host,
        )  # fmt: skip
        link = env.get_str(LINK_ENV, "proxy")
        if link not in ("proxy", "heap"):
            raise InvalidArgumentError(f"{LINK_ENV}={link!r} is not 'proxy' or 'heap'")
        if link != "proxy" and not place.host:
            raise NotSupportedError(
                f"{LINK_ENV}={link!r} is for host heaps; CUDA heaps use the proxy"
            )
        self.block = shmem.empty((self.layout["total_bytes"],), torch.uint8)
        if place.host:
            self.impl = InterNodeCpu(
                *self.shape, self.block.data_ptr(), place.index, timeout_s, recv_capacity=cap,
                kind=int(c.kernel_type), local_size=self.local_size, link=link,
            )  # fmt: skip
        else:
            self.impl = InterNodeCuda(
                *self.shape, self.block.data_ptr(), place.index, timeout_s, recv_capacity=cap,
                kind=int(c.kernel_type), local_size=self.local_size,
            )  # fmt: skip
        self.routing_owner = object()
        self.map_recv_regions()

    @property
    def nodes(self) -> int:
        return self.config.world_size // self.local_size

    @contextlib.contextmanager
    def fails_on_timeout(self):
        """As Mode's, and a failed inter-node link (TransportError: the proxy lost a
        peer) leaves the op unusable as a timeout does."""
        try:
            yield
        except (MoriTimeoutError, TransportError) as e:
            self._timed_out = str(e).splitlines()[0]
            raise

    def epoch_tensor(self) -> torch.Tensor:
        """The last dispatch's epoch as an int64 ``[1]`` tensor, for routing handles: on
        CUDA the kernels' own count in the block (DeviceState.dispatch_calls, advanced on
        the device: no host copy, so a handle can be made inside a CUDA-graph capture),
        on the host the implementation's counter."""
        if self.place.host:
            return torch.tensor([self.impl.epoch], dtype=torch.int64)
        return self.region("state", 8).view(torch.int64)

    def dispatch(self, input, weights, scales, indices, block_num, rdma_block_num,
                 warp_per_block, call_local_expert_count, routing, return_routing):  # fmt: skip
        out = super().dispatch(input, weights, scales, indices, block_num, rdma_block_num,
                               warp_per_block, call_local_expert_count, routing,
                               return_routing)  # fmt: skip
        if return_routing:
            self._fill_node_maps(out[-1], indices)
        return out

    def _fill_node_maps(self, handle, indices) -> None:
        """MORI's inter-node maps of a new handle (informational here: the native
        combine reads the destination sets): ``inter_node_disp_send_map`` int32
        ``[N * M]``, entry ``n * M + t`` = 1 when token ``t`` has a destination on node
        ``n``; ``inter_node_disp_dest_tok_id_map`` int32 ``[N * M * K]``, entry
        ``(n * M + t) * K + k`` = 1 when slot ``k``'s expert lives on node ``n``."""
        c = self.config
        m, w, k, n_nodes = (
            c.max_num_inp_token_per_rank,
            c.world_size,
            c.num_experts_per_token,
            self.nodes,
        )
        n = handle.cur_rank_num_token
        sent = handle.disp_dest_tok_id_map.view(m, w) == 1
        send = sent.view(m, n_nodes, self.local_size).any(2).t().contiguous().to(torch.int32)
        dest = torch.zeros((n_nodes, m, k), dtype=torch.int32, device=self.device)
        ids = indices[:n].to(torch.int64)
        node = torch.where(ids >= 0, ids // c.num_experts_per_rank // self.local_size, -1)
        for j in range(n_nodes):
            dest[j, :n] = (node == j).to(torch.int32)
        handle.inter_node_disp_send_map = send.flatten()
        handle.inter_node_disp_dest_tok_id_map = dest.flatten()

    def combine(self, input, weights, indices, block_num, rdma_block_num, warp_per_block,
                use_external_inp_buf, routing):  # fmt: skip
        if self.quant in (
            EpDispatchCombineQuantType.Fp8BlockwiseQuant,
            EpDispatchCombineQuantType.Fp4BlockwiseQuant,
        ):
            # MORI: blockwise combine has no inter-node kernel; refused by every rank.
            self.impl_or_raise().reject_combine(
                f"{self.config.kernel_type.name} combine only supports quant_type none and "
                "fp8_direct_cast (fp8_blockwise: IntraNode, IntraNodeLL, AsyncLL; "
                "fp4_blockwise: not implemented)",
                0,
            )
        return super().combine(input, weights, indices, block_num, rdma_block_num,
                               warp_per_block, use_external_inp_buf, routing)  # fmt: skip

    def bytes(self, phase: str) -> dict[str, int]:
        """This rank's byte counts of its last ``phase`` (``"dispatch"`` or
        ``"combine"``): see ``InterNodeCpu.bytes``."""
        return dict(self.impl_or_raise().bytes(phase))
