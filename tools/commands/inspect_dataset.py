"""``freescale inspect``: a prepared dataset's accounting and balance report, and with ``--verify`` every
file's size and xxh64 hash checked against the manifest.
"""

from __future__ import annotations

import argparse


def add_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="print a prepared dataset's accounting and balance report")
    p.add_argument("dataset", help="prepared dataset directory or s3:// prefix")
    p.add_argument(
        "--verify",
        action="store_true",
        help="also read every file the manifest lists and check its size and xxh64 hash",
    )


def cmd_inspect(args: argparse.Namespace) -> int:
    from freescale.pipeline.dataset.manifest import load_manifest
    from freescale.tools.report import print_prepare_summary

    manifest = load_manifest(args.dataset)
    print_prepare_summary(manifest)
    if args.verify:
        from freescale.pipeline.integrity import files_by_path, verify_all

        files = files_by_path(manifest)
        if files is None:
            raise ValueError(
                f"{args.dataset}: the manifest has no file table (prepared by an older FreeScale); "
                "re-run `freescale prepare --overwrite` to add it"
            )
        checked = verify_all(args.dataset, files)
        print(f"verified {len(files)} files ({checked:,} bytes): sizes and xxh64 hashes match the manifest")
    return 0
