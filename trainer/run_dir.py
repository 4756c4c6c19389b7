"""A run owns its folders: ``logging.out_dir`` and ``checkpoint.dir`` are locked while it runs.

Why: two runs into one ``out_dir`` both ran (every step logged twice, checkpoints written by both).

- Locks: ``prepare``'s ``OutputLock`` (``flock`` on ``.<name>.freescale-lock`` beside the folder, a line
  naming the holder; the kernel drops it when the process dies, ``kill -9`` included). The launcher
  (``freescale train``) takes them before it checks anything and holds them until torchrun and every
  rank have ended. On several nodes node 0's launcher takes them: the other nodes' launchers run the
  same command on the same folders. ``freescale evaluate`` takes none: it only writes
  ``evaluation.json`` and may score a checkpoint of a run that is still training.
"""

from __future__ import annotations

from pathlib import Path

from freescale.pipeline.output import OutputLock, lock_path
from freescale.trainer.config import RunConfig


class RunFolders:
    """The run's folder locks, held from ``__enter__`` to ``__exit__`` (the launcher's whole job)."""

    def __init__(self, cfg: RunConfig) -> None:
        folders = {"logging.out_dir": cfg.logging.out_dir}
        if cfg.checkpoint.dir:
            folders["checkpoint.dir"] = cfg.checkpoint.dir
        self.locks: list[OutputLock] = []
        seen: set[Path] = set()
        for option, folder in folders.items():
            path = Path(folder).expanduser().resolve()
            if path not in seen:  # one folder for both: one lock (flock would refuse our second one)
                seen.add(path)
                where = lock_path(str(path), path.parent)  # a local folder's lock lies beside it
                self.locks.append(OutputLock(where, f"{option} {folder}", activity="used"))

    def __enter__(self) -> RunFolders:
        try:
            for lock in self.locks:
                lock.acquire()
        except BaseException:
            self.release()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()

    def release(self) -> None:
        for lock in reversed(self.locks):
            lock.release()
