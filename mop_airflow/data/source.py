"""Where the data is: a file, a folder, a glob or an ``s3://`` prefix of Parquet or CSV files, or of
image files (:mod:`.images`: one row per file).

A source is resolved once into a :class:`~mop_airflow.records.SourceListing`: every file with its
size, its version (ETag or mtime) and its row count, and the schema all files share. The listing,
not the bytes, decides whether existing shards are reused, so no process ever hashes the data set.
Reading goes one record batch at a time, so memory is bounded by the batch, never by the source.
"""

from __future__ import annotations

import dataclasses
import posixpath
from typing import Any, Iterator, Mapping

from mop_airflow.data.images import IMAGE_SUFFIXES, image_schema, is_image, iter_image_batches, list_images
from mop_airflow.data.files import Batch, file_uri, path_of, version_of
from mop_airflow.errors import DataValidationError
from mop_airflow.records import SourceFile, SourceListing
from mop_airflow.store import open_filesystem

PARQUET_SUFFIXES = (".parquet", ".pq")
CSV_SUFFIXES = (".csv",)
_GLOB_CHARS = "*?["


def file_format(path: str) -> str | None:
    lower = path.lower().split("?")[0]
    if lower.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if lower.endswith(CSV_SUFFIXES):
        return "csv"
    return None


def source_options(data: Any, options: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The fsspec options that open the data: ``options`` as the caller resolved them (the Airflow side
    adds a ``data.conn_id`` connection's keys), else the spec's own ``data.storage_options``."""
    return data.storage_options if options is None else options


def list_source(uri: str, options: Mapping[str, Any] | None = None, *,
                role: str = "data.source", labels: Mapping[str, str] | None = None,
                scoring: bool = False) -> SourceListing:
    """Resolve ``uri`` into its files, their row counts and their common schema.

    Reads only the Parquet footers (and, for CSV, streams each file once to count its rows); image
    files are listed, not opened (``labels``: ``DataSpec.labels``, for a labels file beside them;
    ``scoring``: images need no label, so none is left out for breaking the layout).
    Raises :class:`DataValidationError` for a path that matches nothing, mixed formats, unreadable
    files or files whose schemas disagree, naming the files.
    """
    fs, root = _fs_or_error(uri, options, role)
    try:
        infos, base = _expand(fs, root)
        folders = _folders(fs, root) if any(is_image(p) for p in infos) and labels is None else []
    except Exception as exc:  # noqa: BLE001 - permissions, network, bad bucket: all a data problem here
        raise DataValidationError(uri, [f"{role}: the path cannot be listed ({type(exc).__name__}: {exc}); "
                                        "check the path, data.storage_options and data.conn_id"]) from exc
    images = {p: info for p, info in infos.items() if is_image(p)}
    if images:
        tables = [p for p in infos if not is_image(p) and not (labels and p.endswith("/" + labels["path"].lstrip("./")))]
        if tables:
            raise DataValidationError(uri, [
                f"{role}: mixes image files and tables (e.g. {file_uri(_protocol(fs), tables[0])}); keep the images "
                "in a folder of their own, or, if that table is the labels file, name it with data.labels"])
        return list_images(fs, images, base, uri=uri, protocol=_protocol(fs), labels=labels, folders=folders,
                           scoring=scoring)
    paths = list(infos)
    if paths and labels:
        raise DataValidationError(uri, [
            f"{role}: data.labels={labels['path']!r} names a labels file for a folder of images, but {uri} holds "
            "tables; remove data.labels (a table's label is a column), or point the source at the images"])
    if not paths:
        raise DataValidationError(uri, [
            f"{role}: no .parquet, .pq or .csv files at {uri}, and no images ({', '.join(IMAGE_SUFFIXES)}); point it "
            "at a file, a folder holding such files, a glob such as '/data/part-*.parquet' or an s3:// prefix"])
    formats = {file_format(p) for p in paths}
    if len(formats) > 1:
        examples = {f: next(p for p in paths if file_format(p) == f) for f in formats}
        raise DataValidationError(uri, [
            f"{role}: mixes Parquet and CSV files (e.g. {examples['parquet']} and {examples['csv']}); "
            "keep one format per source"])
    fmt = formats.pop()
    protocol = _protocol(fs)
    files, failures, schemas = [], [], {}
    for path in paths:
        info = fs.info(path)
        try:
            schema, rows = _schema_and_rows(fs, path, fmt)
        except Exception as exc:  # noqa: BLE001 - a corrupt or unreadable file is a data problem
            failures.append(f"file {file_uri(protocol, path)} cannot be read as {fmt} ({type(exc).__name__}: "
                            f"{str(exc)[:200]}); replace or remove it")
            continue
        schemas[path] = schema
        files.append(SourceFile(uri=file_uri(protocol, path), rows=rows, bytes=int(info.get("size") or 0),
                                version=version_of(info)))
    if failures:
        raise DataValidationError(uri, failures)
    failures = _schema_disagreements(schemas, protocol)
    if failures:
        raise DataValidationError(uri, failures)
    partitions = _hive_partitions(paths, base)
    listing = SourceListing(uri=uri, format=fmt, files=files, schema={f.name: str(f.type) for f in schemas[paths[0]]},
                            partitions=partitions, base=file_uri(protocol, base) if partitions else None)
    if partitions:  # the partition columns' types, as pyarrow infers them from the folder names
        schema = open_dataset(listing, options).schema
        listing = dataclasses.replace(listing, schema={f.name: str(f.type) for f in schema})
    return listing


def open_dataset(listing: SourceListing, options: Mapping[str, Any] | None = None):
    """A ``pyarrow.dataset.Dataset`` over the listing's files, with hive partitions."""
    import pyarrow.dataset as ds  # noqa: PLC0415

    fs, _ = open_filesystem(listing.uri, options)
    paths = [path_of(f.uri) for f in listing.files]
    partitioning = None
    if listing.partitions:
        partitioning = ds.partitioning(flavor="hive")
    fmt = "parquet" if listing.format == "parquet" else ds.CsvFileFormat()
    return ds.dataset(paths, filesystem=fs, format=fmt, partitioning=partitioning,
                      partition_base_dir=path_of(listing.base) if listing.base else None)


def source_schema(listing: SourceListing, options: Mapping[str, Any] | None = None) -> Any:
    """The Arrow schema of the rows :func:`iter_batches` yields for ``listing``."""
    if listing.format == "images":
        return image_schema(listing, options=options)
    return open_dataset(listing, options).schema


def iter_batches(listing: SourceListing, columns: list[str] | None, *, batch_rows: int,
                 options: Mapping[str, Any] | None = None) -> Iterator[Batch]:
    """Record batches of at most ``batch_rows`` rows, file by file in listing order.

    Nothing is read ahead, so memory stays near one batch whatever the source's size. Parquet files
    are read with ``ParquetFile.iter_batches``, which decodes a row group's pages a batch at a time:
    the dataset scanner decodes a whole row group first, 1.6 GB for a 128 MB row group of image
    tensors (measured). Hive partition values are added as the columns the dataset's schema says.
    """
    if listing.format == "images":
        yield from iter_image_batches(listing, columns, batch_rows=batch_rows, options=options)
        return
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.dataset as ds  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    dataset = open_dataset(listing, options)
    wanted = dataset.schema if columns is None else pa.schema([dataset.schema.field(c) for c in columns])
    for index, fragment in enumerate(dataset.get_fragments()):
        first_row = 0
        if listing.format == "parquet":
            keys = ds.get_partition_keys(fragment.partition_expression) if listing.partitions else {}
            in_file = [c for c in wanted.names if c not in keys]
            handle = fragment.filesystem.open_input_file(fragment.path)
            batches = pq.ParquetFile(handle).iter_batches(batch_size=batch_rows, columns=in_file, use_threads=True)
        else:
            keys = {}
            # Scanning the fragment with the dataset's schema fills in hive partition columns.
            batches = ds.Scanner.from_fragment(fragment, schema=dataset.schema, columns=wanted.names,
                                               batch_size=batch_rows, batch_readahead=0, fragment_readahead=0,
                                               use_threads=True).to_batches()
        for record_batch in batches:
            if record_batch.num_rows == 0:
                continue
            table = pa.Table.from_batches([record_batch])
            if keys:
                table = pa.table({name: table[name] if name not in keys else
                                  pa.array([keys[name]] * table.num_rows).cast(wanted.field(name).type)
                                  for name in wanted.names})
            if table.schema != wanted:
                table = table.select(wanted.names).cast(wanted)
            yield Batch(table=table, file=listing.files[index], file_index=index, first_row=first_row)
            first_row += record_batch.num_rows


def rows_per_batch(listing: SourceListing, batch_mb: float) -> int:
    """Rows in a batch of about ``batch_mb`` MB, from the source's bytes per row (at least 1,024 rows).

    On disk Parquet is compressed; in memory a row takes more, so the estimate is halved.
    """
    rows = max(1, listing.total_rows)
    # Nested lists decode with levels and offsets beside their values: about four times their bytes.
    nested = any("list<" in str(t) for t in listing.schema.values())
    bytes_per_row = max(1.0, listing.total_bytes / rows) * (8 if nested else 2)
    return max(1024, int(batch_mb * 1e6 / bytes_per_row))


# -- internals ---------------------------------------------------------------------------------
def _fs_or_error(uri: str, options: Mapping[str, Any] | None, role: str):
    try:
        return open_filesystem(uri, options)
    except Exception as exc:  # noqa: BLE001 - unknown protocol, missing package, bad options
        raise DataValidationError(uri, [f"{role}: {uri!r} cannot be opened ({type(exc).__name__}: {exc}); use a "
                                        "local path, file://, or s3:// URI"]) from exc


def _expand(fs: Any, root: str) -> tuple[dict[str, tuple[int, str]], str]:
    """The data and image files under ``root`` (a file, a folder or a glob), sorted, each with its
    size and version from the listing itself (one request per page of 1,000 files on S3, not one
    per file), and the folder they sit in.

    A folder is walked one directory at a time and only (size, version) kept per file: fsspec's
    info dicts take about 1 KB a file, over 600 MB for 600,000 images.
    """
    def wanted(path: str, base: str) -> bool:
        return bool(file_format(path) or is_image(path)) and not _hidden(path, base)

    if any(ch in root for ch in _GLOB_CHARS):
        base = root.split("*")[0].split("?")[0].split("[")[0].rsplit("/", 1)[0]
        matched = fs.glob(root, detail=True)
        return {p: _size_and_version(info) for p, info in sorted(matched.items())
                if info.get("type") != "directory" and wanted(p, base)}, base
    if fs.isdir(root):
        found: dict[str, tuple[int, str]] = {}
        for folder, _, files in fs.walk(root, detail=True):
            for name, info in files.items():
                path = info.get("name") or f"{folder.rstrip('/')}/{name}"
                if wanted(path, root):
                    found[path] = _size_and_version(info)
            if _protocol(fs) != "file":
                fs.invalidate_cache(folder)  # s3fs would keep every page's info dicts
        return dict(sorted(found.items())), root
    if fs.exists(root):
        if not (file_format(root) or is_image(root)):
            raise ValueError(f"{root} is neither a .parquet/.pq nor a .csv file, nor an image")
        return {root: _size_and_version(fs.info(root))}, posixpath.dirname(root)
    return {}, root


def _size_and_version(info: Mapping[str, Any]) -> tuple[int, str]:
    return int(info.get("size") or 0), version_of(info)


def _folders(fs: Any, root: str) -> list[str]:
    """The folders directly below a folder source: class folders, empty ones included."""
    if any(ch in root for ch in _GLOB_CHARS) or not fs.isdir(root):
        return []
    return sorted(posixpath.basename(e["name"].rstrip("/")) for e in fs.ls(root, detail=True)
                  if e.get("type") == "directory" and not posixpath.basename(e["name"].rstrip("/")).startswith(("_", ".")))


def _hidden(path: str, base: str) -> bool:
    """Files Spark and Hive leave beside the data (_SUCCESS, .crc, _temporary/...) are not data."""
    rel = path[len(base):].lstrip("/") if path.startswith(base) else posixpath.basename(path)
    return any(part.startswith(("_", ".")) for part in rel.split("/"))


def _hive_partitions(paths: list[str], base: str) -> list[str]:
    """Partition keys when every file sits under ``key=value`` folders below ``base``."""
    keys: list[str] | None = None
    for path in paths:
        rel = path[len(base):].lstrip("/").split("/")[:-1]
        these = [part.split("=", 1)[0] for part in rel if "=" in part]
        if len(these) != len(rel):
            return []
        if keys is None:
            keys = these
        elif keys != these:
            return []
    return keys or []


def _schema_and_rows(fs: Any, path: str, fmt: str):
    if fmt == "parquet":
        import pyarrow.parquet as pq  # noqa: PLC0415

        with fs.open(path, "rb") as handle:
            metadata = pq.ParquetFile(handle).metadata
            return metadata.schema.to_arrow_schema(), metadata.num_rows
    import pyarrow.csv as pa_csv  # noqa: PLC0415

    rows = 0
    with fs.open(path, "rb") as handle:
        reader = pa_csv.open_csv(handle)
        schema = reader.schema
        for batch in reader:
            rows += batch.num_rows
    return schema, rows


def _schema_disagreements(schemas: Mapping[str, Any], protocol: str) -> list[str]:
    """One sentence per column whose presence or type differs between files."""
    paths = list(schemas)
    first = schemas[paths[0]]
    failures = []
    for path in paths[1:]:
        schema = schemas[path]
        if schema.equals(first):
            continue
        for name in sorted(set(first.names) | set(schema.names)):
            a = first.field(name).type if name in first.names else None
            b = schema.field(name).type if name in schema.names else None
            if a != b:
                failures.append(
                    f"files disagree on column {name!r}: {file_uri(protocol, paths[0])} has "
                    f"{a if a is not None else 'no such column'}, {file_uri(protocol, path)} has "
                    f"{b if b is not None else 'no such column'}; rewrite the files with one schema")
        if len(failures) >= 10:
            break
    return failures


def _protocol(fs: Any) -> str:
    protocol = fs.protocol
    protocol = protocol[0] if isinstance(protocol, (tuple, list)) else protocol
    return "file" if protocol in ("file", "local") else protocol
