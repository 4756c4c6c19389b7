"""The public loader (``freescale.pipeline.dataset.loader``): placement, epoch order, outputs, exact resume.

Every loader here runs with 2 worker processes prefetching unless a test says otherwise, so a resume
test checks what matters: batches prefetched but not consumed before ``state_dict()`` come again.
"""

from __future__ import annotations

import pickle
from dataclasses import replace

import numpy as np
import pytest
import torch
from s3_upload import upload_tree
from train_cli import prepare_tiny

from freescale.pipeline.dataset.kjt import KJTBatch, kjt_batch
from freescale.pipeline.dataset.loader import Config, Loader
from freescale.pipeline.dataset.reader import PreparedDataset
from freescale.pipeline.dataset.samples import default_collate
from freescale.trainer.data.batches import collate


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return prepare_tiny(tmp_path_factory.mktemp("loader-data"))


def placement(items: list) -> list[tuple[int, int, list[int]]]:
    """(step, micro-batch, user ids) of ``samples`` outputs: what identifies a batch."""
    return [(x.step, x.micro_batch, [int(s["user_id"]) for s in x.samples]) for x in items]


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_resume_mid_epoch_with_workers_equals_an_uninterrupted_run(tiny, world_size) -> None:
    rank = world_size - 1
    config = Config(path=tiny, world_size=world_size, rank=rank, output="samples", epochs=2.0, num_workers=2)
    full = placement(list(Loader(config)))
    per_epoch = PreparedDataset(tiny).steps_per_epoch(world_size)
    assert len(full) == 2 * per_epoch
    for stop in (3, per_epoch + 2):  # in the first epoch and in the second
        loader = Loader(config)
        batches = iter(loader)
        head = [next(batches) for _ in range(stop)]
        state = loader.state_dict()
        rest = list(batches)  # the interrupted loader keeps going: its state was a snapshot
        loader.close()
        resumed = Loader(config)
        resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
        assert placement(head) + placement(list(resumed)) == full
        assert placement(head + rest) == full


def test_a_state_resumes_exactly_with_another_number_of_workers(tiny) -> None:
    """Issue 30.6: a state taken with one ``num_workers`` loaded into a loader with another was a
    torchdata traceback. A batch depends on its step alone, so the state (the next step) maps
    exactly: a run restarted on a machine with fewer cores resumes where it was."""
    per_epoch = PreparedDataset(tiny).steps_per_epoch(2)
    config = Config(path=tiny, world_size=2, rank=1, output="samples", epochs=2.0, num_workers=2)
    full = placement(list(Loader(replace(config, num_workers=0))))
    for taken, resumed_with in ((2, 0), (2, 1), (0, 2)):
        loader = Loader(replace(config, num_workers=taken))
        batches = iter(loader)
        stop = per_epoch + 1  # into the second epoch
        head = [next(batches) for _ in range(stop)]
        state = pickle.loads(pickle.dumps(loader.state_dict()))
        loader.close()
        resumed = Loader(replace(config, num_workers=resumed_with))
        resumed.load_state_dict(state)
        assert placement(head) + placement(list(resumed)) == full, (taken, resumed_with)
        assert state["next_step"] == stop and state["num_workers"] == taken
    # a state saved before states recorded the next step (torchdata's own, 2 workers) maps as well
    loader = Loader(config)
    batches = iter(loader)
    head = [next(batches) for _ in range(5)]
    c = loader.config
    old = {"world_size": c.world_size, "rank": c.rank, "seed": c.seed, "start_step": c.start_step,
           "loader": loader._loader.state_dict()}  # fmt: skip
    loader.close()
    resumed = Loader(replace(config, num_workers=0))
    resumed.load_state_dict(old)
    assert placement(head) + placement(list(resumed)) == full


def test_kjt_resume_gives_identical_tensors(tiny) -> None:
    config = Config(path=tiny, world_size=2, rank=1, output="kjt", epochs=2.0, num_workers=2, prefetch_factor=3)
    full = list(Loader(config))
    loader = Loader(config)
    batches = iter(loader)
    for _ in range(5):
        next(batches)
    resumed = Loader(config)
    resumed.load_state_dict(loader.state_dict())
    loader.close()
    for a, b in zip(full[5:], list(resumed), strict=True):
        assert a.step == b.step
        assert torch.equal(a.features.values(), b.features.values())
        assert torch.equal(a.features.lengths(), b.features.lengths())
        assert torch.equal(a.targets, b.targets)


def test_user_features_add_one_exact_row_per_sample_and_feature(tiny) -> None:
    """``user_features=True``: every profile feature of the dataset as a KJT key ``user.<feature>`` (and
    in the ``batch`` output), one row of its vocabulary per sample, after the event keys."""
    dataset = PreparedDataset(tiny)
    config = Config(path=tiny, output="kjt", num_steps=2, num_workers=0, user_features=True)
    batch = next(iter(Loader(config)))
    assert batch.features.keys() == ["item", "action", "timestamp", "user.age_bucket", "user.country_id"]
    samples = dataset.micro_batch(dataset.micro_batch_index(0, 0, 1, 0))
    kept = [s for s in samples if len(s["item_ids"]) - 2 >= 2]  # the holdout keeps samples of 2+ events
    ages = dataset.vocabulary("user.age_bucket").rows(np.array([int(s["user_features"][0]) for s in kept]))
    assert batch.features["user.age_bucket"].values().tolist() == ages.tolist()
    assert batch.features["user.country_id"].lengths().tolist() == [1] * len(kept)
    trainer = next(iter(Loader(replace(config, output="batch"))))
    assert trainer.profile_tables == ("user.age_bucket", "user.country_id")
    assert trainer.profile_ids[0].tolist() == ages.tolist()
    plain = next(iter(Loader(replace(config, user_features=False))))
    assert plain.features.keys() == ["item", "action", "timestamp"]


def test_later_epochs_permute_whole_step_groups_by_seed(tiny) -> None:
    dataset = PreparedDataset(tiny)
    groups, size = dataset.n_step_groups, dataset.group_size
    world = 2
    per_epoch = dataset.steps_per_epoch(world)

    def epoch_groups(epoch: int, seed: int) -> list[int]:
        order = []
        for step in range(epoch * per_epoch, (epoch + 1) * per_epoch):
            indices = {dataset.micro_batch_index(step, rank, world, seed) // size for rank in range(world)}
            assert len(indices) == 1  # every step reads W micro-batches of one balanced group
            order.append(indices.pop())
        return order[:: size // world]

    first = epoch_groups(0, 0)
    assert first == list(range(groups))
    second = epoch_groups(1, 0)
    assert sorted(second) == first and second != first
    assert epoch_groups(1, 0) == second  # deterministic
    assert epoch_groups(1, 5) != second  # another seed, another order
    steps = [dataset.micro_batch_index(s, r, world, 0) for s in range(per_epoch, 2 * per_epoch) for r in range(world)]
    assert sorted(steps) == list(range(dataset.n_micro_batches))  # each micro-batch once per epoch


def test_outputs_agree_with_the_trainers_collation(tiny) -> None:
    dataset = PreparedDataset(tiny)
    cfg = default_collate(dataset)
    config = Config(path=tiny, world_size=2, rank=0, num_steps=3, num_workers=0)
    for raw, batch, kjt in zip(
        Loader(Config(**{**config.__dict__, "output": "samples"})),
        Loader(Config(**{**config.__dict__, "output": "batch"})),
        Loader(config),
        strict=True,
    ):
        assert raw.step == batch.step == kjt.step
        assert isinstance(kjt, KJTBatch) and kjt.features.keys() == ["item", "action", "timestamp"]
        expected = collate(raw.samples, cfg, raw.step, 0)
        features = kjt.features.to_dict()
        assert torch.equal(features["item"].values(), expected.item_ids[expected.input_index])
        assert torch.equal(features["action"].values(), expected.action_ids[expected.input_index])
        assert torch.equal(features["timestamp"].values(), expected.timestamps[expected.input_index])
        assert torch.equal(kjt.targets, expected.item_ids[expected.target_index])
        assert torch.equal(kjt.lengths, expected.lengths - 1)
        assert torch.equal(batch.item_ids, expected.item_ids)
        vocab = dataset.vocabulary("item")
        raw_targets = vocab.raw(kjt.targets.numpy())
        assert set(raw_targets.tolist()) <= {int(i) for s in raw.samples for i in s["item_ids"]}


def test_kjt_of_an_empty_micro_batch() -> None:
    from freescale.pipeline.dataset.samples import CollateConfig

    cfg = CollateConfig(num_items=10, num_actions=2, max_len=8, num_negatives=0, inbatch_negatives=0)
    batch = kjt_batch([], cfg, step=4)
    assert batch.step == 4 and batch.features.values().numel() == 0 and batch.targets.numel() == 0


def test_bad_options_and_states_are_named(tiny) -> None:
    with pytest.raises(ValueError, match="loader option 'output'"):
        Config(path=tiny, output="tensors")
    with pytest.raises(ValueError, match="loader option 'rank'"):
        Config(path=tiny, world_size=2, rank=2)
    with pytest.raises(ValueError, match="loader option 'prefetch_factor'"):
        Config(path=tiny, prefetch_factor=0)
    with pytest.raises(ValueError, match="does not divide the dataset's group size 4"):
        Loader(Config(path=tiny, world_size=3, rank=0))
    state = Loader(Config(path=tiny, world_size=2, rank=0, output="samples", num_workers=0)).state_dict()
    with pytest.raises(ValueError, match="loader state was taken with world_size 2, this loader has 4"):
        Loader(Config(path=tiny, world_size=4, rank=0, output="samples")).load_state_dict(state)
    with pytest.raises(ValueError, match=r"loader state's next step 9999 is outside this loader's steps \[0, "):
        Loader(Config(path=tiny, world_size=2, rank=0, output="samples")).load_state_dict({**state, "next_step": 9999})


def test_pickled_dataset_is_small_and_opens_its_own_shards(tiny) -> None:
    dataset = PreparedDataset(tiny)
    dataset.micro_batch(0)  # opens a shard reader in this process
    blob = pickle.dumps(dataset)
    assert len(blob) < 64_000
    copy = pickle.loads(blob)
    assert not copy._readers and not copy._files.held
    assert [int(s["user_id"]) for s in copy.micro_batch(5)] == [int(s["user_id"]) for s in dataset.micro_batch(5)]


def test_s3_dataset_through_workers_reads_like_local(tiny, s3_bucket, tmp_path) -> None:
    remote = Config(
        path=upload_tree(tiny, s3_bucket, "prepared"),
        cache_dir=str(tmp_path / "cache"),
        world_size=2,
        rank=1,
        output="samples",
    )
    local = Config(path=tiny, world_size=2, rank=1, output="samples", num_workers=0)
    assert placement(list(Loader(remote))) == placement(list(Loader(local)))
    assert np.all([(tmp_path / "cache" / s["raw_data"]["basename"]).is_file() for s in PreparedDataset(tiny).shards])


ORPHAN_SCRIPT = """
import sys, time, psutil
from freescale.pipeline.dataset.loader import Config, Loader
loader = Loader(Config(path=sys.argv[1], output="batch", epochs=200.0, num_workers=2, prefetch_factor=64))
batches = iter(loader)
next(batches)
time.sleep(3)  # the workers fill the result pipe with batches nobody reads
print(" ".join(str(child.pid) for child in psutil.Process().children()), flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_workers_exit_when_the_process_reading_them_is_killed(tiny) -> None:
    """A rank killed mid-run (a failed job, torchrun tearing down) must not leave its loader workers
    behind: they hold the job's stdout and stderr, so whoever waits for those (a launcher, a CI log
    reader) waits forever. Before the workers watched their parent, a worker whose result pipe was
    full stayed blocked writing to it after the reader died, never reaching torch's parent check."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    parent = subprocess.Popen([sys.executable, "-c", ORPHAN_SCRIPT, tiny], stdout=subprocess.PIPE, text=True)
    workers = [psutil.Process(int(pid)) for pid in parent.stdout.readline().split()]
    assert workers, "the loader started no worker processes"
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers):
        time.sleep(0.2)
    alive = [w.pid for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"loader workers {alive} outlived their killed parent by 15 s"


def test_the_old_loader_import_path_warns_and_is_the_same_loader() -> None:
    """``freescale.pipeline.loader`` (documented before ``pipeline/dataset/``) still imports, with a warning."""
    import importlib
    import sys

    sys.modules.pop("freescale.pipeline.loader", None)
    with pytest.warns(DeprecationWarning, match="freescale.pipeline.dataset"):
        old = importlib.import_module("freescale.pipeline.loader")
    assert (old.Config, old.Loader, old.KJTBatch) == (Config, Loader, KJTBatch)


@pytest.mark.parametrize("workers", [0, 1])
def test_data_that_does_not_match_its_vocabulary_is_one_dataset_error(tiny, workers: int) -> None:
    """An id outside the vocabulary (a damaged shard read with ``verify=False``, another dataset's files)
    is a ``ManifestError`` like any damaged dataset, raised as itself from a worker: one line, not
    torch's re-raise with the worker's traceback folded into its message."""
    from freescale.pipeline.dataset.manifest import ManifestError
    from freescale.pipeline.dataset.vocabulary import Vocabulary

    dataset = PreparedDataset(tiny)
    collate_cfg = default_collate(dataset)
    short = Vocabulary("item", collate_cfg.item_vocab.raw_ids[:1])  # every other id unknown
    config = Config(
        path=tiny, output="batch", num_steps=2, num_workers=workers, collate=replace(collate_cfg, item_vocab=short),
        collate_fn=collate,
    )  # fmt: skip
    with pytest.raises(ManifestError) as raised:
        list(Loader(config, dataset))
    message = str(raised.value)
    assert "is not in the dataset's item vocabulary" in message and "\n" not in message, message
