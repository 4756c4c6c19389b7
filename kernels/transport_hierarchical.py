"""A two-level all-to-all: through the node first, then one exchange per pair of nodes.

A flat all-to-all over ``W`` ranks has every rank talk to ``W - 1`` peers; across nodes each of those
messages pays the network's latency, which dominates at scale (docs/design.md#hierarchical-all-to-all).
With ``N`` nodes of ``g`` ranks (rank ``r`` = node ``r // g``, local index ``r % g``):

1. **within the node** (``node`` transport, ``g`` ranks, the fast links): rank ``(n, l)`` sends to
   its node peer ``l'`` every row bound for a rank with local index ``l'`` on any node;
2. **across nodes** (``cross`` transport, the ``N`` ranks sharing a local index): rank ``(n, l')``
   sends to ``(n', l')`` the rows its node gathered for ``(n', l')``.

Each rank then talks to ``g - 1`` node peers and ``N - 1`` remote peers instead of ``W - 1``; the
bytes crossing the network are the same. Rows arrive from node 0's ranks in local order, then node
1's...: the flat transport's order, so the result is bitwise the flat one.

Before step 1 the ranks of a node swap how many rows each sends to every node (``N`` integers per
peer, a fixed size), which is what the regrouping between the steps needs. Without known receive
counts, those swapped counts then cross the nodes as step 2 does and give them: two small
collectives before the data, as the flat transport's one count exchange. ``start`` runs the swap
and launches step 1; ``wait`` finishes step 1, regroups and runs step 2.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .transport_base import Counts, Transport, TransportHandle, check_send, counts_list


@dataclass(frozen=True)
class NodeLayout:
    """``nodes`` nodes of ``ranks_per_node`` consecutive ranks each; this rank's place in them."""

    nodes: int
    ranks_per_node: int
    rank: int

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.ranks_per_node < 1:
            raise ValueError(f"NodeLayout needs >= 1 node of >= 1 rank, got {self.nodes} x {self.ranks_per_node}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside {self.nodes} nodes x {self.ranks_per_node} ranks")

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def node(self) -> int:
        return self.rank // self.ranks_per_node

    @property
    def local(self) -> int:
        return self.rank % self.ranks_per_node

    def node_ranks(self, node: int) -> list[int]:
        """Ranks of ``node``, in local order (the groups of step 1)."""
        return list(range(node * self.ranks_per_node, (node + 1) * self.ranks_per_node))

    def peer_ranks(self, local: int) -> list[int]:
        """Ranks with local index ``local``, one per node, in node order (the groups of step 2)."""
        return [node * self.ranks_per_node + local for node in range(self.nodes)]


def node_layout(world_size: int, ranks_per_node: int, rank: int) -> NodeLayout:
    """The layout of ``world_size`` ranks in nodes of ``ranks_per_node``; one line when it does not divide."""
    if ranks_per_node < 1 or world_size % ranks_per_node:
        raise ValueError(
            f"a hierarchical all-to-all needs whole nodes: {world_size} ranks "
            f"do not split into nodes of {ranks_per_node}"
        )
    return NodeLayout(world_size // ranks_per_node, ranks_per_node, rank)


def regroup(rows: Tensor, counts: Sequence[Sequence[int]]) -> Tensor:
    """``rows`` laid out as blocks ``(a, b)`` in ``a``-major order, ``counts[a][b]`` rows each, laid
    out ``b``-major instead (block ``(0, 0)``, ``(1, 0)``, ... ``(0, 1)``, ...)."""
    width = len(counts[0]) if counts else 0
    starts, offset = [], 0
    for row in counts:
        starts.append([])
        for count in row:
            starts[-1].append(offset)
            offset += count
    pieces = [rows[starts[a][b] : starts[a][b] + counts[a][b]] for b in range(width) for a in range(len(counts))]
    pieces = [piece for piece in pieces if piece.shape[0]]
    return torch.cat(pieces) if len(pieces) > 1 else (pieces[0] if pieces else rows[:0])


class HierarchicalHandle(TransportHandle):
    """Step 1 in flight; ``wait`` finishes it and runs step 2."""

    def __init__(self, transport: HierarchicalTransport, first: TransportHandle, gathered: list[list[int]],
                 recv_counts: list[int]) -> None:  # fmt: skip
        self._transport, self._first, self._gathered, self.recv_counts = transport, first, gathered, recv_counts
        self._result: Tensor | None = None

    def wait(self) -> Tensor:
        if self._result is None:
            self._result = self._transport.finish(self._first.wait(), self._gathered, self.recv_counts)
        return self._result


class HierarchicalTransport(Transport):
    """The all-to-all of ``layout.world_size`` ranks as a ``node`` exchange then a ``cross`` one
    (module docstring). ``node`` spans this rank's node, ``cross`` the ranks of its local index."""

    def __init__(self, layout: NodeLayout, node: Transport, cross: Transport) -> None:
        if node.world_size != layout.ranks_per_node or cross.world_size != layout.nodes:
            raise ValueError(
                f"HierarchicalTransport: node transport spans {node.world_size} ranks and cross {cross.world_size}, "
                f"the layout has {layout.ranks_per_node} per node and {layout.nodes} nodes"
            )
        self.layout, self.node, self.cross = layout, node, cross
        self.rank, self.world_size = layout.rank, layout.world_size
        self.concurrent = node.concurrent and cross.concurrent
        # where the small count tensors live: NCCL and the copy engines move CUDA tensors only
        self.count_device = getattr(node, "count_device", None) or getattr(node, "device", torch.device("cpu"))

    def exchange_counts(self, send_counts: Counts) -> list[int]:
        """One count per rank, through the same two steps (fixed sizes: no counts of the counts)."""
        self._check_open()
        return self._exchange_both_counts(counts_list(send_counts, self.world_size, "send_counts"))[1]

    def start(self, send_buffer: Tensor, send_counts: Counts, recv_counts: Counts | None = None) -> TransportHandle:
        self._check_open()
        sc = counts_list(send_counts, self.world_size, "send_counts")
        send = check_send(send_buffer, sc)
        if recv_counts is None:  # the count exchange's first step also gives what the regrouping needs
            gathered, rc = self._exchange_both_counts(sc)
        else:
            gathered = self._gathered(self._swap_node_counts(sc))
            rc = counts_list(recv_counts, self.world_size, "recv_counts")
        per_node = self.layout.ranks_per_node
        to_peers = [sum(sc[n * per_node + local] for n in range(self.layout.nodes)) for local in range(per_node)]
        first = self.node.start(self._by_local_index(send, sc), to_peers, [sum(row) for row in gathered])
        return HierarchicalHandle(self, first, gathered, rc)

    def finish(self, received: Tensor, gathered: list[list[int]], recv_counts: list[int]) -> Tensor:
        """Step 2: the rows gathered from the node (blocks by node peer, then destination node),
        regrouped by destination node, sent across; arrive in source-rank order."""
        nodes, per_node = self.layout.nodes, self.layout.ranks_per_node
        to_nodes = [sum(gathered[local][n] for local in range(per_node)) for n in range(nodes)]
        from_nodes = [sum(recv_counts[n * per_node : (n + 1) * per_node]) for n in range(nodes)]
        return self.cross.start(regroup(received, gathered), to_nodes, from_nodes).wait()

    def _by_local_index(self, rows: Tensor, counts: list[int]) -> Tensor:
        """Rows ordered by destination rank (node-major) reordered local-index-major for step 1."""
        per_node = self.layout.ranks_per_node
        by_node = [counts[n * per_node : (n + 1) * per_node] for n in range(self.layout.nodes)]
        return regroup(rows, by_node)

    def _swap_node_counts(self, send_counts: list[int]) -> Tensor:
        """``[g·N, 1]``: row ``l·N + n`` = rows node peer ``l`` sends this rank in step 1 that are bound
        for node ``n`` (``_gathered`` makes the table of it)."""
        nodes, per_node = self.layout.nodes, self.layout.ranks_per_node
        mine = torch.tensor(send_counts, dtype=torch.int64, device=self.count_device)
        return self.node.start(self._by_local_index(mine.unsqueeze(1), [1] * self.world_size), [nodes] * per_node,
                               [nodes] * per_node).wait()  # fmt: skip

    def _gathered(self, swapped: Tensor) -> list[list[int]]:
        return swapped.view(self.layout.ranks_per_node, self.layout.nodes).tolist()

    def _exchange_both_counts(self, send_counts: list[int]) -> tuple[list[list[int]], list[int]]:
        """The node swap of the counts, then its result across the nodes as step 2 would send it: each
        node peer ``l`` told this rank how many rows it sends to this local index on every node, so the
        cross step of those gives the receive counts. Two small collectives instead of three."""
        nodes, per_node = self.layout.nodes, self.layout.ranks_per_node
        swapped = self._swap_node_counts(send_counts)
        ones = [[1] * nodes for _ in range(per_node)]
        return self._gathered(swapped), self.finish(swapped, ones, [1] * self.world_size).squeeze(1).tolist()

    def close(self) -> None:
        self.node.close()
        self.cross.close()
        super().close()
