"""The transport seam (trainer/engines/comm.py)."""

from __future__ import annotations

from pathlib import Path


def test_every_trainer_all_to_all_goes_through_the_transport() -> None:
    """The seam: no trainer module calls ``dist.all_to_all_single`` itself (TorchRec's engine only
    wraps the function TorchRec calls, to time it)."""
    import freescale.trainer

    root = Path(freescale.trainer.__file__).parent
    callers = sorted(p.name for p in root.glob("*.py") if "all_to_all_single(" in p.read_text())
    assert callers == [], callers
