"""Bring your own model: a TorchRec model and training loop fed by the FreeScale loader.

The model is the user's, not FreeScale's: an ``EmbeddingCollection`` (item and action tables,
sharded row-wise by ``DistributedModelParallel``) and a small GRU sequence encoder trained for the
next item at every position (full softmax over the item vocabulary). FreeScale contributes only
``freescale.pipeline.dataset.loader.Loader``: each rank gets its micro-batch of every balanced step as a
``KJTBatch`` (a ``KeyedJaggedTensor`` with keys ``item``, ``action``, ``timestamp`` plus lengths and
next-item targets), read ahead by worker processes.

    freescale generate --preset tiny --set markov_prob=0.5 --out /tmp/tiny
    freescale prepare --sources /tmp/tiny/sources.toml --output /tmp/tiny-prepared --group-size 4 --micro-batch-size 8
    torchrun --nproc-per-node 2 examples/byo_torchrec_model.py --data /tmp/tiny-prepared --steps 60

Pipeline: TorchRec's ``TrainPipelineSparseDist`` itself, on CPU with gloo. In TorchRec 1.9.2 it
creates its memcpy/data-dist CUDA streams only for CUDA/MTIA devices; on CPU it runs the same
schedule on the current thread (batch i+1's ``input_dist`` all-to-alls start before batch i's
forward). The world size must divide the dataset's group size (``prepare --group-size``).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence
from torchrec import EmbeddingCollection, EmbeddingConfig
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.optim.optimizers import in_backward_optimizer_filter

from freescale.pipeline.dataset import Config, Loader
from freescale.pipeline.dataset.kjt import KJTBatch


class Encoder(nn.Module):
    """Everything after the embedding lookup. It holds no sharded module, so TorchRec's pipeline
    tracer keeps it as a leaf and never traces through its Python control flow."""

    def __init__(self, dim: int, num_items: int) -> None:
        super().__init__()
        self.time = nn.Linear(1, dim)
        self.gru = nn.GRU(dim, dim, batch_first=True)
        self.out = nn.Linear(dim, num_items)

    def forward(self, batch: KJTBatch, items: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        lengths = batch.lengths
        times = batch.features["timestamp"].values().double()
        gaps = torch.diff(times, prepend=times[:1])
        gaps[torch.cumsum(lengths, 0) - lengths] = 0.0  # each sample's first event has no gap
        x = items + actions + self.time(torch.log1p(gaps.clamp(min=0)).float().unsqueeze(1))
        padded = pad_sequence(list(torch.split(x, lengths.tolist())), batch_first=True)
        packed = pack_padded_sequence(padded, lengths, batch_first=True, enforce_sorted=False)
        hidden, _ = pad_packed_sequence(self.gru(packed)[0], batch_first=True)
        mask = torch.arange(hidden.shape[1]) < lengths.unsqueeze(1)
        return nn.functional.cross_entropy(self.out(hidden[mask]), batch.targets)


class NextItemModel(nn.Module):
    def __init__(self, num_items: int, num_actions: int, dim: int) -> None:
        super().__init__()
        tables = [
            EmbeddingConfig(name="item_table", embedding_dim=dim, num_embeddings=num_items, feature_names=["item"]),
            EmbeddingConfig(
                name="action_table", embedding_dim=dim, num_embeddings=num_actions, feature_names=["action"]
            ),
        ]
        self.ec = EmbeddingCollection(tables=tables, device=torch.device("meta"))
        self.encoder = Encoder(dim, num_items)

    def forward(self, batch: KJTBatch) -> tuple[torch.Tensor, torch.Tensor]:
        jagged = self.ec(batch.features)  # the KJT's timestamp key feeds no table; the encoder reads it
        loss = self.encoder(batch, jagged["item"].values(), jagged["action"].values())
        return loss, loss.detach()  # (what backward runs on, what the pipeline returns)


def sharded(model: NextItemModel, world_size: int, lr: float) -> DistributedModelParallel:
    """Row-wise sharded tables with fbgemm's fused row-wise Adagrad, DDP for the encoder."""
    sharder = EmbeddingCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": lr}
    )
    constraints = {name: ParameterConstraints(sharding_types=["row_wise"]) for name in ("item_table", "action_table")}
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world_size, compute_device="cpu"), constraints=constraints
    )
    plan = planner.collective_plan(model, [sharder], dist.GroupMember.WORLD)
    return DistributedModelParallel(model, device=torch.device("cpu"), sharders=[sharder], plan=plan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="prepared dataset (directory or s3:// prefix)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--out", help="rank 0 writes the per-step losses here (JSON)")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    loader = Loader(Config(path=args.data, world_size=world_size, rank=rank, num_steps=args.steps, num_workers=1))
    sizes = loader.dataset.table_sizes()
    dmp = sharded(NextItemModel(sizes["item"], sizes["action"], args.dim), world_size, lr=0.05)
    dense = torch.optim.Adam([p for _, p in in_backward_optimizer_filter(dmp.named_parameters())], lr=3e-3)
    pipeline = TrainPipelineSparseDist(dmp, dense, torch.device("cpu"))
    batches, losses = iter(loader), []
    while True:
        try:
            losses.append(float(pipeline.progress(batches)))
        except StopIteration:
            break
        if rank == 0 and len(losses) % 10 == 0:
            print(f"step {len(losses)}: loss {sum(losses[-10:]) / 10:.4f}", flush=True)
    loader.close()
    if rank == 0 and args.out:
        with open(args.out, "w") as handle:
            json.dump({"losses": losses, "world_size": world_size, "pid": os.getpid()}, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
