"""A ``prepare`` job's identity and places: the source files it reads (size, mtime), the fingerprint
that names its work directory and marks its output, and the default work directory (beside a local
output, never inside it).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from freescale import storage
from freescale.datasets.sources import ReadTask, SourcesConfig
from freescale.pipeline import output as places
from freescale.pipeline.config import PrepareConfig
from freescale.pipeline.cost import CostModel


class JobIdentity:
    """``PrepareJob``'s identity methods (a mixin: the attributes are the job's)."""

    config: PrepareConfig
    sources: SourcesConfig
    cost_model: CostModel
    tasks: list[ReadTask]
    source_files: list[dict[str, Any]]

    def _source_files(self) -> list[dict[str, Any]]:
        seen: dict[str, dict[str, Any]] = {}
        for task in self.tasks:
            if task.path in seen:
                continue
            fs, path = storage.filesystem(task.path)
            info = fs.get_file_info(path)
            seen[task.path] = {
                "source": self.sources.sources[task.source].name,
                "uri": task.path,
                "size": info.size,
                "mtime_ns": info.mtime_ns,
            }
        if self.sources.users is not None:
            for uri in storage.expand(self.sources.resolve(self.sources.users.path)):
                fs, path = storage.filesystem(uri)
                info = fs.get_file_info(path)
                seen[uri] = {"source": "users", "uri": uri, "size": info.size, "mtime_ns": info.mtime_ns}
        return list(seen.values())

    def _fingerprint(self) -> str:
        identity = {
            "schema": 1,
            "config": self.config.fingerprint_fields(),
            "cost_model": self.cost_model.to_dict(),
            "sources": self.source_files,
        }
        return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()

    def _default_work_dir(self) -> str:
        """Beside a local output, never inside it (the output is replaced whole); for an s3:// output a
        directory of this user's under the temp dir (``output.private_work_root``)."""
        if storage.is_remote(self.config.output):
            return str(places.private_work_root())
        output = places.local_output(self.config.output)
        return str(output.parent / f".{output.name}.freescale-work")

    def _inputs(self) -> list[str]:
        """Every file the job reads: replacing an output that holds one would delete it."""
        inputs = [entry["uri"] for entry in self.source_files] + [self.config.sources]
        return inputs + ([self.config.cost_model_file] if self.config.cost_model_file else [])
