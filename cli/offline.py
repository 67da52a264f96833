"""``tdreplay export --root DIR | --checkpoint DIR``: export a table without a server.

From a data root, the table's own files are read when it has them (a memmap
table, with every row a server acknowledged), else its checkpoint
``<root>/checkpoints/<table>``. The root is locked meanwhile, as a server locks
it, so this never reads a root a running server holds: export through that
server instead. A checkpoint folder is exported straight from its files
(:func:`tdreplay.storage.export_checkpoint`: read as a restore reads it, with
nothing read able to run code, into the very file the table's own export writes):
what it loads follows the rows the checkpoint holds, not the capacity it declares.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from tdreplay.codec.exports import ExportedPath, export_format
from tdreplay.codec.folders import made_for
from tdreplay.codec.minari_files import dataset_folder, default_root, write_minari
from tdreplay.storage import (
    MAX_TABLE_BYTES,
    CheckpointError,
    RootLocked,
    Table,
    TableSpec,
    check_table_bytes,
    export_checkpoint,
    find_checkpoint,
    lock_root,
    read_checkpoint_metadata,
    stored_specs,
)

from .common import (
    describe_counts,
    describe_file,
    flag_values,
    kept,
    minari_flags,
    replacing,
    show_progress,
)
from .exits import CommandError, Exit


def export(args: dict[str, Any]) -> None:
    """Export ``args["table"]`` from ``args["root"]`` or ``args["checkpoint"]`` to ``args["output"]``."""
    if args.get("format") == "minari":
        export_minari(args)
        return
    if not args.get("output"):
        raise CommandError("offline, the export goes to a file here: -o FILE", Exit.USAGE)
    if args.get("on_server"):
        raise CommandError("--on-server needs a server, not --root/--checkpoint", Exit.USAGE)
    output = Path(args["output"])
    limit = max_table_bytes(args)
    with flag_values():
        fmt = export_format(output, args.get("format"))
    progress = show_progress(args)
    if not args.get("checkpoint") and not args.get("table"):
        raise CommandError("which table? tdreplay export TABLE --root DIR", Exit.USAGE)
    with kept(output, args):  # a file at -o FILE: refused before anything is opened
        if args.get("checkpoint"):
            source = Path(args["checkpoint"])
            name, written = from_checkpoint(
                source, args.get("table"), output, fmt, progress, limit, replacing(args)
            )
        else:
            name = args["table"]
            source, written = from_root(
                Path(args["root"]), name, output, fmt, progress, limit, replacing(args)
            )
    shown = describe_file(output, fmt)
    print(f"exported table {name!r} from {source} to {output} ({shown}){describe_counts(written)}")


def export_minari(args: dict[str, Any]) -> None:
    """``--format minari``: a Parquet export in scratch beside the datasets root's dataset,
    converted by :func:`tdreplay.codec.minari_files.write_minari` (what the client and the
    server use too)."""
    dataset_id, env_spec = minari_flags(args)
    if args.get("on_server"):
        raise CommandError("--on-server needs a server, not --root/--checkpoint", Exit.USAGE)
    with flag_values():  # minari missing: the format asks for it
        datasets = Path(args["output"]) if args.get("output") else default_root()
    if dataset_folder(datasets, dataset_id).exists():  # before the export, not after
        raise CommandError(f"a dataset {dataset_id!r} exists under {str(datasets)!r}")
    progress = show_progress(args)
    limit = max_table_bytes(args)
    with (
        made_for(datasets),  # gone again, with its parents made here, if the export fails
        tempfile.TemporaryDirectory(dir=datasets, prefix=".tdreplay-export-") as scratch,
    ):
        rows = Path(scratch) / "rows.parquet"
        if args.get("checkpoint"):
            source = Path(args["checkpoint"])
            name, written = from_checkpoint(
                source, args.get("table"), rows, "parquet", progress, limit
            )
        else:
            if not args.get("table"):
                raise CommandError("which table? tdreplay export TABLE --root DIR", Exit.USAGE)
            name = args["table"]
            source, written = from_root(Path(args["root"]), name, rows, "parquet", progress, limit)
        folder = write_minari(rows, datasets, dataset_id, env_spec=env_spec, progress=progress)
    # the rows the table's export wrote and left out, the splits of the dataset made of them
    counts = ExportedPath.of(
        folder, rows=written.rows, skipped=written.skipped, splits=folder.splits
    )
    print(
        f"exported table {name!r} from {source} as the Minari dataset {dataset_id!r} to {folder}"
        f"{describe_counts(counts)}"
    )


def max_table_bytes(args: dict[str, Any]) -> int:
    """``--max-table-bytes``: the largest table an offline export opens, and the most of a
    checkpoint it loads (its rows and written slots: what it holds, not what it declares)."""
    limit = args.get("max_table_bytes", MAX_TABLE_BYTES)
    if limit < 1:
        raise CommandError(f"--max-table-bytes is {limit}: it takes a size >= 1", Exit.USAGE)
    return int(limit)


def from_root(
    root: Path,
    table: str,
    output: Path,
    fmt: str,
    progress: bool,
    limit: int,
    replace: bool = True,
) -> tuple[Path, ExportedPath]:
    """Export ``table`` of the data root ``root`` (``replace``: a file at ``output`` may
    be replaced); returns what it was read from and what the export wrote."""
    if not root.is_dir():
        raise CommandError(f"no data root at {str(root)!r}")
    try:
        lock = lock_root(root)
    except RootLocked as err:
        raise CommandError(
            f"{err}. To export from the server that holds it: "
            f"tdreplay export {table} -o FILE --url URL"
        ) from None
    with lock:
        failed: dict[str, str] = {}
        specs = {s.name: s for s in stored_specs(root, failed)}
        if table in failed:
            raise CommandError(f"table {table!r} under {root}: {failed[table]}")
        if table in specs:
            check_table_bytes(specs[table], limit)
            opened = Table.open(specs[table], root)
            try:
                written = opened.export(output, format=fmt, progress=progress, replace=replace)
            finally:
                opened.close()
            return root / "tables" / table, written
        checkpoint = root / "checkpoints" / table
        try:
            find_checkpoint(checkpoint)
        except CheckpointError:
            raise CommandError(
                f"no table {table!r} under {str(root)!r}: neither its files "
                f"(tables: {sorted(specs) or 'none'}) nor a checkpoint checkpoints/{table}"
            ) from None
        got = from_checkpoint(checkpoint, table, output, fmt, progress, limit, replace)
        return checkpoint, got[1]


def from_checkpoint(
    path: Path,
    table: str | None,
    output: Path,
    fmt: str,
    progress: bool,
    limit: int,
    replace: bool = True,
) -> tuple[str, ExportedPath]:
    """Export the table the checkpoint at ``path`` holds, straight from its files (no
    table is built: :func:`tdreplay.storage.export_checkpoint`), loading no more than
    ``limit`` bytes of it (its rows and the state of its written slots, refused before a
    row is read; ``replace``: a file at ``output`` may be replaced); returns its name and
    what the export wrote."""
    meta = read_checkpoint_metadata(path)
    spec = meta.get("spec") if isinstance(meta.get("spec"), dict) else {}
    held = spec.get("name")
    if table and held != table:
        raise CommandError(f"the checkpoint at {str(path)!r} holds table {held!r}, not {table!r}")
    # a Redis table's checkpoint holds its rows: no Redis is needed to export it
    # a spec missing or malformed is the read's to refuse, naming the checkpoint's file
    declared = TableSpec.parse(spec, source=f"{path}/metadata.json") if spec else None
    output.parent.mkdir(parents=True, exist_ok=True)
    written = export_checkpoint(
        path, output, format=fmt, progress=progress, replace=replace, expect=declared, limit=limit
    )
    return str(held), written
