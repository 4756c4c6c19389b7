"""What a checkpoint says about itself: its run, its data, its model's shapes and the best-model record.

Every checkpoint directory holds ``freescale-checkpoint.json`` beside DCP's files, written by rank 0
before the directory gets its final name (``checkpoint.py``). It is plain JSON so that the launcher
reads it before any rank starts, without torch and without unpickling anything, and refuses in one line
what the ranks would otherwise trip over with a traceback (or, worse, run with silently):

- ``run.run_id``: the run that wrote it. A fresh run draws a new id; a resumed run keeps its
  checkpoint's. A checkpoint folder belongs to one run (``run_dir.claim_checkpoint_dir``);
- ``world_size``: the loader's position is a step of that many ranks (step s reads micro-batches
  ``s·W ..``), so resume needs the same ``--nproc × --nnodes``; the tables themselves reshard (DCP), which
  is why ``freescale evaluate`` takes any ``--nproc``;
- ``run.data``: the dataset's fingerprint and the xxh64 of its item and action vocabularies (from the
  manifest's ``files`` table). Rows stand for the vocabulary's ids, so a model is meaningless on other
  ids even when the table sizes agree; ``checkpoint.allow_other_data`` loads it anyway, deliberately;
- ``run.model``: the options that give the saved tensors their shapes or their meaning (the heads
  ``d_model`` is split into, whether item rows are the vocabulary's or raw ids modulo the rows; named
  in the refusal), and
  ``shapes``: every saved tensor's global shape, which each rank compares with its own state before
  loading (whatever option changed, the error is one line naming the tensor);
- ``run.evals``: the run's evaluation lines up to this step. A resumed run replays them into its
  best-model tracker: the record travels with the checkpoints, not with ``logging.out_dir``, so a
  resume into another ``out_dir`` keeps the earlier best checkpoint;
- ``files``: every DCP file's size and xxh64 as saved. A file truncated, deleted or bit-flipped since
  (a disk, a copy, a hand) is refused naming it before any rank starts: DCP would otherwise stop every
  rank with a traceback or, for a flipped bit in a tensor, load the damaged value silently. Records
  written before ``files`` existed are loaded unchecked.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from freescale.trainer.config import RunConfig
from freescale.trainer.user_tables import user_table_options

if TYPE_CHECKING:
    from freescale.pipeline.dataset.manifest import Manifest

RECORD_NAME = "freescale-checkpoint.json"
RECORD_VERSION = 1
MODEL_TABLES = ("item", "action")  # the tables the model has rows for


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


@dataclass(frozen=True)
class DataIdentity:
    """Which prepared dataset a run trained on: where, its fingerprint, its model tables' vocabularies."""

    path: str
    fingerprint: str  # the manifest's (prepare's options, cost model, source files)
    vocabularies: dict[str, str]  # table -> xxh64 of vocab/<table>.npy ("" before vocabularies existed)

    @classmethod
    def of(cls, path: str, manifest: Manifest) -> DataIdentity:
        files = {entry.path: entry for entry in manifest.files or ()}
        vocabularies = {}
        for table in (*MODEL_TABLES, *sorted(set(manifest.tables) - set(MODEL_TABLES))):  # then user.<feature>
            entry = manifest.tables.get(table)
            listed = files.get(entry.file) if entry else None
            vocabularies[table] = listed.xxh64 if listed else ""
        return cls(path, manifest.fingerprint or "", vocabularies)

    def other_ids(self, other: DataIdentity, tables: tuple[str, ...] = MODEL_TABLES) -> list[str]:
        """The ``tables`` whose vocabulary differs from ``other``'s (their rows mean other ids)."""
        return [table for table in tables if self.vocabularies.get(table) != other.vocabularies.get(table)]

    def same_data(self, other: DataIdentity) -> bool:
        """The same prepared data (fingerprint and the vocabularies both record), wherever it lives now."""
        both = tuple(table for table in self.vocabularies if table in other.vocabularies)
        return self.fingerprint == other.fingerprint and not self.other_ids(other, both)

    def describe(self) -> str:
        return f"{self.path} (fingerprint {self.fingerprint[:12] or 'none'})"


@dataclass(frozen=True)
class RunRecord:
    """What the training run knows about a checkpoint it saves (``CheckpointRecord.run``)."""

    run_id: str
    data: DataIdentity
    model: dict[str, Any]  # model_options()
    evals: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl eval lines up to the step
    # the run's step when it started reading ``data`` (0, or the step it continued onto it from, with
    # checkpoint.continue_on_new_data): the loader reads ``data``'s step ``step - data_start``
    data_start: int = 0

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunRecord:
        data = DataIdentity(**values["data"])
        start = int(values.get("data_start", 0))  # records before continue_on_new_data: 0
        return cls(values["run_id"], data, dict(values["model"]), list(values["evals"]), start)


@dataclass(frozen=True)
class CheckpointRecord:
    """``freescale-checkpoint.json``: the checkpointer's facts plus the run's (None: saved through the
    engine API by code other than the trainer, which the launcher will not resume)."""

    step: int
    world_size: int
    shapes: dict[str, list[int]]  # global shape of every saved tensor, by flattened state key
    run: RunRecord | None
    version: int = RECORD_VERSION
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # DCP file name -> {"size", "xxh64"}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> CheckpointRecord:
        run = values.get("run")
        return cls(
            int(values["step"]),
            int(values["world_size"]),
            {key: list(shape) for key, shape in values["shapes"].items()},
            RunRecord.from_dict(run) if run else None,
            int(values["version"]),
            {
                name: {"size": int(entry["size"]), "xxh64": str(entry["xxh64"])}
                for name, entry in values.get("files", {}).items()
            },
        )


def model_options(cfg: RunConfig, rows: tuple[int, int]) -> dict[str, Any]:
    """The options that shape the saved tensors, by option name (``rows``: the item and action rows
    they resolve to on the run's data, ``protocol.table_rows``)."""
    model, extra = cfg.model, cfg.model_extra
    options: dict[str, Any] = {
        "model_extra.architecture": extra.architecture,
        "model.d_model": model.d_model,
        "model.num_heads": model.num_heads,  # the same shapes, other attention: MEANING_OPTIONS
        "model.num_layers": model.num_layers,
        "model_extra.ids": extra.ids,
        "model.max_uih_len": model.max_uih_len,  # learned positions and HSTU's position bias
        "model_extra.num_items": rows[0],
        "model_extra.num_actions": rows[1],
    }
    if extra.ids == "zch":  # decides where an id lives: a saved identity table needs the same
        options["model_extra.zch_bucket_size"] = extra.zch_bucket_size
    if extra.architecture == "hstu":
        options["model_extra.time_buckets"] = extra.time_buckets
    else:
        options["model_extra.ffn_multiplier"] = extra.ffn_multiplier
    return options | user_table_options(cfg)


def check_user_table_set(run: RunRecord, cfg: RunConfig, where: str) -> None:
    """The checkpoint's user-profile tables are this run's (by feature): a table only one of them has
    would be dropped from the checkpoint or start untrained, silently."""
    saved = {key.split(".")[1] for key in run.model if key.startswith("user_tables.")}
    for feature in sorted(saved ^ set(cfg.user_tables)):
        has, lacks = (where, "this run") if feature in saved else ("this run", where)
        raise ValueError(
            f"table 'user.{feature}': {has} has it ([user_tables.{feature}]), {lacks} does not; the tables must "
            f"be the checkpoint's: {'add' if feature in saved else 'remove'} [user_tables.{feature}] to load it"
        )


def write_record(directory: str | Path, record: CheckpointRecord) -> None:
    """Write ``record`` into a checkpoint directory, whole (temporary file, fsync, rename)."""
    path = Path(directory) / RECORD_NAME
    partial = path.with_name(f".{RECORD_NAME}.partial")
    with open(partial, "w") as handle:
        handle.write(record.to_json())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


def file_inventory(directory: str | Path) -> dict[str, dict[str, Any]]:
    """Size and xxh64 of every file in a checkpoint directory but the record (``CheckpointRecord.files``)."""
    return {
        entry.name: {"size": entry.stat().st_size, "xxh64": _xxh64(entry)}
        for entry in sorted(Path(directory).iterdir())
        if entry.is_file() and RECORD_NAME not in entry.name
    }


def check_files(directory: str | Path, record: CheckpointRecord, where: str) -> None:
    """Refuse a checkpoint whose files differ from what its save recorded (``files``), naming the first."""
    for name, saved in sorted(record.files.items()):
        path = Path(directory) / name
        if not path.is_file():
            damage = "is missing"
        elif (size := path.stat().st_size) != saved["size"]:
            damage = f"has {size} bytes, the save wrote {saved['size']}"
        elif _xxh64(path) != saved["xxh64"]:
            damage = f"has other bytes than the save wrote (xxh64 differs, same size {size})"
        else:
            continue
        raise ValueError(f"{where}: {path} {damage}: the checkpoint is damaged; {_earlier(Path(directory))}")


def _earlier(directory: Path) -> str:
    """Where to go on from instead of a damaged step directory."""
    from freescale.trainer.checkpoint_dirs import STEP_DIR, finished_steps, step_dir

    match = STEP_DIR.match(directory.name)
    earlier = [s for s in finished_steps(str(directory.parent)) if match and s < int(match.group(1))]
    if earlier:
        return f'load an earlier one (checkpoint.resume = "{step_dir(str(directory.parent), earlier[-1])}")'
    return "no earlier checkpoint is kept: train again"


def _xxh64(path: Path) -> str:
    from freescale.pipeline.integrity import xxh64_stream

    with open(path, "rb") as handle:
        return xxh64_stream(handle)


def read_record(directory: str | Path) -> CheckpointRecord | None:
    """The record of a checkpoint directory, or None when it has none (older FreeScale)."""
    path = Path(directory) / RECORD_NAME
    if not path.exists():
        return None
    try:
        return CheckpointRecord.from_dict(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{path} is not a valid checkpoint record ({type(error).__name__}: {error})") from None


def run_record_of(directory: str | Path, what: str) -> tuple[CheckpointRecord, RunRecord]:
    """A checkpoint's record and its run's part; ``what`` names the option that pointed at it."""
    record = read_record(directory)
    if record is None or record.run is None:
        raise ValueError(
            f"{what}: {directory} has no run record ({RECORD_NAME}: written by an older FreeScale or outside "
            "freescale train), so its run, data and model cannot be checked; train it again with this version"
        )
    return record, record.run


# options that leave the tensors' shapes alone but change what they mean: loaded under another value they
# would train or score another model without a word. Records written before they were kept lack them.
MEANING_OPTIONS = {
    "model.num_heads": "its attention splits model.d_model into other heads",
    "model_extra.ids": "its item rows stand for other ids",
}


def check_model(run: RunRecord, expected: dict[str, Any], where: str) -> None:
    """Refuse a checkpoint whose shape- or meaning-giving options differ from this run's (the tensors would
    not load, or would load as another model)."""
    for option, value in expected.items():
        saved = run.model.get(option)
        if saved is None and option in MEANING_OPTIONS:
            continue  # an older record
        if saved != value:
            rows = option.endswith(("num_items", "num_actions"))
            has = f"resolves it to {value!r} (0 means the dataset's vocabulary size)" if rows else f"has {value!r}"
            why = MEANING_OPTIONS.get(option, "its tensors have other shapes")
            raise ValueError(
                f"{where} was trained with {option} = {saved!r}, this run {has}: {why}; "
                f"set {option} = {saved!r} to load it, or train a fresh run"
            )


def vocabulary_tables(cfg: RunConfig) -> tuple[str, ...]:
    """The model tables whose rows stand for the dataset's vocabulary (``protocol.resolve_tables``): items
    with ``ids = "exact"``; actions unless ``ids = "hashed"`` with ``num_actions`` (modulo); user-profile
    tables with ``ids = "exact"``. Hashed and zch rows are keyed by the raw id itself, so they mean the
    same ids on any dataset."""
    extra = cfg.model_extra
    tables = ("item",) if extra.ids == "exact" else ()
    if not (extra.ids == "hashed" and extra.num_actions):
        tables += ("action",)
    return tables + tuple(t.table for t in cfg.user_tables.values() if t.ids == "exact")


def check_data(
    run: RunRecord, data: DataIdentity, where: str, allowed: bool, whole: bool, tables: tuple[str, ...] = MODEL_TABLES
) -> None:
    """Refuse a checkpoint trained on other data: other vocabularies of ``tables`` (``whole=False``,
    evaluation: the rows would stand for other ids) or, for a resume, any other dataset (``whole=True``:
    the loader's position belongs to the checkpoint's data). ``allowed``: ``checkpoint.allow_other_data``."""
    other = run.data.other_ids(data, tables)
    if allowed or not (other or (whole and not run.data.same_data(data))):
        return
    differs = f"other {' and '.join(other)} ids" if other else "other samples, rows of the same ids"
    hint = " or checkpoint.continue_on_new_data = true to continue the run onto it (the next window)" if whole else ""
    raise ValueError(
        f"{where} was trained on {run.data.describe()}, this run reads {data.describe()} ({differs}); "
        f"set checkpoint.allow_other_data = true to load it on other data deliberately (fine-tuning){hint}"
    )


def check_world_size(record: CheckpointRecord, world_size: int, where: str) -> None:
    if record.world_size != world_size:
        raise ValueError(
            f"{where} was written by {record.world_size} ranks, this run has {world_size} (--nproc x --nnodes): "
            "its loader position counts steps of its world size; resume with the same ranks (freescale "
            "evaluate takes any --nproc: the tables reshard)"
        )
