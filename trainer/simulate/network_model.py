"""The simulator's network model: times of the collectives a step issues among W ranks (all-to-all,
flat or hierarchical; all-reduce; two collectives side by side), from a profile's latencies and
bandwidths, vectorised over steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from freescale.trainer.simulate.sim_config import NetworkConfig


class NetworkModel:
    """Times of collectives among W ranks, ``ranks_per_node`` to a node (vectorised over steps)."""

    def __init__(self, cfg: NetworkConfig, world_size: int) -> None:
        self.cfg = cfg
        self.w = world_size
        self.local = min(cfg.ranks_per_node, world_size)
        self.nodes = -(-world_size // cfg.ranks_per_node)
        self.intra_bw = cfg.intra_bandwidth_gbytes_s * 1e9
        self.inter_bw = cfg.inter_bandwidth_gbytes_s * 1e9

    def all_to_all(self, per_rank_bytes: np.ndarray | float) -> np.ndarray:
        """Latency + the slowest rank's payload (sent uniformly to all W ranks, 1/W stays local):
        the intra-node share over NVLink-like links and the inter-node share over the NIC, in parallel.
        ``network.all_to_all = "hierarchical"`` over several nodes: ``hierarchical_all_to_all``."""
        b = np.asarray(per_rank_bytes, dtype=np.float64)
        worst = b.max(axis=-1) if b.ndim else b
        if self.cfg.all_to_all == "hierarchical" and self.nodes > 1:
            return self.hierarchical_all_to_all(worst)
        if self.w == 1:
            return np.zeros_like(worst)
        latency = (self.cfg.intra_latency_us if self.nodes == 1 else self.cfg.inter_latency_us) * 1e-6
        latency += self.cfg.per_peer_latency_us * 1e-6 * (self.w - 1)
        intra = worst * (self.local - 1) / self.w / self.intra_bw
        inter = worst * (self.w - self.local) / self.w / self.inter_bw if self.nodes > 1 else 0.0 * worst
        return latency + np.maximum(intra, inter)

    def hierarchical_all_to_all(self, worst: np.ndarray) -> np.ndarray:
        """The exchange through the node first (docs/design.md#hierarchical-all-to-all), its steps one
        after the other: node peers swap per-node counts (one intra latency), then every byte bound
        for another local index crosses the node (``local - 1`` peers), then what the node gathered
        for each other node crosses the NIC (``nodes - 1`` peers, one message each). Per-peer latency
        is paid for ``local - 1 + nodes - 1`` peers instead of ``W - 1``; the NIC's bytes are the
        flat exchange's, and the node's links carry ``(local - 1) / local`` of the payload."""
        us = 1e-6
        node = 2 * self.cfg.intra_latency_us * us + self.cfg.per_peer_latency_us * us * 2 * (self.local - 1)
        node = node + worst * (self.local - 1) / self.local / self.intra_bw
        cross = (self.cfg.inter_latency_us + self.cfg.per_peer_latency_us * (self.nodes - 1)) * us
        return node + cross + worst * (self.nodes - 1) / self.nodes / self.inter_bw

    def side_by_side(self, first: np.ndarray, first_latency: Any, second: float, second_latency: float) -> np.ndarray:
        """Two collectives in flight together over the same links: their latencies overlap, their bytes
        share the bandwidth (the longer latency, then both bandwidth terms). Why not the longer of the
        two: where both are bandwidth-bound the link moves one's bytes after the other's; at 200 Mbit/s
        the trainer's dense all-reduce beside the embedding-gradient exchange took 17 ms, 5 alone."""
        return np.maximum(first_latency, second_latency) + (first - first_latency) + (second - second_latency)

    def all_reduce(self, nbytes: float) -> float:
        """Ring bandwidth term ``2(W-1)/W · bytes / bw`` (the NIC's once the ring leaves a node) and a
        tree-like latency ``2·(α_intra·⌈log2 local⌉ + α_inter·⌈log2 nodes⌉)`` (or the configured
        ``all_reduce_latency_us``); ``all_reduce_bandwidth_gbytes_s`` replaces the link's bandwidth."""
        if self.w == 1:
            return 0.0
        bw = self.inter_bw if self.nodes > 1 else self.intra_bw
        if self.cfg.all_reduce_bandwidth_gbytes_s is not None:
            bw = self.cfg.all_reduce_bandwidth_gbytes_s * 1e9
        hops_intra = int(np.ceil(np.log2(self.local))) if self.local > 1 else 0
        hops_inter = int(np.ceil(np.log2(self.nodes))) if self.nodes > 1 else 0
        latency = 2e-6 * (self.cfg.intra_latency_us * hops_intra + self.cfg.inter_latency_us * hops_inter)
        if self.cfg.all_reduce_latency_us is not None:
            latency = 1e-6 * self.cfg.all_reduce_latency_us
        return latency + 2.0 * (self.w - 1) / self.w * nbytes / bw
