"""The rows a board reads from a track's run records, kept between rebuilds: a file derived from the records alone.

Parsing every run.json is most of a board's rebuild at event size (10,000 records of 5-20 kB: about a second of
JSON), though a record never changes once its run has ended. The index keeps each record's row under the record's
path and its identity on disk (inode, size, modification and change times: a rewrite is a rename onto a new inode,
an edit moves the change time, which no user can set back), and a rebuild parses only the records whose identity
is not in it. It lives beside the boards it serves (`<leaderboard dir>/.rows/<track>.json`); deleting it costs one
slow rebuild and changes nothing else.

A row read from the index is checked as a record's fields are (leaderboard.field_problem). Values of the right type
cannot be told from true ones, so an index team code could have written is not kept: the record guard removes an
index that changed while a run trained, and a run whose code ran without the sandbox removes it at its end (the next
rebuild reads every record). An index that cannot be read, or of another version, is ignored and written again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from harness.results.records import write_atomic

INDEX_VERSION = 1
INDEX_MAX_BYTES = 256 << 20  # about 1 kB a row: room for 200,000 runs, and a bound on a planted file
Key = tuple[int, int, int, int]


def index_path(leaderboard_dir: Path, track: str) -> Path:
    return Path(leaderboard_dir) / ".rows" / f"{track}.json"


def identity(path: str | Path) -> Key | None:
    """A run.json's identity on disk; None where it cannot be looked at (the record reader then says why)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read_index(path: Path, root: Path, fields: str) -> dict[str, tuple[Key, dict[str, Any]]]:
    """The index's rows by record path (relative to the runs folder), each with the identity it was read at;
    empty when there is no usable index for this runs folder and these row fields (`fields`: what a row holds,
    which a newer harness may change)."""
    from harness.submission.files import read_regular

    try:
        data = json.loads(read_regular(path, INDEX_MAX_BYTES))
    except (OSError, ValueError, RecursionError):  # none yet, unreadable, too large, not JSON, nested past
        return {}                                   # the parser's depth: rebuilt from the records
    if not isinstance(data, dict) or data.get("version") != INDEX_VERSION or data.get("root") != str(root) \
            or data.get("fields") != fields:
        return {}
    out: dict[str, tuple[Key, dict[str, Any]]] = {}
    entries = data.get("rows")
    for rel, entry in (entries.items() if isinstance(entries, dict) else ()):
        if (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], list) and len(entry[0]) == 4
                and all(type(v) is int for v in entry[0]) and isinstance(entry[1], dict)):
            out[rel] = (tuple(entry[0]), entry[1])  # type: ignore[assignment]
    return out


def write_index(path: Path, root: Path, fields: str, rows: dict[str, tuple[Key, dict[str, Any]]]) -> None:
    """Writes the index atomically; a folder that cannot be written leaves the board without it (slower, not wrong)."""
    text = json.dumps({"version": INDEX_VERSION, "root": str(root), "fields": fields,
                       "rows": {rel: [list(key), row] for rel, (key, row) in rows.items()}}, separators=(",", ":"))
    try:
        write_atomic(path, text)
    except OSError:
        pass


def drop_index(leaderboard_dir: Path, track: str) -> None:
    """Removes the track's index (the next rebuild reads every record): after a run whose team code ran without
    the sandbox, or an index changed while a run trained (harness/launcher/control/guard.py)."""
    try:
        index_path(leaderboard_dir, track).unlink()
    except IsADirectoryError:
        import shutil

        shutil.rmtree(index_path(leaderboard_dir, track), ignore_errors=True)
    except OSError:
        pass
