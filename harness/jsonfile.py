"""The one way this harness writes JSON files another process may read at any moment."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path | str, obj: Any, *, indent: int = 1, sort_keys: bool = False) -> Path:
    """Write a temporary file then rename it: a reader (the controller polling rank files, a
    concurrent cell) never sees half a file. Used on ranks and in the controller alike."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=indent, sort_keys=sort_keys, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def read_json(path: Path | str, default: Any = None) -> Any:
    """The file's JSON, or ``default`` when it is missing or unreadable (a rank that died first)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default
