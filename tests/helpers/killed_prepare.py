"""Run ``freescale <args>`` and signal it at an exact point of publishing (a test harness).

    python killed_prepare.py POINT SIGNAL freescale-args...

POINT says when ``SIGNAL`` (``KILL`` or ``INT``) is sent to this process (the driver; run with
``--workers 1`` so it is the only one):

- ``after-publish``: right after the rename that puts the new dataset at ``--output`` (an exchange
  with the old one, or a plain rename);
- ``deleting-old``: right after the first shard of the replaced dataset is unlinked (its deletion
  cut short);
- ``before-manifest``: right before ``manifest.json``'s temporary file is renamed into place.

The renames are watched where ``publish_local`` makes them: ``os.rename``/``os.replace`` and
``output._exchange`` (``renameat2``). A point never reached lets the command finish normally: the
test sees exit status 0 where it expected a kill.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path


def main() -> int:
    point, name, *argv = sys.argv[1:]
    sig = {"KILL": signal.SIGKILL, "INT": signal.SIGINT}[name]
    output = Path(argv[argv.index("--output") + 1]).resolve()
    state = {"published": False}

    def fire() -> None:
        os.kill(os.getpid(), sig)  # SIGINT: KeyboardInterrupt as soon as this call returns, as a Ctrl-C here

    def watch(real):
        def renamed(src, dst, *args, **kwargs):
            if point == "before-manifest" and Path(os.fsdecode(dst)).name == "manifest.json":
                fire()
            result = real(src, dst, *args, **kwargs)
            if Path(os.fsdecode(dst)) == output:
                state["published"] = True
                if point == "after-publish":
                    fire()
            return result

        return renamed

    from freescale.pipeline import output as places

    os.rename, os.replace = watch(os.rename), watch(os.replace)
    places._exchange = watch(places._exchange)
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        real_unlink(path, *args, **kwargs)
        if point == "deleting-old" and state["published"] and os.fsdecode(path).endswith(".mds"):
            fire()

    os.unlink = unlink
    from freescale.tools.cli import main as cli

    return cli(argv)


if __name__ == "__main__":
    sys.exit(main())
