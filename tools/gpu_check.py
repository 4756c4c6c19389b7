"""The GPU check: everything FreeScale should do on a GPU, in one bounded run (``scripts/gpu_check.sh``).

    bash scripts/gpu_check.sh OUTDIR [--dry-run] [--wheels DIR] [--parts a,b] [--deadline S]

Made for a lent, offline GPU machine reached a few minutes at a time: one command does it all, a
failing or hanging part never stops the others (each has its own timeout, its whole process tree is
killed past it: ``part_runner``), the whole check stops at ``--deadline``, and OUTDIR holds plain
files only (one JSON per part, its log, ``summary.txt``, ``summary.json``), ready for ``tar``.

Parts, in order (``PARTS``): ``environment`` (device, versions), ``install`` (the wheels of
``scripts/gpu_wheels.txt`` from ``.whl/`` into a private ``--target`` folder, then FreeScale itself
from this checkout, offline), ``bench_hstu_attention`` (``--quick --out``), ``tests`` (every test
marked ``gpu``, from the test files that hold such marks), ``train_data`` / ``train_w1`` /
``train_w2`` / ``train_zch`` (``gpu_training.py``; the last with item and user ids through zero-collision
tables), ``calibrate`` (the cost profiles of the Triton and the PyTorch
attention on this card), then ``bench_dispatch``, ``bench_zch_lookup`` (the zero-collision table's
lookup: the Triton kernel against the masked torch path) and ``bench_sm_contention``.

``--dry-run`` (CPU, part of ``make test``) proves the check assembles without running anything
heavy: the wheel list resolves against the wheel folder (or is skipped with a note), the modules the
parts import are there, ``pytest --collect-only -m gpu`` of the gpu files works, each benchmark's
``--help`` exits 0 and names ``--quick`` and ``--out``, the training configs validate, and the
JSON and summary are written like a real run's.

Standard library only: it runs before FreeScale is installed (by path, ``python3 tools/gpu_check.py``)
and after (``python -m freescale.tools.gpu_check``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__:
    from freescale.tools import part_runner, wheel_list
else:  # run by path (scripts/gpu_check.sh), before FreeScale is installed: the siblings are on sys.path
    import part_runner
    import wheel_list

DEADLINE_S = 465.0  # the whole check, installs and Triton compilation included (8 min less a part's stop)
DRY_DEADLINE_S = 300.0
MIN_PART_S = 10.0  # a part with less time left than this is skipped, not started
BENCHES = ("bench_hstu_attention", "bench_dispatch", "bench_zch_lookup", "bench_sm_contention")
SMOKE_IMPORTS = (  # what the parts import beyond the image: a missing wheel fails here, in one place
    "freescale.trainer.runner, freescale.trainer.engines.pec, freescale.pipeline.prepare, "
    "freescale.pipeline.dataset.loader, freescale.kernels, freescale.datasets.synthetic, polars, "
    "torchdata.stateful_dataloader"
)


@dataclass(frozen=True)
class Part:
    """One part: its name, its timeout on the GPU and in a dry run, and what runs it."""

    name: str
    timeout: float
    dry_timeout: float
    run: Callable[[Check, Part, float], dict[str, Any]]


class Check:
    """One run of the check: options, the environment its commands get, the parts' records."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.out = Path(args.outdir).absolute()
        self.repo = Path(args.repo).absolute()
        self.dry = args.dry_run
        self.python = args.python
        self.wheels = Path(args.wheels).absolute() if args.wheels else self.repo / ".whl"
        self.site = Path(args.site).absolute()
        self.work = Path(args.work).absolute()
        self.started = time.monotonic()
        self.deadline = args.deadline or (DRY_DEADLINE_S if self.dry else DEADLINE_S)
        self.pytest_k = args.pytest_k
        self.records: dict[str, dict[str, Any]] = {}
        self.environment: dict[str, Any] = {}

    def env(self) -> dict[str, str]:
        """Children import FreeScale and the wheels from the private site folder once it exists."""
        env = dict(os.environ, PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
        for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):  # every rank is on this machine; an
            env.setdefault(variable, "lo")  # offline VM's other interfaces or hostname may lead nowhere
        if not self.dry and self.site.is_dir():
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.site), os.environ.get("PYTHONPATH", "")) if p)
        return env

    def remaining(self) -> float:
        return self.deadline - (time.monotonic() - self.started)

    def command(self, part: Part, argv: list[str], timeout: float, cwd: Path | None = None) -> part_runner.Outcome:
        return part_runner.run_command(argv, self.out / f"{part.name}.log", timeout, cwd or self.repo, self.env())

    def python_m(self, module: str, *args: str) -> list[str]:
        """``python -P -m module``: -P keeps the working directory off sys.path (from the repository
        root ``freescale/`` would shadow the installed package and lose its subpackages)."""
        return [self.python, "-P", "-m", module, *args]


# parts -------------------------------------------------------------------------------------------
ENV_PROBE = """
import json, platform, sys
info = {"python": platform.python_version()}
for name in ("torch", "triton", "numpy", "pyarrow"):
    try:
        info[name] = __import__(name).__version__
    except Exception as error:
        info[name] = f"missing ({type(error).__name__})"
import torch
info["cuda"] = torch.version.cuda
info["cuda_available"] = torch.cuda.is_available()
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    info.update(device=p.name, devices=torch.cuda.device_count(), sms=p.multi_processor_count,
                memory_gib=round(p.total_memory / 2**30, 1), capability=f"{p.major}.{p.minor}")
else:
    info["device"] = "no CUDA device"
print("ENV " + json.dumps(info))
"""


def part_environment(check: Check, part: Part, timeout: float) -> dict[str, Any]:
    outcome = check.command(part, [check.python, "-P", "-c", ENV_PROBE], timeout, cwd=check.out)
    line = next((x for x in outcome.log.read_text().splitlines() if x.startswith("ENV ")), None)
    figures = json.loads(line[4:]) if line else {}
    check.environment = {k: figures.get(k) for k in ("device", "devices", "torch", "triton", "cuda", "python")}
    figures["host"] = platform.node()
    targets = {} if check.dry else {"cuda_device_visible": bool(figures.get("cuda_available"))}
    return {"outcome": outcome, "figures": figures, "target_met": targets}


def part_install(check: Check, part: Part, timeout: float) -> dict[str, Any]:
    notes: list[str] = []
    wanted = wheel_list.read_list(check.repo / "scripts" / "gpu_wheels.txt")
    figures: dict[str, Any] = {"wheels_dir": str(check.wheels), "site": str(check.site)}
    files: list[Path] = []
    if check.wheels.is_dir():
        resolution = wheel_list.resolve(check.wheels, wanted)
        figures["wheels"] = wheel_list.describe(resolution, wanted)
        figures["wheel_files"] = sorted(p.name for p in resolution.files.values())
        if resolution.problems:
            return {"status": "failed", "figures": figures, "notes": resolution.problems}
        files = sorted(resolution.files.values())
    elif check.dry:
        notes.append(f"no wheel folder {check.wheels}: wheel list not checked (scripts/gpu_wheels.sh DIR makes one)")
    else:
        return {"status": "failed", "figures": figures, "notes": [f"no wheel folder {check.wheels}"]}
    end = time.monotonic() + timeout
    if not check.dry:
        shutil.rmtree(check.site, ignore_errors=True)
        check.site.mkdir(parents=True)
        pip = [check.python, "-m", "pip", "install", "--no-index", "--no-deps", "--disable-pip-version-check"]
        outcome = check.command(part, [*pip, "--target", str(check.site), *map(str, files)], end - time.monotonic())
        if outcome.status != "ok":
            return {"outcome": outcome, "figures": figures, "notes": ["installing the wheels failed"]}
        build = [*pip, "--no-build-isolation", "--target", str(check.site), str(check.repo)]
        built = check.command(part, build, end - time.monotonic(), cwd=check.out)
        figures["freescale_install"] = "pip" if built.status == "ok" else "links to the checkout"
        if built.status != "ok":  # e.g. an older setuptools in the image: the checkout's folders, linked
            notes.append("pip could not build FreeScale from the checkout; linked its folders instead (see log)")
            link_checkout(check.repo, check.site)
    probe = f"import {SMOKE_IMPORTS}; import freescale; print('FREESCALE', freescale.__file__)"
    smoke = check.command(part, [check.python, "-P", "-c", probe], end - time.monotonic(), cwd=check.out)
    return {"outcome": smoke, "figures": figures, "notes": notes, "target_met": {}}


def link_checkout(repo: Path, site: Path) -> None:
    """``site/freescale`` as the installed layout (pyproject's package-dir) made of links into ``repo``."""
    package = site / "freescale"
    shutil.rmtree(package, ignore_errors=True)
    package.mkdir(parents=True)
    for source in (repo / "freescale").iterdir():
        (package / source.name).symlink_to(source)
    for folder in ("pipeline", "trainer", "kernels", "datasets", "tools"):
        (package / folder).symlink_to(repo / folder)


def gpu_test_files(repo: Path) -> list[Path]:
    """Test files holding a ``gpu`` mark (collecting every test file would import moto, ray, ...)."""
    mark = re.compile(r"pytest\.mark\.gpu\b")
    return sorted(p for p in (repo / "tests").rglob("test_*.py") if mark.search(p.read_text(errors="replace")))


def gpu_marks(devices: int | None) -> str:
    """The tests part's ``-m`` expression: tests marked ``multi_gpu`` (two devices or more) are left out
    on a machine with fewer, so a skip there always means a test that should have run and did not."""
    return "gpu" if devices is not None and devices >= 2 else "gpu and not multi_gpu"


def part_tests(check: Check, part: Part, timeout: float) -> dict[str, Any]:
    files = [str(p.relative_to(check.repo)) for p in gpu_test_files(check.repo)]
    marks = gpu_marks(check.environment.get("devices"))
    pytest = check.python_m("pytest", "-m", marks, "-p", "no:cacheprovider", "-q", *files)
    if check.pytest_k:
        pytest += ["-k", check.pytest_k]
    figures: dict[str, Any] = {"files": files, "marks": marks}
    if check.dry:
        outcome = check.command(part, [*pytest, "--collect-only"], timeout)
        collected = [x for x in outcome.log.read_text().splitlines() if "::" in x and x.startswith("tests/")]
        figures["collected"] = len(collected)
        ok = outcome.status == "ok" and bool(collected)
        return {"outcome": outcome, "figures": figures, "status": outcome.status if ok else "failed"}
    junit = check.out / "tests.junit.xml"
    outcome = check.command(part, [*pytest, "-rfEs", f"--junitxml={junit}"], timeout)
    if junit.exists():
        figures.update(part_runner.junit_counts(junit))
    passed, bad = figures.get("passed", 0), figures.get("failed", 0) + figures.get("errors", 0)
    targets = {"gpu_tests_pass": passed > 0 and bad == 0, "no_gpu_test_skipped": figures.get("skipped", 0) == 0}
    if passed == 0 and outcome.status == "ok":  # every test skipped: on the GPU machine that is a failure
        return {"outcome": outcome, "figures": figures, "target_met": targets, "status": "failed",
                "notes": ["no gpu test ran (all skipped: see the skip reasons in tests.log)"]}  # fmt: skip
    return {"outcome": outcome, "figures": figures, "target_met": targets}


def training(name: str) -> Callable[[Check, Part, float], dict[str, Any]]:
    """A ``gpu_training`` subcommand as a part (its JSON is the part's result)."""

    def run(check: Check, part: Part, timeout: float) -> dict[str, Any]:
        result = check.out / f"{part.name}.result.json"
        prepared = check.work / "prepared"
        if name == "data":
            args = ["data", "--work", str(check.work)]
        else:
            data = part_runner.read_json(check.out / "train_data.result.json") or {}
            if data.get("status") != "ok" and not check.dry:
                return {"status": "skipped", "notes": ["no dataset: train_data did not finish"]}
            ranks = "2" if name == "w2" else "1"
            args = ["run", "--ranks", ranks, "--data", str(prepared), "--run-dir", str(check.out / part.name)]
            args += ["--zch"] if name == "zch" else []
            args += ["--timeout", str(max(5.0, timeout - 15))]  # the run's own stop leaves time to report
            if name == "w2" and (check.out / "train_w1.result.json").exists():
                args += ["--compare", str(check.out / "train_w1.result.json")]
        argv = check.python_m("freescale.tools.gpu_training", *args, "--out", str(result))
        check.work.mkdir(parents=True, exist_ok=True)
        outcome = check.command(part, [*argv, *(["--dry-run"] if check.dry else [])], timeout, cwd=check.work)
        return {"outcome": outcome, "result": part_runner.read_json(result), "result_file": result.name}

    return run


CALIBRATION_MODEL = "[model]\nd_model = 256\nnum_layers = 4\nnum_heads = 4\nnum_negatives = 128\nmax_uih_len = 2048\n"


def part_calibrate(check: Check, part: Part, timeout: float) -> dict[str, Any]:
    """``freescale calibrate --device cuda`` of an HSTU model (d_model 256, 4 layers, 4 heads, bf16)
    with the Triton attention, then with the padded PyTorch one: the per-sample cost profiles the
    planner and the online balancer read (``prepare --cost-model``), measured on this card."""
    end = time.monotonic() + timeout
    check.work.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {}
    outcome = None
    for attention in ("triton", "torch"):
        config = check.work / f"calibrate_{attention}.toml"
        config.write_text(CALIBRATION_MODEL + f'[model_extra]\nattention = "{attention}"\nprecision = "bf16"\n')
        result = check.out / f"calibrate_{attention}.result.json"
        if check.dry:
            probe = f"from freescale.trainer.simulate.calibrate import read_config; read_config({str(config)!r})"
            outcome = check.command(part, [check.python, "-P", "-c", probe], end - time.monotonic(), cwd=check.out)
        else:
            argv = check.python_m("freescale.tools.cli", "calibrate", "--config", str(config), "--out", str(result),
                                  "--device", "cuda")  # fmt: skip
            outcome = check.command(part, argv, end - time.monotonic(), cwd=check.out)
            cost = part_runner.read_json(result)
            if cost is not None:
                details = cost.get("details", {})
                figures[attention] = {k: cost.get(k) for k in ("a", "b", "c")} | {
                    "per_micro_batch_s": details.get("per_micro_batch_s"),
                    "fit_relative_error_mean": details.get("fit_relative_error_mean"),
                    "attention_ran": details.get("attention"), "device": details.get("device")}  # fmt: skip
        if outcome.status != "ok":
            break
    targets = {} if check.dry else {"calibrated_triton": "triton" in figures, "calibrated_torch": "torch" in figures}
    return {"outcome": outcome, "figures": figures, "target_met": targets}


def bench(script: str, budget_margin_s: float | None = None) -> Callable[[Check, Part, float], dict[str, Any]]:
    """A GPU benchmark as a part: ``--quick --out`` (dry run: ``--help`` names the flags it gets).

    With ``budget_margin_s`` it also gets ``--budget-s``, the part's timeout (or what the deadline
    leaves) less that margin, for the interpreter's and torch's start, the last point's overrun and the
    JSON: a benchmark that stops itself between points is judged on what it measured, where one
    killed at the timeout loses the point it was in and says nothing of the rest."""
    flags = ("--quick", "--out", *(("--budget-s",) if budget_margin_s is not None else ()))

    def run(check: Check, part: Part, timeout: float) -> dict[str, Any]:
        path = check.repo / "benchmarks" / f"{script}.py"
        if not path.exists():
            return {"status": "failed", "notes": [f"{path.relative_to(check.repo)} is not in this checkout"]}
        if check.dry:
            outcome = check.command(part, [check.python, str(path), "--help"], timeout)
            text = outcome.log.read_text()
            absent = [flag for flag in flags if flag not in text]
            notes = [f"{flag} is not among its options yet" for flag in absent]
            return {"outcome": outcome, "status": "failed" if absent else outcome.status, "notes": notes}
        result = check.out / f"{part.name}.result.json"
        argv = [check.python, str(path), "--quick", "--out", str(result)]
        if budget_margin_s is not None:
            argv += ["--budget-s", f"{max(timeout - budget_margin_s, 1.0):.0f}"]
        outcome = check.command(part, argv, timeout)
        data = part_runner.read_json(result)
        status = outcome.status if data is not None or outcome.status != "ok" else "failed"
        notes = [] if data is not None or outcome.status != "ok" else ["it exited 0 but wrote no --out JSON"]
        return {"outcome": outcome, "status": status, "result": data, "result_file": result.name, "notes": notes}

    return run


# Timeouts (seconds on the GPU machine, in a dry run). Measured on one H200 (2026-11-27, cold Triton
# cache): environment 7 s, install 12-16, bench_hstu_attention 45 (early, so the kernel the training
# runs is measured whatever happens later), train_data 4-6, train_w1 27, train_w2 25, calibrate 24,
# bench_dispatch 13; bench_zch_lookup not yet run (~30 s expected: two points, a few kernel compiles);
# tests ~210 (the three training tests alone 135; 134 s on 2026-11-28 for 21 tests, before 8 zch kernel
# tests with cold compiles and 2 CUDA engine-step tests: 300 s now, run on its own with --parts when
# the whole check would pass the deadline). bench_sm_contention was killed at
# 75 s (2026-11-27) and 120 s (2026-11-28) with 18 points of ~6-12 s: its 1,600-2,400 queued SM copies
# a run blocked the host behind the device sleep, every such run was retried 4 times. Its quick run now
# measures 9 points of ~0.5 s (~25 s in all, expected) and stops itself SM_CONTENTION_MARGIN_S before
# its timeout (``--budget-s``). The timeouts add up to more than DEADLINE_S on purpose: a part that
# hangs costs its own timeout, and the parts after it share what is left.
SM_CONTENTION_MARGIN_S = 25.0  # torch's import (~5-10 s), the last point's overrun, the watchdog's 10 s
PARTS = (
    Part("environment", 60, 60, part_environment),
    Part("install", 120, 120, part_install),
    Part("bench_hstu_attention", 150, 120, bench("bench_hstu_attention")),
    Part("tests", 300, 120, part_tests),
    Part("train_data", 60, 90, training("data")),
    Part("train_w1", 100, 60, training("w1")),
    Part("train_w2", 110, 60, training("w2")),
    Part("train_zch", 100, 60, training("zch")),
    Part("calibrate", 60, 60, part_calibrate),
    Part("bench_dispatch", 75, 60, bench("bench_dispatch")),
    Part("bench_zch_lookup", 60, 60, bench("bench_zch_lookup")),
    Part("bench_sm_contention", 90, 60, bench("bench_sm_contention", SM_CONTENTION_MARGIN_S)),
)


# running the parts -------------------------------------------------------------------------------
def execute(check: Check, part: Part) -> dict[str, Any]:
    """Run one part within its timeout and the check's deadline; its record, also written as JSON."""
    timeout = min(part.dry_timeout if check.dry else part.timeout, check.remaining())
    record: dict[str, Any] = {"part": part.name, "mode": "dry-run" if check.dry else "gpu", "timeout_s": timeout}
    started = time.monotonic()
    if timeout < MIN_PART_S:
        record.update(status="skipped", notes=[f"the check's deadline of {check.deadline:.0f} s was reached"])
    else:
        try:
            raw = part.run(check, part, timeout)
        except Exception as error:  # a broken part is one failed record, never the end of the check
            raw = {"status": "failed", "notes": [f"{type(error).__name__}: {error}"]}
        record.update(assemble(raw))
    record["seconds"] = round(time.monotonic() - started, 2)
    record["environment"] = check.environment
    check.records[part.name] = record
    (check.out / f"{part.name}.json").write_text(json.dumps(record, indent=1, default=str))
    return record


def assemble(raw: dict[str, Any]) -> dict[str, Any]:
    """A part's record from what its runner returned: status, figures, target_met, notes, log tail."""
    outcome = raw.get("outcome")
    result = raw.get("result") if isinstance(raw.get("result"), dict) else None
    status = raw.get("status") or (outcome.status if outcome else "failed")
    if result is not None and result.get("status") in ("failed", "timeout") and status in ("ok", "failed"):
        status = result["status"]  # the child's own verdict (it stopped its run in time to say so)
    figures = raw.get("figures") or (result or {}).get("figures") or {}
    targets = {**raw.get("target_met", {}), **part_runner.targets_in(result or {})}
    notes = [*raw.get("notes", []), *(result or {}).get("notes", [])]
    if result is not None and result.get("error"):
        notes.append(result["error"])
    record: dict[str, Any] = {"status": status, "figures": figures, "target_met": targets, "notes": notes}
    if outcome is not None:
        record.update(log=outcome.log.name, returncode=outcome.returncode)
    if "result_file" in raw:
        record["result_file"] = raw["result_file"]
    if result is not None and not figures:
        record["result"] = result
    if status != "ok":
        record["log_tail"] = (result or {}).get("log_tail") or (outcome.tail() if outcome else "")
    return record


# the summary -------------------------------------------------------------------------------------
def headline(record: dict[str, Any]) -> str:
    """The part's one line of figures in the summary."""
    f, name = record.get("figures") or {}, record["part"]
    if name == "environment" and "sms" in f:
        return f"{f['devices']} x {f['device']} ({f['sms']} SMs, {f['memory_gib']} GiB), python {f.get('python')}"
    if name == "environment":
        return f"{f.get('device')}, python {f.get('python')}"
    if name == "calibrate" and f:
        return "; ".join(f"{k}: a={v['a']:.3g} b={v['b']:.3g} c={v['c']:.3g} s" for k, v in f.items())
    if name == "install":
        return f"{f.get('wheels', 'wheel list not checked')}; FreeScale {f.get('freescale_install', 'in place')}"
    if name == "tests" and "collected" in f:
        return f"{f['collected']} gpu tests collected from {len(f.get('files', []))} files"
    if name == "tests":
        keys = ("passed", "failed", "errors", "skipped", *(["interrupted"] if f.get("interrupted") else []))
        return ", ".join(f"{f.get(k, 0)} {k}" for k in keys)
    if name == "train_data" and "samples" in f:
        return (
            f"{f['samples']:,} samples, {f['micro_batches']} micro-batches; "
            f"generate {f['generate_s']:.0f} s, prepare {f['prepare_s']:.0f} s"
        )
    if name.startswith("train_w") and "losses" in f:
        losses = [x for x in f["losses"] if x is not None] or [float("nan")]
        line = (
            f"{f['steps']} steps, {f['steps_per_s'] or 0:.1f} steps/s, exposed comm {f['exposed_comm_pct'] or 0:.1f}%, "
            f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, {f['transport']}"
        )
        agreement = f.get("agreement")
        if agreement:
            line += ", step-0 loss = 1 rank" + (" (bitwise)" if agreement["bitwise"] else "")
        return line
    targets = record.get("target_met") or {}
    if targets:
        return f"targets met {sum(targets.values())}/{len(targets)}"
    return "; ".join(record.get("notes", []))[:90]


def summary_text(check: Check) -> tuple[str, int]:
    """One screen: a line per part, then missed targets and failures; and the exit status."""
    env = check.environment
    mode = "dry run, nothing heavy ran" if check.dry else "GPU run"
    lines = [
        f"FreeScale GPU check ({mode}): {env.get('device')}, torch {env.get('torch')}, triton {env.get('triton')}, "
        f"CUDA {env.get('cuda')}; {time.monotonic() - check.started:.0f} s of {check.deadline:.0f} s",
        f"{'part':22} {'status':8} {'seconds':>7}  result",
    ]
    for record in check.records.values():
        lines.append(f"{record['part']:22} {record['status']:8} {record['seconds']:7.1f}  {headline(record)}")
    missed = [
        f"{r['part']}: {t}" for r in check.records.values() for t, ok in r.get("target_met", {}).items() if not ok
    ]
    if missed:
        lines.append("targets missed: " + "; ".join(missed))
    bad = [r for r in check.records.values() if r["status"] != "ok"]
    for record in bad:
        reason = (record.get("notes") or [""])[0] or last_line(record.get("log_tail", ""))
        lines.append(f"{record['part']} {record['status']}: {reason[:160]} (see {record.get('log', 'its JSON')})")
    lines.append(f"{len(check.records) - len(bad)} of {len(check.records)} parts ok; files in {check.out}")
    return "\n".join(lines), 1 if bad else 0


def last_line(text: str) -> str:
    return next((x for x in reversed(text.splitlines()) if x.strip()), "")


def verify_wheels(folder: Path, repo: Path) -> int:
    """``scripts/gpu_wheels.sh``'s check: one installable wheel per listed package, under the size limit."""
    wanted = wheel_list.read_list(repo / "scripts" / "gpu_wheels.txt")
    resolution = wheel_list.resolve(folder, wanted)
    for path in sorted(resolution.files.values()):
        print(f"{path.stat().st_size / 2**20:8.2f} MiB  {path.name}")
    print(wheel_list.describe(resolution, wanted))
    problems = list(resolution.problems)
    if resolution.total_bytes > wheel_list.LIMIT_BYTES:
        problems.append(f"the wheels take {resolution.total_bytes / 2**20:.1f} MiB, over the limit")
    for problem in problems:
        print(f"gpu_wheels: error: {problem}", file=sys.stderr)
    return 1 if problems else 0


def default_repo() -> str:
    here = Path(__file__).resolve().parent.parent
    return str(here if (here / "pyproject.toml").exists() and (here / "benchmarks").is_dir() else Path.cwd())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/gpu_check.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("outdir", nargs="?", help="where the JSONs, logs and summary.txt go (made if absent)")
    p.add_argument("--dry-run", action="store_true", help="check that every part assembles; run nothing heavy")
    p.add_argument("--wheels", help="the wheel folder (default: .whl in the checkout)")
    p.add_argument("--site", default=f"/tmp/freescale-gpu-check-{os.getuid()}/site", help="private install target")
    p.add_argument("--work", default=f"/tmp/freescale-gpu-check-{os.getuid()}/work", help="dataset folder")
    p.add_argument("--repo", default=default_repo(), help="the FreeScale checkout (default: this file's)")
    p.add_argument("--python", default=sys.executable, help="the interpreter the parts run (default: this one)")
    p.add_argument("--parts", help=f"comma list of parts to run, in that order (default all: "
                   f"{','.join(p.name for p in PARTS)})")  # fmt: skip
    p.add_argument("--pytest-k", help="the tests part runs only the gpu tests matching this pytest -k expression")
    p.add_argument("--deadline", type=float, help=f"seconds for the whole check (default {DEADLINE_S:.0f})")
    p.add_argument("--verify-wheels", metavar="DIR", help="only check DIR against scripts/gpu_wheels.txt")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.verify_wheels:
        return verify_wheels(Path(args.verify_wheels), Path(args.repo))
    if not args.outdir:
        parser().error("OUTDIR is required")
    by_name = {p.name: p for p in PARTS}
    names = args.parts.split(",") if args.parts else list(by_name)
    unknown = sorted(set(names) - set(by_name))
    if unknown:
        parser().error(f"unknown part(s) {unknown}; known: {list(by_name)}")
    chosen = [by_name[name] for name in names]  # in the order given: a second shot runs what matters first
    check = Check(args)
    check.out.mkdir(parents=True, exist_ok=True)
    for part in chosen:
        record = execute(check, part)
        print(f"[gpu_check] {part.name}: {record['status']} in {record['seconds']:.1f} s", flush=True)
    text, status = summary_text(check)
    (check.out / "summary.txt").write_text(text + "\n")
    summary = {"mode": "dry-run" if check.dry else "gpu", "exit_status": status, "parts": check.records}
    (check.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(text, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
