"""What every reader of files shares: a batch of rows and where it came from, and our URIs' paths.

The source listing (:mod:`.source`) and the image reader (:mod:`.images`) both use these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from mop_airflow.records import SourceFile


@dataclass(frozen=True)
class Batch:
    """One record batch and where it came from: the file and the row number of its first row in it.

    For an image source each row is a file: row ``r`` comes from file ``file_index + r``.
    """

    table: Any  # pyarrow.Table
    file: SourceFile
    file_index: int
    first_row: int


def version_of(info: Mapping[str, Any]) -> str:
    for key in ("ETag", "etag", "mtime", "LastModified", "last_modified", "created"):
        if info.get(key) is not None:
            return str(info[key]).strip('"')
    return ""


def file_uri(protocol: str, path: str) -> str:
    if protocol == "file":
        return "file://" + path if path.startswith("/") else "file:///" + path
    return f"{protocol}://{path.lstrip('/')}"


def path_of(uri: str) -> str:
    """The filesystem path of one of our URIs (what pyarrow wants beside an fsspec filesystem)."""
    scheme, rest = uri.split("://", 1)
    return "/" + rest.lstrip("/") if scheme == "file" else rest
