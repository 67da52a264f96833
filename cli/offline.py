"""``tdreplay export --root DIR | --checkpoint DIR``: export a table without a server.

From a data root, the table's own files are read when it has them (a memmap
table, with every row a server acknowledged), else its checkpoint
``<root>/checkpoints/<table>``. The root is locked meanwhile, as a server locks
it, so this never reads a root a running server holds: export through that
server instead. A checkpoint folder is restored into a scratch folder beside
the output file (bit for bit, with nothing read able to run code; see
:meth:`tdreplay.storage.Table.restore`), exported, and deleted.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from tdreplay.service.cli import CommandError, Exit
from tdreplay.storage import (
    CheckpointError,
    RootLocked,
    Table,
    find_checkpoint,
    lock_root,
    read_checkpoint_metadata,
    stored_specs,
)

from .common import describe_file, export_format, show_progress


def export(args: dict[str, Any]) -> None:
    """Export ``args["table"]`` from ``args["root"]`` or ``args["checkpoint"]`` to ``args["output"]``."""
    if not args.get("output"):
        raise CommandError("offline, the export goes to a file here: -o FILE", Exit.USAGE)
    if args.get("on_server"):
        raise CommandError("--on-server needs a server, not --root/--checkpoint", Exit.USAGE)
    output = Path(args["output"])
    fmt = export_format(args.get("format"), args["output"])
    progress = show_progress(args)
    if args.get("checkpoint"):
        source = Path(args["checkpoint"])
        name = from_checkpoint(source, args.get("table"), output, fmt, progress)
    else:
        if not args.get("table"):
            raise CommandError("which table? tdreplay export TABLE --root DIR", Exit.USAGE)
        name, source = (
            args["table"],
            from_root(Path(args["root"]), args["table"], output, fmt, progress),
        )
    print(f"exported table {name!r} from {source} to {output} ({describe_file(output, fmt)})")


def from_root(root: Path, table: str, output: Path, fmt: str, progress: bool) -> Path:
    """Export ``table`` of the data root ``root``; returns what it was read from."""
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
            opened = Table.open(specs[table], root)
            try:
                opened.export(output, format=fmt, progress=progress)
            finally:
                opened.close()
            return root / "tables" / table
        checkpoint = root / "checkpoints" / table
        try:
            find_checkpoint(checkpoint)
        except CheckpointError:
            raise CommandError(
                f"no table {table!r} under {str(root)!r}: neither its files "
                f"(tables: {sorted(specs) or 'none'}) nor a checkpoint checkpoints/{table}"
            ) from None
        from_checkpoint(checkpoint, table, output, fmt, progress)
        return checkpoint


def from_checkpoint(path: Path, table: str | None, output: Path, fmt: str, progress: bool) -> str:
    """Export the table the checkpoint at ``path`` holds; returns its name."""
    meta = read_checkpoint_metadata(path)
    spec = meta.get("spec") if isinstance(meta.get("spec"), dict) else {}
    held = spec.get("name")
    if table and held != table:
        raise CommandError(f"the checkpoint at {str(path)!r} holds table {held!r}, not {table!r}")
    backend = spec.get("backend")
    if isinstance(backend, dict) and backend.get("kind") == "redis":
        raise CommandError(
            f"the checkpoint at {str(path)!r} is of a Redis table: restoring it needs its "
            "Redis; export it through a server (tdreplay export TABLE -o FILE --url URL)"
        )
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output.parent, prefix=".tdreplay-export-") as scratch:
        restored = Table.restore(path, root=scratch)
        try:
            restored.export(output, format=fmt, progress=progress)
        finally:
            restored.destroy()
    return str(held)
