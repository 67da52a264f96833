"""The ``tdreplay`` commands that drive a running server, through the public client.

A program, not library code: it uses :class:`tdreplay.client.ReplayClient` as
a user's script would, and nothing in the service imports it. The arguments are those of
:func:`tdreplay.cli.add_remote_commands`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
from tqdm import tqdm

from tdreplay import schemas
from tdreplay.client import (
    Forbidden,
    ReplayClient,
    ServerError,
    TableNotFound,
    TransportError,
    Unauthorized,
)
from tdreplay.client.environment import configured
from tdreplay.client.transport import shown_url
from tdreplay.codec.errors import SchemaError
from tdreplay.codec.exports import export_format
from tdreplay.codec.parquet_read import parquet_files
from tdreplay.codec.protocol import MAX_BATCH_BYTES, import_batch_bytes, import_chunk
from tdreplay.codec.schema_file import read_schema
from tdreplay.codec.text import printable

from .common import (
    describe_counts,
    describe_file,
    flag_values,
    kept,
    minari_flags,
    minari_id,
    replacing,
    show_progress,
)
from .exits import CommandError, Exit, failure


def run(command: str, args: dict[str, Any]) -> None:
    """Run ``command`` against the server of ``args`` (``--url``, token, ``--timeout``)."""
    handler = COMMANDS[command]
    with connect(args) as client:
        handler(client, args)


# ---------------------------------------------------------------- connecting
def configured_from(args: dict[str, Any]) -> tuple[tuple[str, ...], str | None]:
    """The server(s) and token: ``--url`` / ``--token-file``, else the environment's, as
    every client reads it (:func:`tdreplay.client.environment.configured`)."""
    try:
        return configured(args.get("url") or None, None, token_file=args.get("token_file"))
    except ValueError as err:  # the messages never quote the token
        raise CommandError(str(err), Exit.USAGE) from None


@contextmanager
def connect(args: dict[str, Any]) -> Iterator[ReplayClient]:
    """A client of the server(s) of ``args``; its refused token and its lack of an answer
    become :class:`CommandError` (exit 4, 3: they name the URL); an operation's error goes
    on to :func:`~.exits.run_command`, the one place that prints it (exit 1)."""
    urls, token = configured_from(args)
    where = ", ".join(shown_url(u) for u in urls)  # a user:password@ in one is never shown
    timeout = args.get("timeout", 600.0)
    try:
        client = ReplayClient(urls, token, timeout=timeout)
    except ValueError as err:  # the client's own check of a URL or of the timeout
        raise CommandError(f"{err} (--url {where!r}, --timeout {timeout})", Exit.USAGE) from None
    try:
        with client:
            yield client
    except (Unauthorized, Forbidden) as err:
        hint = "" if token else " (no token given: set TDREPLAY_TOKEN or --token-file)"
        raise CommandError(
            f"{where} refused: {err}{hint}{_noted(err)}", Exit.UNAUTHORIZED
        ) from None
    except TransportError as err:
        raise CommandError(
            f"no answer from {where}: {err}. Is the server running there? "
            f"(--url URL or TDREPLAY_URL){_noted(err)}",
            Exit.UNREACHABLE,
        ) from None


def _noted(err: BaseException) -> str:
    """What an import wrote before ``err`` (its note, :func:`tdreplay.client.datasets`'s),
    for the one line the command prints; ``""`` for an error without that note."""
    notes = [n for n in getattr(err, "__notes__", []) if "rows were written" in n]
    return f"; {notes[-1]}" if notes else ""


# ---------------------------------------------------------------- commands
def tables(client: ReplayClient, args: dict[str, Any]) -> None:
    listed = client.tables()
    if args.get("json"):
        print(json.dumps(listed, indent=2, default=str))
        return
    if not listed:
        print("no tables")
        return
    rows = [("TABLE", "BACKEND", "SIZE", "CAPACITY", "SAMPLER")]
    for info in listed:  # what the server sent, shown with its control characters escaped
        rows.append(
            tuple(
                printable(str(cell))
                for cell in (
                    info.get("name"),
                    _kind(info.get("backend")),
                    info.get("size"),
                    info.get("capacity"),
                    _kind(info.get("sampler")),
                )
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())


def _kind(part: Any) -> Any:
    return part.get("kind", part) if isinstance(part, dict) else part


def info(client: ReplayClient, args: dict[str, Any]) -> None:
    print(json.dumps(client.info(args["table"]), indent=2, default=str))


def load_schema(name: str, backend: str | None) -> dict[str, Any]:
    """A schema file (or a shipped schema's name) as the mapping ``POST /v1/tables`` takes."""
    path = schemas.resolve(name)
    try:
        spec = read_schema(path)
    except SchemaError as err:
        hint = "" if path.is_file() else f" (shipped schemas: {', '.join(schemas.names())})"
        raise CommandError(f"{err}{hint}") from None
    if backend:
        spec["backend"] = {"kind": backend}
    return spec


def create(client: ReplayClient, args: dict[str, Any]) -> None:
    rename = args.get("name")
    if rename is not None and len(args["schemas"]) != 1:
        raise CommandError("--name names one table: give one SCHEMA with it", Exit.USAGE)
    for name in args["schemas"]:
        spec = load_schema(name, args.get("backend"))
        if rename is not None:  # the server checks the name, as every table name
            spec["name"] = rename
        made = client.create_table(spec)
        print(
            f"created table {made.get('name')!r}: capacity {made.get('capacity')}, "
            f"backend {_kind(made.get('backend'))}"
        )


def confirm(args: dict[str, Any], question: str, doing: str, refused: str) -> None:
    """Go on with ``--yes``, or when the user answers yes to ``question`` on a terminal.

    Raises:
        CommandError: no terminal to ask on (exit 2: ``doing`` needs --yes), or any
            answer but yes - the end of input (Ctrl-D) too - (``refused``).
    """
    if args.get("yes"):
        return
    if not sys.stdin.isatty():
        raise CommandError(f"{doing} needs --yes", Exit.USAGE)
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        answer = ""
        print(file=sys.stderr)  # end the question's line
    if answer.strip().lower() not in ("y", "yes"):
        raise CommandError(refused)


def drop(client: ReplayClient, args: dict[str, Any]) -> None:
    table = args["table"]
    confirm(
        args,
        f"delete table {table!r} and all its data?",
        f"deleting table {table!r}",
        "not deleted",
    )
    client.delete_table(table)
    print(f"deleted table {table!r}")


def clear(client: ReplayClient, args: dict[str, Any]) -> None:
    table = args["table"]
    confirm(
        args, f"delete every row of table {table!r}?", f"emptying table {table!r}", "not emptied"
    )
    client.clear(table)
    print(f"emptied table {table!r}")


def checkpoint(client: ReplayClient, args: dict[str, Any]) -> None:
    table = args["table"]
    written = client.checkpoint(table, args.get("path") or f"checkpoints/{table}")
    for path in [written] if isinstance(written, str) else written:
        print(
            f"checkpointed table {table!r} to {printable(str(path))} (under the server's data root)"
        )


def restore(client: ReplayClient, args: dict[str, Any]) -> None:
    table = args["table"]
    path = args.get("path") or f"checkpoints/{table}"
    restored = client.restore(table, path)
    print(f"restored table {table!r} from {path}: {restored.get('size')} rows")


def dump(client: ReplayClient, args: dict[str, Any]) -> None:
    table, folder = args["table"], Path(args["folder"])
    with spinner(args, f"dump {table}"):
        client.dump(table, folder)
    print(f"dumped table {table!r} to {folder} (its rows and state; `tdreplay load` restores it)")


def load(client: ReplayClient, args: dict[str, Any]) -> None:
    table, folder = args["table"], args["folder"]
    with spinner(args, f"load {table}"):
        restored = client.load(table, folder)
    print(f"loaded table {table!r} from {folder}: {restored.get('size')} rows")


def export(client: ReplayClient, args: dict[str, Any]) -> None:
    table = args.get("table")
    if not table:
        raise CommandError("which table? (export TABLE, or --checkpoint DIR offline)", Exit.USAGE)
    output, on_server = args.get("output"), args.get("on_server")
    if args.get("format") == "minari":
        export_minari(client, table, args)
        return
    if bool(output) == bool(on_server):
        raise CommandError("give one of -o FILE (here) or --on-server PATH", Exit.USAGE)
    if on_server:
        with flag_values():
            chosen = export_format(on_server, args.get("format"))
        written = client.export(table, chosen, path=on_server)
        print(
            f"exported table {table!r} to {printable(str(written))} "
            f"(under the server's data root){describe_counts(written)}"
        )
        return
    dest = Path(str(output))
    # a folder names no format: the client refuses it, saying so, before any transfer
    given = args.get("format")
    with flag_values():
        fmt = given if dest.is_dir() else export_format(dest, given)
    with kept(dest, args):
        written = client.export(
            table, fmt, dest=dest, progress=show_progress(args), replace=replacing(args)
        )
    shown = describe_file(dest, str(fmt))
    print(f"exported table {table!r} to {dest} ({shown}){describe_counts(written)}")


def export_minari(client: ReplayClient, table: str, args: dict[str, Any]) -> None:
    dataset_id, env_spec = minari_flags(args)  # as offline: a bad value is usage (exit 2)
    on_server = args.get("on_server")
    if on_server and args.get("output"):
        raise CommandError("give one of -o DATASETS_ROOT (here) or --on-server PATH", Exit.USAGE)
    where = client.export(
        table,
        "minari",
        path=on_server,
        dest=args.get("output"),
        dataset_id=dataset_id,
        env_spec=env_spec,
        progress=show_progress(args),
    )
    shown = f"{where} (under the server's data root)" if on_server else str(where)
    print(
        f"exported table {table!r} as the Minari dataset {dataset_id!r} to {shown}"
        f"{describe_counts(where)}"
    )


@contextmanager
def spinner(args: dict[str, Any], desc: str) -> Iterator[None]:
    """A bar that shows the command is still at work (the server sends no progress)."""
    bar = tqdm(
        desc=desc, total=None, bar_format="{desc}: {elapsed}", disable=not show_progress(args)
    )
    try:
        yield
    finally:
        bar.close()


def import_(client: ReplayClient, args: dict[str, Any]) -> None:
    table = args["table"]
    with flag_values(chunk="--chunk", max_batch_bytes="--max-batch-bytes"):
        chunk = import_chunk(args["chunk"])  # the rule of every door; a bad flag is usage
        import_batch_bytes(args.get("max_batch_bytes", MAX_BATCH_BYTES))
    try:
        print(_import(client, table, chunk, args))
    except (Unauthorized, Forbidden, TransportError):
        raise  # connect()'s: a refused token (exit 4), no server (3), with the rows written
    except ServerError as err:
        missing = (
            f": an import extends a table that exists; create it first (tdreplay create "
            f"SCHEMA --name {table})"
            if isinstance(err, TableNotFound)
            else ""
        )
        raise CommandError(f"{failure(err)}{missing}; {_written(err)}") from None
    except (OSError, pa.ArrowException) as err:  # a file that fails to read past its checks
        # (after the client's own errors: a lost connection or a refused token is an
        # OSError too, and is no file's fault)
        source = "the Minari dataset" if args.get("format") == "minari" else "Parquet"
        raise CommandError(f"cannot read {source}: {err}; {_written(err)}") from None


def _import(client: ReplayClient, table: str, chunk: int, args: dict[str, Any]) -> str:
    """Run the import ``args`` ask for; returns the line that says what it wrote."""
    if args.get("format") == "minari":
        dataset_id = minari_id(args)
        written = client.import_dataset(
            table,
            dataset_id,
            root=args.get("source"),
            chunk=chunk,
            progress=show_progress(args),
            max_batch_bytes=args.get("max_batch_bytes", MAX_BATCH_BYTES),
        )
        return (
            f"imported {written} rows into table {table!r} from the Minari dataset {dataset_id!r}"
        )
    if not args.get("source"):
        raise CommandError("which Parquet file or folder? tdreplay import TABLE SOURCE", Exit.USAGE)
    columns = column_map(args.get("map") or [])
    files = parquet_files(table, args["source"])
    written = client.import_parquet(
        table,
        args["source"],
        columns=columns,
        ignore_extra=args.get("ignore_extra", False),
        chunk=chunk,
        progress=show_progress(args),
        max_batch_bytes=args.get("max_batch_bytes", MAX_BATCH_BYTES),
    )
    return f"imported {written} rows into table {table!r} from {len(files)} file(s)"


def _written(err: BaseException) -> str:
    """How many rows an import wrote before ``err`` (its note, else none)."""
    return _noted(err)[2:] or "0 rows were written"


def column_map(pairs: list[str]) -> dict[str, str]:
    """``--map FIELD=COLUMN`` pairs as ``{field: column}``."""
    out = {}
    for pair in pairs:
        field, sep, column = pair.partition("=")
        if not sep or not field or not column:
            raise CommandError(f"--map takes FIELD=COLUMN, got {pair!r}", Exit.USAGE)
        out[field] = column
    return out


COMMANDS = {
    "tables": tables,
    "info": info,
    "create": create,
    "drop": drop,
    "clear": clear,
    "checkpoint": checkpoint,
    "restore": restore,
    "dump": dump,
    "load": load,
    "export": export,
    "import": import_,
}
