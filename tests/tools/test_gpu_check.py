"""The GPU check (scripts/gpu_check.sh, tools/gpu_check.py): its dry run on CPU, the wheel list, and
what keeps a real run bounded (timeouts that kill whole process trees, results read back)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from freescale.tools import gpu_check, part_runner, wheel_list

REPO = Path(__file__).resolve().parents[2]
WANTED = wheel_list.read_list(REPO / "scripts" / "gpu_wheels.txt")


def fake_wheels(folder: Path, size: int = 0) -> Path:
    """Empty (or sparse) files named like the listed wheels: the dry run only reads their names."""
    folder.mkdir(parents=True, exist_ok=True)
    for want in WANTED:
        path = folder / f"{want.name.replace('-', '_')}-{want.version}-py3-none-any.whl"
        path.touch()
        os.truncate(path, size)
    return folder


def gone(pid: int, within: float = 5.0) -> bool:
    """Whether ``pid`` has exited (or is a zombie) within ``within`` seconds: SIGKILL is not instant."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def bench_ready(name: str) -> bool:
    """What the dry run should find: the script, with --quick and --out among its options."""
    path = REPO / "benchmarks" / f"{name}.py"
    return path.exists() and all(flag in path.read_text() for flag in ('"--quick"', '"--out"'))


@pytest.mark.slow
def test_the_dry_run_assembles_every_part(tmp_path: Path) -> None:
    out = tmp_path / "out"
    wheels = fake_wheels(tmp_path / "wheels")
    command = ["bash", str(REPO / "scripts" / "gpu_check.sh"), str(out), "--dry-run", "--wheels", str(wheels)]
    command += ["--site", str(tmp_path / "site"), "--work", str(tmp_path / "work")]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=400, env=dict(os.environ, PYTHON=sys.executable)
    )
    records = {part.name: json.loads((out / f"{part.name}.json").read_text()) for part in gpu_check.PARTS}
    expected = {name: "ok" if name not in gpu_check.BENCHES or bench_ready(name) else "failed" for name in records}
    assert {name: r["status"] for name, r in records.items()} == expected, result.stdout[-4000:]
    assert result.returncode == (0 if set(expected.values()) == {"ok"} else 1)
    assert records["install"]["figures"]["wheels"].startswith(f"{len(WANTED)} of {len(WANTED)} wheels")
    tests = records["tests"]["figures"]
    assert {"tests/tools/test_gpu_training.py", "tests/kernels/test_transport_gpu.py"} <= set(tests["files"])
    assert tests["collected"] >= 4  # test_gpu_training's 3 and test_transport_gpu's 1 at least
    for part in ("train_w1", "train_w2"):
        command = records[part]["result"]["command"]
        assert command[command.index("--nproc") + 1] == part[-1] and 'engine.overlap="pec"' in command
    assert "engine.share_gpus=true" in records["train_w2"]["result"]["command"]
    zch_run = (out / "train_zch" / "run.toml").read_text()  # validated: item and user ids through zch tables
    assert 'ids = "zch"' in zch_run and "[user_tables.user_id]" in zch_run
    summary = (out / "summary.txt").read_text().splitlines()
    assert summary[0].startswith("FreeScale GPU check (dry run") and len(summary) <= 30
    assert json.loads((out / "summary.json").read_text())["exit_status"] == result.returncode
    with tarfile.open(tmp_path / "gc.tgz", "w:gz") as tar:  # what the lead carries back: plain files only
        tar.add(out, arcname=".")
    assert not [p for p in out.rglob("*") if p.is_symlink()]


def test_a_timeout_kills_the_whole_tree_even_what_left_the_group(tmp_path: Path) -> None:
    """``freescale train`` starts torchrun in a session of its own: killing the part's process group
    alone would leave the ranks running on the GPU."""
    pidfile = tmp_path / "escaped.pid"
    script = f"setsid sleep 300 & echo $! > {pidfile}; sleep 300"
    started = time.monotonic()
    outcome = part_runner.run_command(["bash", "-c", script], tmp_path / "part.log", timeout=1.0)
    assert outcome.status == "timeout" and time.monotonic() - started < 1.0 + 2 * part_runner.GRACE_S + 3
    assert gone(int(pidfile.read_text()))
    assert "killed after the part's timeout" in outcome.tail()


def test_pytest_stopped_at_the_timeout_still_reports_what_ran(tmp_path: Path) -> None:
    """The tests part counts the tests that finished before a hang: pytest gets SIGINT first."""
    (tmp_path / "test_hang.py").write_text(
        "import time\n\n\ndef test_a():\n    pass\n\n\ndef test_b():\n    time.sleep(300)\n"
    )
    junit = tmp_path / "junit.xml"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", "test_hang.py"]
    outcome = part_runner.run_command(argv, tmp_path / "pytest.log", timeout=12.0, cwd=tmp_path)
    assert outcome.status == "timeout"
    counts = part_runner.junit_counts(junit)
    assert (counts["passed"], counts["interrupted"]) == (1, 1), outcome.tail()


def test_a_finished_part_leaves_nothing_behind(tmp_path: Path) -> None:
    pidfile = tmp_path / "left.pid"
    outcome = part_runner.run_command(["bash", "-c", f"setsid sleep 300 & echo $! > {pidfile}"], tmp_path / "l.log", 30)
    assert outcome.status == "ok" and outcome.returncode == 0
    assert gone(int(pidfile.read_text())), "a process of the part outlived it"
    missing = part_runner.run_command(["/nonexistent/program"], tmp_path / "m.log", 5)
    assert missing.status == "failed" and "cannot start" in missing.tail()


def test_wheel_tags_and_resolution(tmp_path: Path) -> None:
    good = [
        "cramjam-2.14.0-cp312-cp312-manylinux_2_28_x86_64.whl",
        "polars_runtime_32-2.1.0-cp311-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "torchdata-0.11.0-py3-none-any.whl",
    ]
    bad = [
        "cramjam-2.14.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        "cramjam-2.14.0-cp313-abi3-manylinux_2_28_x86_64.whl",
        "cramjam-2.14.0-cp312-cp312-macosx_11_0_arm64.whl",
        "cramjam-2.14.0-cp312-cp312-manylinux_2_28_aarch64.whl",
    ]
    for name in good + bad:
        _, _, python, abi, platform = wheel_list.wheel_parts(name)
        assert wheel_list.installable(python, abi, platform) == (name in good), name
    assert {w.name for w in WANTED} >= {"polars", "polars-runtime-32", "mosaicml-streaming", "torchdata"}
    assert not {w.name for w in WANTED} & {"ray", "boto3", "moto", "torchrec", "fbgemm-gpu", "numpy", "torch"}
    folder = fake_wheels(tmp_path / "w")
    assert not wheel_list.resolve(folder, WANTED).problems
    (folder / "torchdata-0.11.0-py3-none-any.whl").unlink()
    (folder / "polars-2.0.0-py3-none-any.whl").touch()
    (folder / "ray-2.60.0-py3-none-any.whl").touch()
    (folder / "zstd-1.5.6.1-py3-none-any.whl").rename(folder / "zstd-1.5.6.1-cp311-cp311-manylinux_2_28_x86_64.whl")
    problems = "\n".join(wheel_list.resolve(folder, WANTED).problems)
    assert "torchdata==0.11.0: no wheel" in problems and "polars==2.1.0: 2 wheels" in problems
    assert "ray-2.60.0-py3-none-any.whl: not in the wheel list" in problems and "cannot install it" in problems


def test_the_size_limit_fails_the_download_script(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert gpu_check.verify_wheels(fake_wheels(tmp_path / "small", size=1000), REPO) == 0
    big = fake_wheels(tmp_path / "big", size=8 * 2**20)  # sparse: 8 wheels x 8 MiB = 64 MiB
    assert gpu_check.verify_wheels(big, REPO) == 1
    assert "over the limit" in capsys.readouterr().err


def test_results_are_read_back(tmp_path: Path) -> None:
    result = {
        "targets": {"a": {"ratio": 2.0, "target_met": True}},
        "target_met": {"b": False},
        "rows": [{"target_met": 1}],
    }
    assert part_runner.targets_in(result) == {"targets.a": True, "b": False}
    junit = tmp_path / "j.xml"
    junit.write_text(
        '<testsuites><testsuite tests="3"><testcase classname="t" name="ok"/>'
        '<testcase classname="t" name="bad"><failure message="boom&#10;more"/></testcase>'
        '<testcase classname="t" name="skip"><skipped message="needs a CUDA device"/></testcase>'
        "</testsuite></testsuites>"
    )
    counts = part_runner.junit_counts(junit)
    assert (counts["passed"], counts["failed"], counts["errors"], counts["skipped"]) == (1, 1, 0, 1)
    assert counts["not_passed"][0] == {"test": "t::bad", "outcome": "failed", "message": "boom"}
    files = {p.name for p in gpu_check.gpu_test_files(REPO)}
    assert {"test_transport_gpu.py", "test_gpu_training.py"} <= files and "test_gpu_check.py" not in files


def test_sm_contention_gets_a_budget_that_ends_it_before_its_timeout(tmp_path: Path) -> None:
    """Killed mid-point at its timeout (twice, on an H200), the benchmark judged nothing: it gets
    ``--budget-s`` inside the timeout the part is given (what the deadline leaves, when less)."""
    part = next(p for p in gpu_check.PARTS if p.name == "bench_sm_contention")
    seen: list[tuple[list[str], float]] = []

    class FakeCheck:
        repo, dry, python, out = REPO, False, "python3", tmp_path

        def command(self, part: gpu_check.Part, argv: list[str], timeout: float) -> part_runner.Outcome:
            seen.append((argv, timeout))
            return part_runner.Outcome("ok", 0, 1.0, tmp_path / "x.log")

    for timeout in (part.timeout, 40.0, 10.0):
        part.run(FakeCheck(), part, timeout)  # type: ignore[arg-type]
    budgets = [float(argv[argv.index("--budget-s") + 1]) for argv, _ in seen]
    assert budgets == [part.timeout - gpu_check.SM_CONTENTION_MARGIN_S, 15.0, 1.0]
    assert [t for _, t in seen] == [part.timeout, 40.0, 10.0] and part.timeout <= 90
    other = next(p for p in gpu_check.PARTS if p.name == "bench_dispatch")
    other.run(FakeCheck(), other, 60.0)  # type: ignore[arg-type]
    assert "--budget-s" not in seen[-1][0]  # only the benchmark that takes one


def test_the_linked_checkout_imports_as_the_installed_package(tmp_path: Path) -> None:
    """The fallback when the image's setuptools cannot build the checkout: the package-dir layout of
    pyproject.toml made of links (checked with -S: no site-packages, so no editable finder)."""
    gpu_check.link_checkout(REPO, tmp_path)
    code = "import freescale.tools.gpu_check as g, freescale.trainer as t; print(g.__file__); print(t.__path__[0])"
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    result = subprocess.run([sys.executable, "-S", "-P", "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    module, trainer = result.stdout.split()
    assert module == str(tmp_path / "freescale" / "tools" / "gpu_check.py")
    assert (Path(trainer) / "simulate" / "profiles").is_dir() and Path(trainer).resolve() == REPO / "trainer"


def test_one_gpu_leaves_multi_gpu_tests_out_so_any_skip_is_a_miss() -> None:
    """On the H200 (one device) the launch-device test skipped, so ``no_gpu_test_skipped`` was missed on
    every run of a one-GPU machine: such tests carry ``multi_gpu`` and are deselected there."""
    assert gpu_check.gpu_marks(1) == gpu_check.gpu_marks(None) == "gpu and not multi_gpu"
    assert gpu_check.gpu_marks(2) == "gpu"
    needs_two = [p for p in gpu_check.gpu_test_files(REPO) if "device_count() < 2" in p.read_text()]
    assert needs_two and all("pytest.mark.multi_gpu" in p.read_text() for p in needs_two)
