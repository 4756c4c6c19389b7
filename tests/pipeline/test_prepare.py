"""End to end: generate → prepare → read back (StreamingDataset and our reader), accounting,
determinism, overwrite protection, resume after a kill, bad input, MovieLens, memory limit."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from prepare_configs import make_config
from s3_upload import upload_tree

from freescale.datasets.presets import preset
from freescale.datasets.synthetic import generate
from freescale.pipeline.balance import BalanceConfig
from freescale.pipeline.config import SampleConfig
from freescale.pipeline.dataset.reader import PreparedDataset, RankReader
from freescale.pipeline.prepare import PrepareError, prepare

FREESCALE = str(Path(sys.executable).parent / "freescale")


def shard_digests(directory: str) -> dict[str, str]:
    root = Path(directory)
    names = sorted(p.name for p in root.iterdir() if p.name == "index.json" or p.name.startswith("shard."))
    names.append("micro_batch_offsets.npy")
    return {name: hashlib.sha256((root / name).read_bytes()).hexdigest() for name in names}


@pytest.fixture(scope="module")
def prepared(tiny_sources, tmp_path_factory) -> tuple[str, dict]:
    out = str(tmp_path_factory.mktemp("prepared") / "ds")
    manifest = prepare(make_config(tiny_sources, out, workers=2))
    return out, manifest


def test_manifest_accounting_and_layout(prepared) -> None:
    out, manifest = prepared
    rows = manifest["rows"]
    assert manifest["schema_version"] == 1
    rejected, filtered = rows["events_rejected"]["total"], rows["events_filtered"]["total"]
    assert rows["events_read"] == rows["events_used"] + rejected + filtered
    assert rows["micro_batches"] == rows["step_groups"] * 4
    assert set(manifest["balance"]["straggler_pct"]) >= {"random", "within_step", "plan"}
    assert manifest["cost_model"]["units"] == "flops"
    assert (Path(out) / "quarantine.jsonl").exists()
    assert not (Path(out).parent / f".{Path(out).name}.freescale-work").exists()


def test_streaming_dataset_and_reader_see_every_sample_once(prepared) -> None:
    from streaming import StreamingDataset

    out, manifest = prepared
    rows = StreamingDataset(local=out, shuffle=False, batch_size=1)
    assert len(rows) == manifest["rows"]["samples"]
    dataset = PreparedDataset(out)
    keys_by_world: dict[int, list] = {}
    for world in (1, 2, 4):
        keys = []
        for rank in range(world):
            for step, batch in RankReader(dataset, world_size=world, rank=rank):
                assert all(s["micro_batch"] == dataset.micro_batch_index(step, rank, world) for s in batch)
                keys.extend((int(s["user_id"]), int(s["window"])) for s in batch)
        keys_by_world[world] = sorted(keys)
        assert len(keys) == len(set(keys)) == manifest["rows"]["samples"]
    assert keys_by_world[1] == keys_by_world[2] == keys_by_world[4]
    sample = rows[0]
    assert len(sample["item_ids"]) == len(sample["timestamps"]) == sample["length"]
    assert np.all(np.diff(sample["timestamps"]) >= 0)


def test_reader_resumes_from_step_counter(prepared) -> None:
    dataset = PreparedDataset(prepared[0])
    full = [(s, [int(x["user_id"]) for x in b]) for s, b in RankReader(dataset, world_size=2, rank=1)]
    reader = RankReader(dataset, world_size=2, rank=1)
    first = [next(iter(reader)) for _ in range(2)]
    resumed = RankReader(dataset, world_size=2, rank=1)
    resumed.load_state_dict(reader.state_dict())
    rest = [(s, [int(x["user_id"]) for x in b]) for s, b in resumed]
    assert [(s, [int(x["user_id"]) for x in b]) for s, b in first] + rest == full
    with pytest.raises(ValueError, match="does not divide"):
        RankReader(dataset, world_size=3, rank=0)


def test_byte_identical_across_runs_workers_and_memory_limits(tiny_sources, prepared, tmp_path) -> None:
    reference = shard_digests(prepared[0])
    prepare(make_config(tiny_sources, str(tmp_path / "a"), workers=1, memory_limit=256 * 2**20))
    assert shard_digests(str(tmp_path / "a")) == reference
    prepare(make_config(tiny_sources, str(tmp_path / "b"), workers=2, memory_limit=4 * 2**30))
    assert shard_digests(str(tmp_path / "b")) == reference


def test_many_parts_and_buckets_hold_the_same_samples(tiny_sources, prepared, tmp_path, monkeypatch) -> None:
    """Parts of 7 samples over buckets of 3 (buckets straddle parts; each part frees the buckets no
    later part reads): the same samples in the same plan order as one part, one bucket."""
    from streaming import StreamingDataset

    from freescale.pipeline import prepare as prepare_module
    from freescale.pipeline import prepare_phases
    from freescale.pipeline.steps import writer

    monkeypatch.setattr(writer, "PART_SIZE", 7)
    monkeypatch.setattr(prepare_phases, "PART_SIZE", 7)
    job = prepare_module.PrepareJob(make_config(tiny_sources, str(tmp_path / "many"), workers=1))
    monkeypatch.setattr(job, "_bucket_size", lambda plan: 3)
    manifest = job.run()
    assert manifest["rows"]["samples"] > 14  # three parts at least
    assert len(list((tmp_path / "many").glob("part-*"))) == -(-manifest["rows"]["samples"] // 7)

    def rows(path: str) -> list[tuple]:
        dataset = StreamingDataset(local=path, shuffle=False, batch_size=1)
        return [(int(s["user_id"]), int(s["window"]), s["item_ids"].tobytes()) for s in dataset]

    assert rows(str(tmp_path / "many")) == rows(prepared[0])


def test_overwrite_protection(tiny_sources, tmp_path) -> None:
    out = str(tmp_path / "ds")
    first = prepare(make_config(tiny_sources, out))
    assert prepare(make_config(tiny_sources, out)) == first  # same config: up to date
    different = make_config(tiny_sources, out, balance=BalanceConfig(group_size=2, micro_batch_size=4))
    with pytest.raises(PrepareError, match="--overwrite"):
        prepare(different)
    different.overwrite = True
    assert prepare(different)["layout"]["group_size"] == 2
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(PrepareError, match="no FreeScale manifest"):
        prepare(make_config(tiny_sources, str(foreign)))


def _run_cli_prepare(sources: str, out: str) -> subprocess.Popen:
    cmd = [
        FREESCALE,
        "prepare",
        "--sources",
        sources,
        "--output",
        out,
        "--group-size",
        "4",
        "--micro-batch-size",
        "4",
        "--max-uih-len",
        "2048",
        "--workers",
        "1",
        "--quiet",
        "--seed",
        "1",
    ]
    return subprocess.Popen(cmd, cwd=tempfile.gettempdir(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_resume_after_kill_gives_identical_output(tiny_sources, tmp_path) -> None:
    killed = str(tmp_path / "killed")
    proc = _run_cli_prepare(tiny_sources, killed)
    deadline = time.time() + 120
    markers = tmp_path / ".killed.freescale-work"
    while time.time() < deadline and proc.poll() is None:
        if list(markers.glob("*/samples/p*.json")):
            break
        time.sleep(0.02)
    assert proc.poll() is None, "prepare finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not Path(killed, "manifest.json").exists()
    finished = _run_cli_prepare(tiny_sources, killed)
    assert finished.wait(timeout=300) == 0, finished.stderr.read().decode()[-2000:]
    clean = str(tmp_path / "clean")
    assert _run_cli_prepare(tiny_sources, clean).wait(timeout=300) == 0
    assert shard_digests(killed) == shard_digests(clean)
    assert (
        json.loads(Path(killed, "manifest.json").read_text())["rows"]
        == json.loads(Path(clean, "manifest.json").read_text())["rows"]
    )


def test_malformed_rows_are_counted_and_quarantined(tmp_path) -> None:
    generate(preset("tiny", seed=5, malformed_fraction=0.02), str(tmp_path / "src"))
    injected = json.loads((tmp_path / "src" / "generated.json").read_text())
    out = str(tmp_path / "ds")
    manifest = prepare(make_config(str(tmp_path / "src" / "sources.toml"), out))
    rejected = manifest["rows"]["events_rejected"]
    assert rejected["total"] > 0
    assert rejected["by_reason"] == injected["rejects"]  # exactly what the generator injected
    assert manifest["rows"]["events_read"] == injected["rows"]
    lines = [json.loads(line) for line in Path(out, "quarantine.jsonl").read_text().splitlines()]
    assert {line["reason"] for line in lines} == set(rejected["by_reason"])
    assert all({"source", "file", "row", "field", "raw"} <= set(line) for line in lines)
    strict = make_config(str(tmp_path / "src" / "sources.toml"), str(tmp_path / "strict"), max_reject_fraction=0.001)
    with pytest.raises(PrepareError, match="--max-reject-fraction"):
        prepare(strict)


def test_movielens_file_written_by_the_test(tmp_path) -> None:
    ratings = tmp_path / "ratings.dat"
    lines = [f"{u}::{m}::{(u + m) % 5 + 1}::{1000 + 10 * m}" for u in range(1, 31) for m in range(1, 2 + u % 7)]
    ratings.write_text("\n".join(lines) + "\n")
    (tmp_path / "sources.toml").write_text(
        '[dataset]\nname = "ml"\n\n[[sources]]\nname = "ratings"\nformat = "movielens"\npath = "ratings.dat"\n'
    )
    out = str(tmp_path / "ds")
    manifest = prepare(make_config(str(tmp_path / "sources.toml"), out))
    assert manifest["rows"]["events_read"] == len(lines)
    dataset = PreparedDataset(out)
    samples = [s for m in range(dataset.n_micro_batches) for s in dataset.micro_batch(m)]
    by_user = {int(s["user_id"]): s for s in samples}
    user = by_user[6]  # 6 % 7 = 6 → movies 1..7 in time order, rating = (u + m) % 5 + 1
    assert user["item_ids"].tolist() == list(range(1, 8))
    assert user["actions"].tolist() == [(6 + m) % 5 + 1 for m in range(1, 8)]
    assert manifest["rows"]["events_filtered"]["by_reason"]["min_len"] == sum(1 for u in range(1, 31) if u % 7 == 0)


def test_s3_sources_and_output(tiny_sources, s3_bucket, tmp_path) -> None:
    upload_tree(Path(tiny_sources).parent, s3_bucket, "raw")
    out = f"s3://{s3_bucket}/prepared"
    manifest = prepare(make_config(f"s3://{s3_bucket}/raw/sources.toml", out, work_dir=str(tmp_path / "work")))
    local = prepare(make_config(tiny_sources, str(tmp_path / "local")))
    assert manifest["rows"] == local["rows"]
    dataset = PreparedDataset(out, cache_dir=str(tmp_path / "cache"))
    remote_keys = [int(s["user_id"]) for m in range(dataset.n_micro_batches) for s in dataset.micro_batch(m)]
    local_ds = PreparedDataset(str(tmp_path / "local"))
    local_keys = [int(s["user_id"]) for m in range(local_ds.n_micro_batches) for s in local_ds.micro_batch(m)]
    assert remote_keys == local_keys


def test_kcore_and_sliding_windows(tiny_sources, tmp_path) -> None:
    k = 4
    samples = SampleConfig(max_uih_len=10_000, kcore=k)
    manifest = prepare(make_config(tiny_sources, str(tmp_path / "kcore"), samples=samples))
    dataset = PreparedDataset(str(tmp_path / "kcore"))
    rows = [s for m in range(dataset.n_micro_batches) for s in dataset.micro_batch(m)]
    items = np.concatenate([s["item_ids"] for s in rows])
    assert min(len(s["item_ids"]) for s in rows) >= k
    assert np.unique(items, return_counts=True)[1].min() >= k
    assert manifest["rows"]["events_filtered"]["by_reason"]["kcore"] > 0
    windows = SampleConfig(max_uih_len=16, window_stride=8)
    manifest = prepare(make_config(tiny_sources, str(tmp_path / "windows"), samples=windows))
    assert manifest["rows"]["samples"] > manifest["rows"]["users"]
    assert manifest["lengths"]["max"] <= 16
    rows = manifest["rows"]
    dropped = rows["events_rejected"]["total"] + rows["events_filtered"]["total"]
    assert rows["events_read"] == rows["events_used"] + dropped


def test_cli_errors_are_one_clear_line(tmp_path) -> None:
    (tmp_path / "sources.toml").write_text(
        '[dataset]\nname = "x"\n[[sources]]\nname = "log"\nformat = "csv"\npath = "log.csv"\n'
        '[sources.columns]\nuser = "u"\nitem = "i"\ntimestamp = "t"\n'
    )
    (tmp_path / "log.csv").write_text("u,item,t\n1,2,3\n")

    def prepare_cli(*options: str) -> subprocess.CompletedProcess:
        command = [FREESCALE, "prepare", "--sources", str(tmp_path / "sources.toml"), "--output", str(tmp_path / "out")]
        return subprocess.run([*command, *options], capture_output=True, text=True, cwd=tmp_path)

    result = prepare_cli("--quiet")
    assert result.returncode == 2
    assert "source 'log'" in result.stderr and "log.csv" in result.stderr and "column 'i'" in result.stderr
    assert "Traceback" not in result.stderr
    result = prepare_cli("--group-size", "0")
    assert result.returncode == 2 and "group_size" in result.stderr


@pytest.mark.parametrize("command", ["prepare", "stats"])
def test_engine_is_a_deprecated_alias_of_executor(command: str, capsys) -> None:
    """``--executor`` names where the steps run (``train --engine`` names the trainer); the old
    ``--engine local|ray`` of prepare and stats still works for one release, with a one-line note."""
    from freescale.tools.cli import build_parser

    inputs = ["--sources", "s.toml", "--output", "o"] if command == "prepare" else ["s.toml"]
    assert build_parser().parse_args([command, *inputs]).executor == "local"
    assert build_parser().parse_args([command, *inputs, "--executor", "ray"]).executor == "ray"
    assert capsys.readouterr().err == ""
    assert build_parser().parse_args([command, *inputs, "--engine", "ray"]).executor == "ray"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--engine is deprecated" in err and "use --executor" in err
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, *inputs, "--engine", "torchrec"])


def test_cli_reports_a_refused_prepare_as_a_user_error(tiny_sources, tmp_path, capsys) -> None:
    from freescale.tools.cli import main as cli_main

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("not a dataset")
    command = ["prepare", "--sources", tiny_sources, "--output", str(tmp_path / "out"), "--workers", "1", "--quiet"]
    assert cli_main(command) == 2
    assert "holds no FreeScale manifest" in capsys.readouterr().err


def test_cli_stops_the_workers_when_prepare_is_refused(tiny_sources, tmp_path, monkeypatch) -> None:
    """Refused options or sources stop the pool at once: one left to interpreter exit could race its
    wake-up pipe there and print a traceback after the one-line error."""
    import freescale.pipeline.executors.processes as processes
    from freescale.tools.cli import main as cli_main

    stopped = []

    class Pool:
        def shutdown(self, cancel_futures: bool = False) -> None:
            stopped.append(cancel_futures)

    monkeypatch.setattr(processes, "start_pool", lambda workers, modules: Pool())
    command = ["prepare", "--sources", tiny_sources, "--output", str(tmp_path / "out"), "--quiet"]
    assert cli_main([*command, "--group-size", "0"]) == 2
    assert stopped == [True]


POOL_FIRST_PROBE = """
import sys
import freescale.pipeline.executors.processes as processes
from freescale.tools.cli import main

def start_pool(workers, modules):
    print("pipeline imported before the pool:", "freescale.pipeline.prepare" in sys.modules)
    raise SystemExit(0)

processes.start_pool = start_pool
main(["prepare", "--sources", "s.toml", "--output", "out"])
"""


def test_cli_starts_prepare_workers_before_importing_the_pipeline(tmp_path) -> None:
    """The workers' imports (~0.7 s each) overlap the driver's only if the pool starts first."""
    result = subprocess.run([sys.executable, "-c", POOL_FIRST_PROBE], capture_output=True, text=True, cwd=tmp_path)
    assert result.stdout.strip() == "pipeline imported before the pool: False", result.stderr


def test_imports_without_gc_freeze_what_they_create_and_restore_the_collector() -> None:
    import gc

    from freescale.pipeline.executors.processes import imports_without_gc

    gc.unfreeze()
    try:
        with pytest.raises(ImportError), imports_without_gc():
            assert not gc.isenabled()
            import freescale_no_such_module  # noqa: F401
        assert gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


WORKER_EXIT_PROBE = """
from freescale.pipeline.executors.processes import start_pool

if __name__ == "__main__":
    pool = start_pool(1)
    pool.submit(print, "unflushed output of a worker", end="").result()
    process = next(iter(pool._processes.values()))
    pool.shutdown()
    print("|exit code", process.exitcode)
"""


def test_pool_processes_exit_cleanly_without_interpreter_teardown(tmp_path) -> None:
    """Workers end with ``os._exit`` after the normal exit steps: buffered output still arrives
    and the exit code is 0."""
    probe = tmp_path / "probe.py"
    probe.write_text(WORKER_EXIT_PROBE)
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    result = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert result.stdout.strip() == "unflushed output of a worker|exit code 0", result.stderr


def test_spill_files_are_removed_once_their_partition_is_built(tiny_sources, tmp_path) -> None:
    """Spill files go as soon as their partition's samples are built (their page cache is reused by
    the next files written), unless kept for a later run (``keep_input``: stats --work-dir); the
    per-task user counts the plan reads stay."""
    from freescale.pipeline.prepare import PrepareJob
    from freescale.pipeline.steps import scan
    from freescale.pipeline.steps.sequences import run_partition

    job = PrepareJob(make_config(tiny_sources, str(tmp_path / "out"), work_dir=str(tmp_path / "work")))
    try:
        counts = job.count_samples()
    finally:
        job.close()
    scan_dir, samples_dir = job.work / "scan", tmp_path / "samples"
    samples_dir.mkdir()
    assert counts.n_partitions > 1
    for p in range(counts.n_partitions):
        args = (counts.scan_dir, str(samples_dir), p, job.config.samples, None, [])
        run_partition(*args, keep_input=p == 0)
    assert scan.partition_files(str(scan_dir), 0)
    assert all(not scan.partition_files(str(scan_dir), p) for p in range(1, counts.n_partitions))
    assert len(list(samples_dir.glob("p*.arrow"))) == counts.n_partitions
    assert len(list(scan_dir.glob("t*.users.npy"))) == len(job.tasks)
