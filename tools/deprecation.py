"""Old CLI spellings kept for one release: they still work and print a one-line deprecation note."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


class DeprecatedAlias(argparse.Action):
    """An option renamed to ``new``: stores into the new option's ``dest`` and notes it on stderr."""

    def __init__(self, option_strings: Sequence[str], dest: str, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(
            f"{parser.prog}: {option_string} is deprecated and will be removed in the next release; use {self.new}",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)
