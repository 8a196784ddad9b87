"""Folders of image files as a source: one folder per class, or a labels file beside the images.

People who train Keras image models keep images as files: ``train/<class>/*.jpg`` (the layout of
``keras.utils.image_dataset_from_directory``), or a folder of files beside a CSV/Parquet table of
file names and labels. Each file is one row with the columns

- ``image``: the file's bytes, decoded on the worker like any encoded image column;
- ``path``: the file's path relative to the source;
- ``label``: its class folder's name, or, with a labels file, that file's columns (the label and any
  extra features) under their own names,

so validation, scatter, the hop's decoding and predict read an image folder like a Parquet source
of encoded images. Listing opens no image: a file's size and version (ETag or mtime) stand for its
bytes, as a Parquet file's do. What is wrong with the layout (a file outside any class folder, an
empty class folder, a labels row without its file, a file without a row) is found while listing,
kept in the listing and reported by validation with every other finding, in one error.
"""

from __future__ import annotations

import posixpath
from typing import Any, Iterator, Mapping

from mop_airflow.data.files import Batch, file_uri, path_of, version_of
from mop_airflow.errors import DataValidationError
from mop_airflow.records import SourceFile, SourceListing
from mop_airflow.store import open_filesystem

# Keras's list (image_dataset_from_directory); a GIF gives its first frame.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp")
IMAGE, PATH, LABEL = "image", "path", "label"
SHOWN = 5  # files named in a sentence before "..."


def is_image(path: str) -> bool:
    return path.lower().endswith(IMAGE_SUFFIXES)


def list_images(fs: Any, infos: Mapping[str, tuple[int, str]], base: str, *, uri: str, protocol: str,
                labels: Mapping[str, str] | None, folders: list[str], scoring: bool = False) -> SourceListing:
    """The listing of an image source: ``infos`` maps each image file's path to its size and version.

    ``folders`` are the folders directly below ``base`` (empty class folders show only there).
    With ``labels`` (``{"path", "file_column"}``) the labels file is read (it is small: one row
    per image) to check that files and rows match; the images themselves are not opened. A file
    without a label (outside any class folder, or without a row) is a layout problem and left
    out, so that no later check names it again, unless ``scoring`` (predict needs no label).
    """

    paths = sorted(infos)
    relative = [_relative(p, base) for p in paths]
    schema = {IMAGE: "binary", PATH: "string"}
    if labels is None:
        classes, problems = _class_folders(relative, folders)
        details = {"layout": "folders", "classes": classes, "problems": problems}
        schema[LABEL] = "string"
        labelled = ["/" in rel for rel in relative]
    else:
        table, labels_file = _read_labels(labels, base, protocol, fs)
        problems, rows = _labels_problems(table, labels, labels_file["uri"], relative)
        schema.update({f.name: str(f.type) for f in table.schema if f.name != labels["file_column"]
                       and f.name not in (IMAGE, PATH)})
        details = {"layout": "labels", "labels": labels_file, "problems": problems}
        labelled = [rel in rows for rel in relative]
    files = [SourceFile(uri=file_uri(protocol, p), rows=1, bytes=infos[p][0], version=infos[p][1])
             for p, ok in zip(paths, labelled) if ok or scoring]
    return SourceListing(uri=uri, format="images", files=files, schema=schema, base=file_uri(protocol, base),
                         images=details)


def layout_problems(listing: SourceListing, classes: tuple | list, role: str) -> list[str]:
    """The listing's layout problems, and class folders that declared ``classes`` leave out."""
    details = listing.images or {}
    where = f"{role} {listing.uri}: "
    problems = [where + p for p in details.get("problems", [])]
    if classes and details.get("layout") == "folders":
        declared = {str(c) for c in classes}
        for folder, count in details["classes"].items():
            if count == 0:
                continue  # an empty folder is a problem of its own
            if folder in declared and folder not in classes:
                problems.append(f"{where}class folder {folder!r} holds {count} image(s), but data.classes lists "
                                f"{folder!r} as a number, and a folder's name is text; declare the classes as "
                                f"strings, e.g. {[str(c) for c in list(classes)[:3]]}")
            elif folder not in declared:
                problems.append(f"{where}class folder {folder!r} holds {count} image(s), but data.classes "
                                f"{list(classes)} does not list it; add {folder!r} to data.classes, or move the "
                                "folder out of the source")
    return problems


def rows_named(listing: SourceListing, examples: list[tuple[int, int]], count: int) -> str:
    """Rows of an image source as files: row ``r`` of a batch starting at file ``f`` is file ``f + r``."""
    shown = [_relative_uri(listing, listing.files[f + r].uri) for f, r in examples]
    more = ", ..." if count > len(shown) else ""
    return f"file{'s' if count != 1 else ''} {', '.join(shown)}{more}"


def image_schema(listing: SourceListing, labels_table: Any = None, options: Mapping[str, Any] | None = None) -> Any:
    """The Arrow schema of an image source's rows (``labels_table``: its labels file, already read)."""
    import pyarrow as pa  # noqa: PLC0415

    fields = [pa.field(IMAGE, pa.binary()), pa.field(PATH, pa.string())]
    if listing.images["layout"] == "folders":
        return pa.schema([*fields, pa.field(LABEL, pa.string())])
    table = labels_table if labels_table is not None else _labels_table(listing, options)
    return pa.schema([*fields, *[f for f in table.schema if f.name in listing.schema and f.name not in (IMAGE, PATH)]])


def iter_image_batches(listing: SourceListing, columns: list[str] | None, *, batch_rows: int,
                       options: Mapping[str, Any] | None = None) -> Iterator:
    """Batches of ``batch_rows`` files in listing order; a file's bytes are read only for ``image``.

    A batch's ``file_index`` is its first file and each row is the next file, so the placement of
    row ``r`` (``offsets[file_index] + r``) is the file's own row number. On S3 a batch's files are
    fetched concurrently.
    """
    import pyarrow as pa  # noqa: PLC0415


    fs, _ = open_filesystem(listing.uri, options)
    by_path, table = None, None
    if listing.images["layout"] == "labels":
        table = _labels_table(listing, options)
        column = listing.images["labels"]["file_column"]
        paths = table[column].to_pylist() if column in table.column_names else []  # else: a layout problem
        by_path = {_clean(p): i for i, p in enumerate(paths) if p is not None}
    schema = image_schema(listing, table)
    wanted = pa.schema([schema.field(c) for c in (columns if columns is not None else schema.names)])
    for start in range(0, len(listing.files), batch_rows):
        files = listing.files[start:start + batch_rows]
        relative = [_relative_uri(listing, f.uri) for f in files]
        arrays = {}
        for name in wanted.names:
            if name == IMAGE:
                arrays[name] = pa.array(_read_files(fs, [path_of(f.uri) for f in files], listing), pa.binary())
            elif name == PATH:
                arrays[name] = pa.array(relative, pa.string())
            elif by_path is None:  # the class folder; None for a file outside any (a layout problem)
                arrays[name] = pa.array([r.split("/", 1)[0] if "/" in r else None for r in relative], pa.string())
            else:
                rows = pa.array([by_path.get(r) for r in relative], pa.int64())
                arrays[name] = table[name].take(rows)
        yield Batch(table=pa.table(arrays, schema=wanted), file=files[0], file_index=start, first_row=0)


# -- internals ---------------------------------------------------------------------------------
def _read_files(fs: Any, paths: list[str], listing: SourceListing) -> list[bytes]:
    found = fs.cat(paths, on_error="return")
    missing = [p for p in paths if isinstance(found.get(p), BaseException) or p not in found]
    if missing:
        raise DataValidationError(listing.uri, [
            f"{len(missing)} image file(s) were listed but cannot be read now ({', '.join(missing[:SHOWN])}); "
            "were they deleted or moved since the run listed its data? Rerun the run, whose list_data task "
            "lists the files again"])
    return [found[p] for p in paths]


def _class_folders(relative: list[str], folders: list[str]) -> tuple[dict[str, int], list[str]]:
    """Image count per class folder (sorted by name) and the layout's problems."""
    counts = {folder: 0 for folder in folders}
    outside = []
    for rel in relative:
        if "/" in rel:
            folder = rel.split("/", 1)[0]
            counts[folder] = counts.get(folder, 0) + 1
        else:
            outside.append(rel)
    problems = []
    if outside:
        problems.append(f"{len(outside)} image file(s) sit outside any class folder ({_names(outside)}); with one "
                        "folder per class every image sits in <source>/<class>/: move each into its class folder, "
                        "remove it, or give the labels in a labels file (data.labels)")
    empty = sorted(folder for folder, count in counts.items() if count == 0)
    if empty:
        problems.append(f"class folder(s) {_names(empty)} hold no image file ({', '.join(IMAGE_SUFFIXES)}); add "
                        "their images or remove the folders")
    return dict(sorted(counts.items())), problems


def _labels_location(labels: Mapping[str, str], base: str, protocol: str) -> str:
    """The labels file's URI: as given when it has a scheme, else relative to the source's folder."""
    path = labels["path"]
    if "://" in path:
        return path

    return file_uri(protocol, path if path.startswith("/") else posixpath.join(base, path))


def _read_labels(labels: Mapping[str, str], base: str, protocol: str, fs: Any) -> tuple[Any, dict]:

    uri = _labels_location(labels, base, protocol)
    try:
        info = fs.info(path_of(uri)) if uri.startswith(f"{protocol}://") else None
        table = _read_table(uri, fs if info is not None else None)
    except FileNotFoundError:
        raise DataValidationError(uri, [f"data.labels: the labels file {uri} does not exist; put it beside the "
                                        "images (a path relative to the source) or give its full path"]) from None
    except Exception as exc:  # noqa: BLE001 - a corrupt labels file is a data problem
        raise DataValidationError(uri, [f"data.labels: {uri} cannot be read ({type(exc).__name__}: "
                                        f"{str(exc)[:200]}); write it as CSV with a header row, or as Parquet"]) from exc
    described = {"uri": uri, "file_column": labels["file_column"], "rows": table.num_rows,
                 "bytes": int((info or {}).get("size") or 0), "version": version_of(info or {})}
    return table, described


def _read_table(uri: str, fs: Any = None) -> Any:
    import pyarrow.csv as pa_csv  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415


    if fs is None:
        fs, _ = open_filesystem(uri)
    with fs.open(path_of(uri), "rb") as handle:
        if uri.lower().endswith(".csv"):
            return pa_csv.read_csv(handle)
        return pq.read_table(handle)


def _labels_table(listing: SourceListing, options: Mapping[str, Any] | None) -> Any:

    uri = listing.images["labels"]["uri"]
    same = uri.startswith(listing.base.split("://", 1)[0] + "://") if listing.base else False
    fs = open_filesystem(listing.uri, options)[0] if same else None
    return _read_table(uri, fs)


def _labels_problems(table: Any, labels: Mapping[str, str], uri: str,
                     relative: list[str]) -> tuple[list[str], dict[str, int]]:
    """Rows and files that do not match one to one, and columns that would shadow ``image``/``path``;
    and the row of each file that has one."""
    column = labels["file_column"]
    name = uri.rsplit("/", 1)[-1]
    if column not in table.column_names:
        return [f"labels file {name} has no column {column!r} (it has {', '.join(map(repr, table.column_names[:12]))}); "
                f"name the column of image paths: data.labels = {{'path': {labels['path']!r}, 'file_column': "
                "'<column>'}"], {}
    problems = []
    clashes = [c for c in table.column_names if c in (IMAGE, PATH) and c != column]
    if clashes:
        problems.append(f"labels file {name} has column(s) {clashes}, a name every image source gives its own "
                        "columns (the bytes and the relative path); rename them in the labels file")
    listed = set(relative)
    rows = [_clean(p) if p is not None else None for p in table[column].to_pylist()]
    seen: dict[str, int] = {}
    unknown, repeated = [], []
    for i, path in enumerate(rows):
        if path is None or path not in listed:
            unknown.append(i)
        elif path in seen:
            repeated.append(path)
        else:
            seen[path] = i
    if unknown:
        shown = ", ".join(f"row {i} ({rows[i]!r})" for i in unknown[:SHOWN]) + (", ..." if len(unknown) > SHOWN else "")
        problems.append(f"labels file {name}: {len(unknown)} row(s) name an image file the source does not have "
                        f"({shown}, rows counted from 0); paths are relative to the source: add the files, fix the "
                        "paths or remove the rows")
    if repeated:
        problems.append(f"labels file {name}: {len(repeated)} image file(s) have more than one row "
                        f"({_names(sorted(set(repeated)))}); keep one row per file")
    without = [r for r in relative if r not in seen]
    if without:
        problems.append(f"{len(without)} image file(s) have no row in the labels file {name} ({_names(without)}); "
                        f"add a row for each (column {column!r} holds the path relative to the source) or remove "
                        "the files")
    return problems, seen


def _clean(path: str) -> str:
    """A labels file's path as the listing writes it: relative, with forward slashes."""
    path = str(path).replace("\\", "/")
    while path.startswith("./"):
        path = path[2:]
    return path.lstrip("/")


def _relative(path: str, base: str) -> str:
    return path[len(base):].lstrip("/") if base and path.startswith(base) else posixpath.basename(path)


def _relative_uri(listing: SourceListing, uri: str) -> str:
    base = listing.base or ""
    return uri[len(base):].lstrip("/") if base and uri.startswith(base) else uri.rsplit("/", 1)[-1]


def _names(items: list[str]) -> str:
    return ", ".join(items[:SHOWN]) + (", ..." if len(items) > SHOWN else "")
