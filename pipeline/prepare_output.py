"""A ``prepare`` job's side of its output (``output`` holds the places, locks and swap): parts marked
written checked against the target, a different or foreign existing output refused (an s3:// one
cleared with ``--overwrite``), and the finished dataset published: offsets, quarantine, vocabularies,
then the manifest, then (local output) the swap.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.fs as pafs

from freescale import storage
from freescale.pipeline import output as places
from freescale.pipeline.config import PrepareConfig
from freescale.pipeline.dataset.manifest import MANIFEST_NAME, OFFSETS_NAME
from freescale.pipeline.dataset.vocabulary import Vocabulary
from freescale.pipeline.manifest import QUARANTINE_NAME, published_files, read_manifest_if_any
from freescale.pipeline.output import PrepareError
from freescale.pipeline.steps import scan
from freescale.pipeline.steps.writer import part_name, written_part_problem


class OutputChecks:
    """``PrepareJob``'s output methods (a mixin: the attributes are the job's)."""

    config: PrepareConfig
    fingerprint: str
    work: Path
    target: str

    def _check_written_parts(self) -> None:
        """A part marked written must be in the target as this job wrote it (``written_part_problem``).
        The target is not held between runs: a staging directory may have been removed, an s3:// output
        cleared by ``--overwrite``, and a killed release of ours left another dataset's parts under the
        staging name. The part's buckets are gone, so the work directory cannot finish the job: start
        it again (in an emptied staging directory) rather than publish files this job did not write."""
        buckets_dir = str(self.work / "buckets")
        remote = storage.is_remote(self.target)
        for marker in sorted(Path(buckets_dir).glob("write.part-*.done")):
            part = int(marker.name.split("-")[1].split(".")[0])
            problem = written_part_problem(self.target, buckets_dir, part, hash_shards=not remote)
            if problem is not None:
                self._log(f"{part_name(part)} is marked written but {problem}: starting over")
                self._remove_work()
                if not remote:
                    shutil.rmtree(self.target, ignore_errors=True)
                self._make_work_dirs()
                return

    def _check_output(self) -> dict[str, Any] | None:
        """Refuse to clobber a different dataset; report an identical finished one as up to date."""
        manifest = read_manifest_if_any(self.config.output, damaged_ok=self.config.overwrite)
        if manifest is not None and manifest.get("fingerprint") == self.fingerprint and not self.config.overwrite:
            return manifest
        if manifest is not None and not self.config.overwrite:
            raise PrepareError(
                f"{self.config.output} already holds a different prepared dataset (fingerprint "
                f"{manifest.get('fingerprint', '?')[:12]} != {self.fingerprint[:12]}); pass --overwrite to replace it"
            )
        if manifest is None and not self.config.overwrite and self._has_foreign_files():
            raise PrepareError(
                f"{self.config.output} is not empty and holds no FreeScale manifest; pass --overwrite "
                "to replace its contents or choose another --output"
            )
        remote = storage.is_remote(self.config.output)
        if remote and self.config.overwrite and (manifest is not None or self._has_foreign_files()):
            self._clear_output()  # s3 has no swap: the old dataset goes first, its manifest first of all
        return None

    def _has_foreign_files(self) -> bool:
        """Entries that are not an unfinished FreeScale output (parts of a killed job that wrote in place)."""
        fs, path = storage.filesystem(self.config.output)
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            return False
        if fs.get_file_info(path).type != pafs.FileType.Directory:
            return True
        entries = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        return bool(entries) and not places.is_unfinished_own_output([entry.base_name for entry in entries])

    def _clear_output(self) -> None:
        """Empty an s3:// output, ``manifest.json`` first: a reader never sees a manifest without its files."""
        fs, path = storage.filesystem(self.config.output)
        entries = sorted(fs.get_file_info(pafs.FileSelector(path)), key=lambda e: e.base_name != MANIFEST_NAME)
        for entry in entries:
            if entry.type == pafs.FileType.Directory:
                fs.delete_dir(entry.path)
            else:
                fs.delete_file(entry.path)

    def _publish(
        self,
        manifest: dict[str, Any],
        offsets: np.ndarray,
        summary: scan.ScanSummary,
        users: dict[str, Any],
        vocabularies: dict[str, Vocabulary],
    ) -> None:
        """Write the offsets, quarantine and vocabulary files (``vocabularies``: by path), then the
        manifest with every file's hash, then (local output) swap the dataset in."""
        for name, vocab in vocabularies.items():
            storage.write_bytes(storage.join(self.target, name), vocab.to_bytes())
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(offsets, np.int64))
        storage.write_bytes(storage.join(self.target, OFFSETS_NAME), buffer.getvalue())
        examples = quarantine_examples(summary, users)
        storage.write_bytes(storage.join(self.target, QUARANTINE_NAME), quarantine_lines(examples).encode())
        manifest["files"] = published_files(self.target, list(vocabularies))  # every file above, sized and hashed
        storage.write_bytes(
            storage.join(self.target, MANIFEST_NAME),
            (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode(),
        )
        if not storage.is_remote(self.config.output):  # the finished directory becomes the output at once
            listed = {entry["path"] for entry in manifest["files"]} | {MANIFEST_NAME}
            for name in places.remove_unlisted(Path(self.target), listed):
                self._log(f"removed {name} from {self.target}: not part of the dataset")
            places.publish_local(Path(self.target), places.local_output(self.config.output))


def quarantine_examples(summary: scan.ScanSummary, users: dict[str, Any]) -> dict[str, list[dict]]:
    """The examples of ``quarantine.jsonl``: the events' by reason, then the users table's (``users:<reason>``)."""
    examples = {**summary.examples}
    for reason, rows in users.get("examples", {}).items():
        examples.setdefault(f"users:{reason}", rows)
    return examples


def quarantine_lines(examples: dict[str, list[dict]]) -> str:
    return "".join(
        json.dumps(row, sort_keys=True, default=str) + "\n" for reason in sorted(examples) for row in examples[reason]
    )
