"""One store interface over fsspec: ``file://`` (default), ``s3://`` through s3fs, ``memory://``.

Layout: ``<root>/<dag_id>/<run_id>/...`` for checkpoints, metrics and reports;
``<root>/<dag_id>/shards/<fingerprint>/...`` for shards, which are reused across runs with the
same input and seed. Writes are atomic: temp file + rename on local disk, a single PUT on S3
(an S3 object never appears half written).

An endpoint that is briefly away (a restarting S3 gateway, a dropped connection) is waited for:
every call retries with backoff for up to ``retry_seconds``; a longer outage is a
:class:`~mop_airflow.errors.StoreError` naming the endpoint, which fails the task, and Airflow
retries the task later.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import logging
import os
import threading
import posixpath
import random
import tempfile
import time
import uuid
from typing import Any, Callable, Iterator, Mapping, TypeVar

from mop_airflow.errors import StoreError


class _CountingWriter(io.RawIOBase):
    """A write-only file that hashes (sha256) and counts what passes through it to ``handle``."""

    def __init__(self) -> None:
        super().__init__()
        self.handle: Any = None
        self.digest = hashlib.sha256()
        self.bytes = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.handle.write(view)
        self.digest.update(view)
        self.bytes += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self.bytes

    @property
    def sha256(self) -> str:
        return self.digest.hexdigest()


T = TypeVar("T")
log = logging.getLogger(__name__)

# Connection failures by class name: botocore's ConnectionError family (EndpointConnectionError,
# ReadTimeoutError, ConnectTimeoutError) and aiohttp's do not derive from the builtin ones.
_TRANSIENT_NAMES = {"ConnectionError", "EndpointConnectionError", "ReadTimeoutError", "ConnectTimeoutError",
                    "ClientConnectorError", "ServerDisconnectedError", "ClientOSError"}


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` says the store could not be reached or had no room (worth waiting for), not
    that it refused."""
    if isinstance(exc, StoreError):
        return exc.transient
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True  # a full disk is the machine's state, not the configuration's fault: worth a later try
    return any(cls.__name__ in _TRANSIENT_NAMES for cls in type(exc).__mro__)


def safe_segment(value: str) -> str:
    """A run id such as ``manual__2026-01-01T00:00:00+00:00`` made safe for paths and S3 keys.

    Dots stay (dates, versions), but a segment of dots only (``..`` is a valid Airflow run id) would
    climb out of its folder: its dots become underscores."""
    segment = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(value))
    return segment if segment.strip(".") else "_" * max(1, len(segment))


def open_filesystem(uri: str, options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem of ``uri`` and the path inside it, opened with ``options`` (for s3fs: ``key``,
    ``secret``, ``client_kwargs``...). The one opener of the store and the data: credentials arrive here
    as plain options, which the Airflow side makes from a connection (:mod:`mop_airflow.hooks.connections`)."""
    import fsspec  # noqa: PLC0415 - keep DAG parsing light

    if uri.startswith(("s3://", "s3a://")):
        retry_delays_apart()
    return fsspec.core.url_to_fs(uri, **dict(options or {}))


def retry_delays_apart() -> None:
    """Give botocore a random generator of its own for its retry delays.

    botocore draws each delay from Python's global generator, for every S3 request that fails, on
    whichever thread made it; Keras takes the default seeds of a model's layers from that same
    generator just after a hop seeds it. A request failing on the commit or read-ahead thread while
    the training thread built a model moved that model's initial weights: a store outage changed a
    configuration's final val_accuracy (0.8440 instead of 0.8384 in the S3 outage test).
    """
    try:
        import botocore.retryhandler as handler  # noqa: PLC0415
    except ImportError:  # no S3 support installed: fsspec says so when the filesystem is opened
        return
    if handler.random is random:  # botocore's `import random`
        handler.random = random.Random()


class Store:
    """Reads and writes bytes and JSON under one root URI."""

    def __init__(self, root: str, options: Mapping[str, Any] | None = None, retry_seconds: float = 60.0):
        self.root = root.rstrip("/")
        self.retry_seconds = retry_seconds
        self.protocol = self.root.split("://", 1)[0] if "://" in self.root else "file"
        self.fs = open_filesystem(self.root, options)[0]
        self.bytes_read = 0
        self.bytes_written = 0

    @property
    def endpoint(self) -> str:
        """What a user would check when the store does not answer: the S3 endpoint, or the root."""
        if self.protocol != "s3":
            return self.root
        kwargs = getattr(self.fs, "client_kwargs", None) or {}
        return getattr(self.fs, "endpoint_url", None) or kwargs.get("endpoint_url") or "AWS S3 (default endpoint)"

    def _call(self, what: str, uri: str, call: Callable[[], T]) -> T:
        """``call()``, retried with backoff (0.5 s doubling to 8 s) while the endpoint is unreachable."""
        started, delay, tries = time.monotonic(), 0.5, 0
        while True:
            tries += 1
            try:
                return call()
            except Exception as exc:
                if not transient(exc) or isinstance(exc, StoreError):
                    raise
                waited = time.monotonic() - started
                if waited + delay > self.retry_seconds:
                    raise StoreError(
                        f"the store at {self.endpoint} did not answer for {waited:.0f} s ({tries} tries) while "
                        f"{what} {uri}: {type(exc).__name__}: {exc}. Fix: check that the endpoint is up and "
                        "reachable from this worker; the task is retried", transient=True) from exc
                log.warning("the store at %s did not answer while %s %s (%s); try %d again in %.1f s",
                            self.endpoint, what, uri, type(exc).__name__, tries + 1, delay)
                time.sleep(delay)
                delay = min(delay * 2, 8.0)

    # -- addressing --------------------------------------------------------------------------
    def uri(self, *parts: str) -> str:
        for part in parts:
            if "://" in str(part):
                raise StoreError(f"{part!r} is a full URI; Store.uri joins path segments under {self.root}")
        return posixpath.join(self.root, *[p.strip("/") for p in parts if p])

    def _path(self, uri: str) -> str:
        if "://" in uri:
            scheme, rest = uri.split("://", 1)
            if scheme != self.protocol:
                raise StoreError(f"{uri} is not in this store ({self.root})")
            return rest if self.protocol != "file" else "/" + rest.lstrip("/")
        return uri

    def local_path(self, uri: str) -> str | None:
        """The local file behind ``uri`` when the store is on local disk, else None."""
        return self._path(uri) if self.protocol == "file" else None

    # -- reads -------------------------------------------------------------------------------
    def exists(self, uri: str) -> bool:
        return self._call("looking for", uri, lambda: self.fs.exists(self._path(uri)))

    def _cat(self, path: str, small: bool) -> bytes:
        # s3fs asks an object's size (a HEAD) before each read, to read a large one in parallel ranges:
        # a request too many for a record or a status of a few hundred bytes
        if small and self.protocol == "s3":
            return self.fs.cat_file(path, max_concurrency=1)
        return self.fs.cat_file(path)

    def read_bytes(self, uri: str, *, tally: bool = True, small: bool = False) -> bytes:
        """The object's bytes; ``tally=False`` leaves them out of ``bytes_read`` (a read ahead on
        another thread, counted by whoever takes it); ``small``: a record, read in one request."""
        try:
            data = self._call("reading", uri, lambda: self._cat(self._path(uri), small))
        except FileNotFoundError as exc:
            raise StoreError(f"not found in the store: {uri}") from exc
        if tally:
            self.bytes_read += len(data)
        return data

    def read_if_there(self, uri: str) -> bytes | None:
        """A small object's bytes, or None when there is none: one request on S3 where a look and a read
        are two (what a slot polling another slot's status pays every few seconds)."""
        try:
            data = self._call("reading", uri, lambda: self._cat(self._path(uri), True))
        except FileNotFoundError:
            return None
        self.bytes_read += len(data)
        return data

    def read_json(self, uri: str) -> Any:
        return json.loads(self.read_bytes(uri, small=True))

    def disk_usage(self, uri: str) -> int:
        """Bytes stored at or under ``uri`` (0 when nothing is there)."""
        if not self.exists(uri):
            return 0
        return int(self._call("measuring", uri, lambda: self.fs.du(self._path(uri), total=True)))

    def glob(self, uri_pattern: str) -> list[str]:
        paths = self._call("listing", uri_pattern, lambda: self.fs.glob(self._path(uri_pattern)))
        if self.protocol == "file":
            return sorted("file://" + p for p in paths)
        return sorted(f"{self.protocol}://" + p.lstrip("/") for p in paths)

    def names_after(self, folder_uri: str, after: str = "") -> list[str]:
        """The names of the objects in ``folder_uri`` that sort after ``after``, sorted; none when the
        folder is not there. On S3 one LIST request a thousand names, starting after ``after`` (no
        cached listing): a poller that remembers the last name it saw pays for the new names only."""
        path = self._path(folder_uri).rstrip("/")
        if self.protocol == "s3":
            return self._call("listing", folder_uri, lambda: self._s3_names_after(path, after))
        try:
            names = self._call("listing", folder_uri, lambda: [posixpath.basename(p.rstrip("/")) for p in
                                                             self.fs.ls(path, detail=False)])
        except FileNotFoundError:
            return []
        return sorted(n for n in names if n > after)

    def _s3_names_after(self, path: str, after: str) -> list[str]:
        bucket, key, _ = self.fs.split_path(path)
        prefix = key + "/"
        request: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        if after:
            request["StartAfter"] = prefix + after
        names: list[str] = []
        while True:
            page = self.fs.call_s3("list_objects_v2", **request)
            names += [item["Key"][len(prefix):] for item in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return names
            request["ContinuationToken"] = page["NextContinuationToken"]

    def get_file(self, uri: str, local_path: str) -> None:
        """Copy one object to a local file atomically (for the shard cache)."""
        os.makedirs(os.path.dirname(local_path) or ".", exist_ok=True)
        tmp = f"{local_path}.tmp-{uuid.uuid4().hex}"
        try:
            self._call("copying", uri, lambda: self.fs.get_file(self._path(uri), tmp))
            os.replace(tmp, local_path)
        except FileNotFoundError as exc:
            raise StoreError(f"not found in the store: {uri}") from exc
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        self.bytes_read += os.path.getsize(local_path)

    # -- writes ------------------------------------------------------------------------------
    def write_bytes(self, uri: str, data: bytes) -> str:
        if self.protocol == "file":
            with self.open_write(uri) as handle:  # readers see the old file or the new one, never a partial one
                handle.write(data)
        else:
            # one PUT: an object store never shows a partial object, and a retried PUT replaces it whole
            self._call("writing", uri, lambda: self.fs.pipe_file(self._path(uri), data))
            self.bytes_written += len(data)
        return uri

    def write_json(self, uri: str, obj: Any) -> str:
        return self.write_bytes(uri, json.dumps(obj, indent=2, sort_keys=True, default=str).encode())

    def create_json(self, uri: str, obj: Any) -> bool:
        """Write ``obj`` at ``uri`` only if nothing is there yet, atomically: True when this call wrote it,
        False when another writer was first (its object stays). A decision that several processes may
        take at once is taken once: on ``file://`` the written file is linked into place (``link``
        fails when the name exists); on S3 the PUT carries ``If-None-Match: *``, which refuses to
        replace an object."""
        data = json.dumps(obj, indent=2, sort_keys=True, default=str).encode()
        if self.protocol == "file":
            path = self._path(uri)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
            with open(tmp, "wb") as handle:
                handle.write(data)
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
        else:
            try:
                self._call("creating", uri, lambda: self.fs.pipe_file(self._path(uri), data, mode="create"))
            except FileExistsError:
                return False
            except OSError as exc:  # s3fs names a refused conditional PUT by its status
                if "PreconditionFailed" not in str(exc) and "412" not in str(exc):
                    raise
                return False
        self.bytes_written += len(data)
        return True

    @contextlib.contextmanager
    def open_write(self, uri: str) -> Iterator[Any]:
        """A binary handle whose object appears at ``uri`` only when the block ends without error.

        For large objects written piece by piece (shards): a temp file renamed into place on local
        disk; on S3 a multipart upload completed on close and aborted on error.
        """
        path = self._path(uri)
        counter = _CountingWriter()
        if self.protocol == "file":
            directory = os.path.dirname(path)
            os.makedirs(directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
            try:
                with os.fdopen(fd, "wb") as handle:
                    counter.handle = handle
                    yield counter
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        else:
            handle = self.fs.open(path, "wb")
            counter.handle = handle
            try:
                yield counter
            except BaseException:
                discard = getattr(handle, "discard", None)
                if discard is not None:
                    discard()  # s3fs: abort the multipart upload, so no partial object appears
                raise
            handle.close()
        self.bytes_written += counter.bytes

    def delete_tree(self, uri: str) -> None:
        """Remove ``uri`` and everything below it; a missing ``uri`` is not an error."""
        path = self._path(uri)
        try:  # one call, not a look then a delete: every hop deletes a checkpoint that fell out of the kept ones
            self._call("deleting", uri, lambda: self.fs.rm(path, recursive=True))
        except FileNotFoundError:
            pass

    def delete_file(self, uri: str) -> None:
        """Remove the one object ``uri``; a missing one is not an error. One request on S3, where
        :meth:`delete_tree` lists (and looks) first."""
        path = self._path(uri)
        try:
            self._call("deleting", uri, lambda: self.fs.rm_file(path))
        except FileNotFoundError:
            pass

    def put_file(self, local_path: str, uri: str) -> str:
        with open(local_path, "rb") as handle:
            return self.write_bytes(uri, handle.read())
