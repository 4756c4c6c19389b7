"""The dense part of the model: an HSTU-style sequential transducer (or SASRec) and its loss.

Embedding tables are *not* here: they are sharded across ranks (``sharded.py`` or TorchRec), and the
engines hand this module the looked-up rows. Keeping the dense part table-free is what lets the
FreeScale engine, the TorchRec baseline and the single-process reference run the very same code.

HSTU layer (generative-recommenders, "Actions Speak Louder than Words"): a fused projection
``silu(W_uvqk · LN(x))`` split into u, v, q, k; pointwise attention ``silu(qkᵀ + rab) / n`` with a
causal mask and a relative bias of position distance and log-bucketed time gap; a gated output
``x + W_o · (u ⊙ LN(attn · v))``. The attention runs as the jagged Triton kernel on CUDA or as
length-grouped padded PyTorch (``model_extra.attention``; docs/kernels.md). ``n`` is the sample's
own length (GR divides by the padded batch max); that keeps a sample's output independent of which
samples share its micro-batch, which the jagged layout, the sharded/reference equivalence test and
resume exactness rely on. The time bias of
query ``i`` and key ``j`` buckets ``t_{i+1} - t_j``, as GR does: position ``i`` predicts the event at
``t_{i+1}`` and knows *when* it is asked (the request time, known when serving), so it can tell a
continuing session from a return after a long gap. Only that timestamp of the target is read, never
its item or action.

Precision (``model_extra.precision``): ``fp32``, or ``bf16``: the layers run under bf16 autocast
(products in bf16 on the tensor cores, normalisations and the residual stream in float32) and hand
float32 outputs to the loss; parameters, embedding rows and optimizer state stay float32.

SASRec (Kang & McAuley 2018): pre-LN softmax self-attention plus feed-forward blocks; no timestamps.

Inputs of both: item + action embedding of each event (the same tables) plus a learned absolute
position embedding (SASRec's; GR's HSTU adds one too, on top of its relative bias).

Loss: sampled softmax over l2-normalised embeddings with a temperature, autoregressive next-item on
every position; the negatives of a micro-batch are ``num_negatives`` uniform random items plus
``inbatch_negatives`` targets of the same micro-batch, shared by all positions; a negative equal to
the position's target is masked out (accidental hit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from freescale.kernels.hstu_attention import hstu_attention
from freescale.kernels.hstu_attention_ref import time_bucket
from freescale.kernels.triton_support import triton_unavailable_reason
from freescale.model_config import ModelConfig
from freescale.trainer.data.jagged import JaggedLayout, from_groups, pad_source, to_padded
from freescale.trainer.learning_config import ModelExtraConfig


def resolve_attention(choice: str, architecture: str, device: torch.device) -> str:
    """The HSTU attention that runs: ``model_extra.attention`` resolved for ``device``.

    ``auto`` picks the Triton kernel on CUDA (where Triton is installed) and the length-grouped
    PyTorch attention elsewhere; ``triton`` on a CPU tensor needs ``TRITON_INTERPRET=1`` (tests).
    """
    if architecture != "hstu":
        return "torch"
    if choice == "auto":
        return "triton" if triton_unavailable_reason(device) is None and device.type == "cuda" else "torch"
    if choice == "triton" and (reason := triton_unavailable_reason(device)) is not None:
        raise ValueError(f"model_extra.attention 'triton' cannot run here: {reason} (use 'torch' or 'auto')")
    return choice


@dataclass
class JaggedContext:
    """What the Triton attention of every layer reads: sample offsets, times, the longest sample."""

    offsets: torch.Tensor  # [B + 1] int64
    timestamps: torch.Tensor  # [N] int64
    query_times: torch.Tensor  # [N] int64
    max_len: int


@dataclass
class GroupContext:
    """Per length group, what every layer's attention reuses (built once per forward, not per layer)."""

    mask: torch.Tensor  # [B, 1, L, L] bool: causal and real keys
    row_scale: torch.Tensor  # [B, 1, L, L] float: mask / n (HSTU's pointwise normalisation)
    distance: torch.Tensor | None  # [L, L] long: clamped i - j (HSTU position bias)
    gaps: torch.Tensor | None  # [B, L, L] long: time bucket of t_{i+1} - t_j (HSTU time bias)


def attention_contexts(
    layout: JaggedLayout,
    timestamps: torch.Tensor,
    query_times: torch.Tensor,
    max_distance: int,
    time_buckets: int | None,
) -> list[GroupContext]:
    """``GroupContext`` of every group; ``time_buckets=None`` skips the HSTU bias indices.

    ``timestamps``: each input event's time; ``query_times``: the time of the event each position
    predicts (the module docstring says why the time bias reads it).
    """
    contexts = []
    ts_source, query_source = pad_source(timestamps), pad_source(query_times)
    for group in layout.groups:
        width = group.max_len
        causal = torch.ones(width, width, dtype=torch.bool, device=group.valid.device).tril()
        mask = (causal[None] & group.valid[:, None, :])[:, None]
        distance = gaps = None
        if time_buckets is not None:
            steps = torch.arange(width, device=group.valid.device)
            distance = (steps[:, None] - steps[None, :]).clamp(0, max_distance - 1)
            ts, queries = to_padded(ts_source, group), to_padded(query_source, group)
            gaps = time_bucket(queries[:, :, None] - ts[:, None, :], time_buckets)
        row_scale = mask / group.lengths.to(torch.float32)[:, None, None, None]
        contexts.append(GroupContext(mask, row_scale, distance, gaps))
    return contexts


def _lookup(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` whose backward sums by sorted index (``embedding``'s), not with atomics.

    Why: ``table[index]`` backpropagates through ``index_put_(accumulate=True)``, which on CUDA adds
    an ``L x L`` index's gradients into a few hundred entries with colliding atomics: a heavy-tailed
    micro-batch's backward took 6.7 s on an H200 that way (bench_hstu_attention, first GPU run).
    """
    return F.embedding(index, table[:, None])[..., 0]


class HSTULayer(nn.Module):
    """One HSTU layer over jagged rows ``[N, d]``."""

    def __init__(self, d_model: int, num_heads: int, max_len: int, time_buckets: int, dropout: float) -> None:
        super().__init__()
        self.d_model, self.num_heads = d_model, num_heads
        self.norm_in = nn.LayerNorm(d_model)
        self.uvqk = nn.Linear(d_model, 4 * d_model)
        self.norm_attn = nn.LayerNorm(d_model)
        self.out = nn.Linear(d_model, d_model)
        self.pos_bias = nn.Parameter(torch.zeros(max_len))
        self.time_bias = nn.Parameter(torch.zeros(time_buckets))
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, layout: JaggedLayout, contexts: list[GroupContext] | JaggedContext
    ) -> torch.Tensor:
        u, v, q, k = F.silu(self.uvqk(self.norm_in(x))).split(self.d_model, dim=-1)
        attn = self._attention(q, k, v, layout, contexts)
        return x + self.out(self.dropout(u * self.norm_attn(attn)))

    def _attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layout: JaggedLayout,
        contexts: list[GroupContext] | JaggedContext,
    ) -> torch.Tensor:
        """Pointwise SiLU attention ``silu(qkᵀ + rab) / n`` under the causal mask: the jagged Triton
        kernel (``JaggedContext``), or one padded batch per length group."""
        if isinstance(contexts, JaggedContext):
            c = contexts
            return hstu_attention(q, k, v, c.offsets, c.timestamps, c.query_times, self.pos_bias, self.time_bias,
                                  self.num_heads, c.max_len)  # fmt: skip
        if not layout.groups:  # empty micro-batch: keep every parameter in the graph (DDP)
            return torch.zeros_like(v) + 0.0 * (self.pos_bias.sum() + self.time_bias.sum())
        h, dh = self.num_heads, self.d_model // self.num_heads
        sources = [pad_source(t) for t in (q, k, v)]
        outputs = []
        for group, ctx in zip(layout.groups, contexts):
            qg, kg, vg = (to_padded(s, group).unflatten(-1, (h, dh)).transpose(1, 2) for s in sources)
            bias = _lookup(self.pos_bias, ctx.distance)[None] + _lookup(self.time_bias, ctx.gaps)
            weights = F.silu(qg @ kg.transpose(-1, -2) + bias[:, None]) * ctx.row_scale
            outputs.append((weights @ vg).transpose(1, 2).flatten(2))
        return from_groups(outputs, layout)


class SASRecLayer(nn.Module):
    """A pre-LN causal softmax self-attention + feed-forward block over jagged rows."""

    def __init__(self, d_model: int, num_heads: int, ffn_multiplier: int, dropout: float) -> None:
        super().__init__()
        self.d_model, self.num_heads = d_model, num_heads
        self.norm_attn = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm_ffn = nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(
            nn.Linear(d_model, ffn_multiplier * d_model), nn.GELU(), nn.Linear(ffn_multiplier * d_model, d_model)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, layout: JaggedLayout, contexts: list[GroupContext]) -> torch.Tensor:
        h, dh = self.num_heads, self.d_model // self.num_heads
        sources = [pad_source(t) for t in self.qkv(self.norm_attn(x)).split(self.d_model, dim=-1)]
        if not layout.groups:  # empty micro-batch: keep every parameter in the graph (DDP)
            return x + 0.0 * sum(p.sum() for p in self.parameters())
        outputs = []
        for group, ctx in zip(layout.groups, contexts):
            qg, kg, vg = (to_padded(s, group).unflatten(-1, (h, dh)).transpose(1, 2) for s in sources)
            attended = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=ctx.mask)
            outputs.append(attended.transpose(1, 2).flatten(2))
        x = x + self.dropout(self.proj(from_groups(outputs, layout)))
        return x + self.dropout(self.ffn(self.norm_ffn(x)))


class SequentialTransducer(nn.Module):
    """Input features → per-position user representations (the dense, data-parallel part)."""

    def __init__(self, model: ModelConfig, extra: ModelExtraConfig) -> None:
        super().__init__()
        self.architecture = extra.architecture
        self.attention = extra.attention
        self.precision = extra.precision
        self.scale = math.sqrt(model.d_model)
        self.max_distance = model.max_uih_len
        self.time_buckets = extra.time_buckets if extra.architecture == "hstu" else None
        self.dropout = nn.Dropout(extra.dropout)
        self.position = nn.Embedding(model.max_uih_len, model.d_model)
        nn.init.normal_(self.position.weight, std=0.02)
        if extra.architecture == "hstu":
            self.layers = nn.ModuleList(
                HSTULayer(model.d_model, model.num_heads, model.max_uih_len, extra.time_buckets, extra.dropout)
                for _ in range(model.num_layers)
            )
            self.final_norm: nn.Module = nn.Identity()
        else:
            self.layers = nn.ModuleList(
                SASRecLayer(model.d_model, model.num_heads, extra.ffn_multiplier, extra.dropout)
                for _ in range(model.num_layers)
            )
            self.final_norm = nn.LayerNorm(model.d_model)

    def forward(
        self,
        item_rows: torch.Tensor,
        action_rows: torch.Tensor,
        layout: JaggedLayout,
        timestamps: torch.Tensor,
        query_times: torch.Tensor,
    ) -> torch.Tensor:
        """``item_rows``/``action_rows``: [N, d] embeddings of the input positions → [N, d].

        ``timestamps`` [N]: each input's time; ``query_times`` [N]: its target's time (HSTU only).
        """
        x = (item_rows + action_rows) * self.scale
        x = self.dropout(x + self.position(layout.positions.clamp(max=self.position.num_embeddings - 1)))
        contexts: list[GroupContext] | JaggedContext
        if resolve_attention(self.attention, self.architecture, x.device) == "triton":
            max_len = max((group.max_len for group in layout.groups), default=0)
            contexts = JaggedContext(layout.offsets, timestamps.long(), query_times.long(), max_len)
        else:
            contexts = attention_contexts(layout, timestamps, query_times, self.max_distance, self.time_buckets)
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16"):
            for layer in self.layers:
                x = layer(x, layout, contexts)
            return self.final_norm(x).float()


def sampled_softmax_loss(
    queries: torch.Tensor,
    positives: torch.Tensor,
    negatives: torch.Tensor,
    target_ids: torch.Tensor,
    negative_ids: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """Mean next-item cross entropy of each query against its positive and the shared negatives."""
    if queries.shape[0] == 0:
        return queries.sum() * 0.0 + negatives.sum() * 0.0
    return sampled_softmax_terms(queries, positives, negatives, target_ids, negative_ids, temperature).mean()


def sampled_softmax_terms(
    queries: torch.Tensor,
    positives: torch.Tensor,
    negatives: torch.Tensor,
    target_ids: torch.Tensor,
    negative_ids: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """Per-position cross entropy (``sampled_softmax_loss`` before the mean).

    Why separate: the online balancer (``online.py``) weights each position by its *home*
    micro-batch's size, wherever it is computed, so it needs the terms, not the local mean.
    """
    q = F.normalize(queries, dim=-1)
    positive = (q * F.normalize(positives, dim=-1)).sum(-1, keepdim=True)
    negative = q @ F.normalize(negatives, dim=-1).T
    negative = negative.masked_fill(target_ids[:, None] == negative_ids[None, :], float("-inf"))
    logits = torch.cat([positive, negative], dim=1) / temperature
    return torch.logsumexp(logits, dim=1) - logits[:, 0]
