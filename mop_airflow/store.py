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

from mop_airflow.errors import SpecError, StoreError


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


def fails_the_try(exc: BaseException, *, fail_fast: bool = False, also: tuple = ()) -> bool:
    """Whether an error met while a slot trains or commits a hop ends its try (the task fails, and Airflow
    retries it; the hops committed stay) instead of failing only that hop's configuration: the store
    failing (a :class:`~mop_airflow.errors.StoreError`, or any error :func:`transient` says is the store
    out of reach), one of ``also`` (the train operator adds Airflow's), or ``search.fail_fast``. A store
    that answers no (a 403 on a marker) fails the configuration, not the try. The train operator's rule,
    which the slot simulation's failed commits are classified by too."""
    return isinstance(exc, (StoreError, *also)) or fail_fast or transient(exc)


# A conditional create answered 409 is tried again this many times in all, 0.1 s apart doubling (with jitter,
# drawn from a generator of the store's own: Keras seeds layers from Python's global one).
CONFLICT_TRIES = 5
CONFLICT_FIRST_DELAY = 0.1
_JITTER = random.Random()


def _s3_answer(exc: BaseException) -> tuple[str | None, int | None]:
    """The S3 error code and HTTP status behind ``exc``: s3fs raises an OSError whose cause is botocore's
    ClientError, which holds the parsed response."""
    seen: BaseException | None = exc
    for _ in range(8):  # a short chain: never loop on a cycle of causes
        if seen is None:
            break
        response = getattr(seen, "response", None)
        if isinstance(response, Mapping):
            return ((response.get("Error") or {}).get("Code"),
                    (response.get("ResponseMetadata") or {}).get("HTTPStatusCode"))
        seen = seen.__cause__ or seen.__context__
    return None, None


def lost_race(exc: BaseException) -> bool:
    """Whether a conditional create was refused because the object is there (412 PreconditionFailed)."""
    if isinstance(exc, FileExistsError):
        return True
    code, status = _s3_answer(exc)
    return code == "PreconditionFailed" or status == 412 or "PreconditionFailed" in str(exc)


def conflicted(exc: BaseException) -> bool:
    """Whether a conditional create was answered 409 (ConditionalRequestConflict, OperationAborted): a
    concurrent operation on the key, which decided nothing; AWS says to retry."""
    code, status = _s3_answer(exc)
    return status == 409 or code in ("ConditionalRequestConflict", "OperationAborted") or \
        "ConditionalRequestConflict" in str(exc)


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
        False when another writer was first (its object stays). See :meth:`create_bytes`."""
        return self.create_bytes(uri, json.dumps(obj, indent=2, sort_keys=True, default=str).encode())

    def create_bytes(self, uri: str, data: bytes) -> bool:
        """Write ``data`` at ``uri`` only if nothing is there yet, atomically: True when this call wrote it,
        False when another writer was first (its object stays, whole). A decision that several processes
        may take at once is taken once, and a write fenced so that it never replaces another's: on
        ``file://`` the written file is linked into place (``link`` fails when the name exists); on S3 the
        PUT carries ``If-None-Match: *``, which refuses to replace an object (412), and a 409 conflict is
        tried again. One request on S3, as a plain write. :func:`check_create_if_absent` proves, before a
        run trains, that the store keeps that promise."""
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
        elif not self._create_object(uri, data):
            return False
        self.bytes_written += len(data)
        return True

    def _create_object(self, uri: str, data: bytes) -> bool:
        """One conditional PUT (``If-None-Match: *``): True when it wrote ``uri``, False when an object was
        there (412 PreconditionFailed). A 409 (ConditionalRequestConflict: another conditional write to the
        key was in flight) decides nothing: AWS says to retry, and the retry's answer decides."""
        path, delay, attempt = self._path(uri), CONFLICT_FIRST_DELAY, 0
        while True:
            attempt += 1
            try:
                self._call("creating", uri, lambda: self.fs.pipe_file(path, data, mode="create"))
                return True
            except FileExistsError:
                return False
            except OSError as exc:
                if lost_race(exc):
                    return False
                if not conflicted(exc):
                    raise
                if attempt == CONFLICT_TRIES:
                    raise StoreError(
                        f"the store at {self.endpoint} answered {attempt} conditional creates of {uri} with a 409 "
                        f"conflict: {exc}. A concurrent write to the same key kept it busy. Fix: check that nothing "
                        "but this run's slots writes under its folder; the task is retried", transient=True) from exc
                log.info("the store at %s answered the create of %s with a 409 conflict (%s); try %d again in %.2f s",
                         self.endpoint, uri, exc, attempt + 1, delay)
                time.sleep(delay * (0.5 + _JITTER.random()))
                delay *= 2

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


# What a store that fakes create-if-absent is told to do instead
FIX_CREATE_IF_ABSENT = ("use an S3-compatible store that supports conditional writes (a PUT with If-None-Match: * "
                        "is refused with 412 when the key exists, as on AWS S3), or a file:// store on a file "
                        "system with hard links")


def check_create_if_absent(store: Store, folder_uri: str) -> None:
    """Prove that ``store`` honours create-if-absent, which the decisions taken inside the shard slots
    rely on: create one new probe key under ``folder_uri`` (the run's folder) twice; the second create
    must lose. Refuses, before anything trains, a store where both succeed: an S3-compatible endpoint
    that ignores ``If-None-Match: *`` would let two slots each take the same decision (a configuration
    promoted twice, a budget overrun). The probe is removed again, and on local disk the run's folder
    when the probe made it."""
    probe = posixpath.join(folder_uri.rstrip("/"), f".create-probe-{uuid.uuid4().hex}.json")
    local = store.local_path(folder_uri)
    made = local if local and not os.path.exists(local) else None
    try:
        first = store.create_json(probe, {"probe": "first"})
        second = store.create_json(probe, {"probe": "second"})
    except OSError as exc:
        if not _unsupported(exc):
            raise
        raise SpecError("store.root", store.root, f"the store at {store.endpoint} refused to create the new key "
                        f"{probe} if absent: {type(exc).__name__}: {exc}", FIX_CREATE_IF_ABSENT) from exc
    finally:
        _remove_probe(store, probe, made)
    if first and not second:
        return
    did = ("both creates succeeded: the second replaced the first instead of being refused" if first and second
           else "the first create of the new key lost, as if it were already there")
    raise SpecError("store.root", store.root,
                    f"the store at {store.endpoint} does not honour create-if-absent: two creates of the probe key "
                    f"{probe}, {did}. The shard slots take each decision once by such a create; on this store two "
                    "slots could both take it", FIX_CREATE_IF_ABSENT)


def _unsupported(exc: BaseException) -> bool:
    """Whether a create failed because the store does no conditional creates at all (S3: 501
    NotImplemented; a local file system without hard links), not for another reason."""
    code, status = _s3_answer(exc)
    return code == "NotImplemented" or status == 501 or (
        isinstance(exc, OSError) and exc.errno in (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP))


def _remove_probe(store: Store, probe: str, folder: str | None) -> None:
    """Remove the probe key, and ``folder`` (the run's, made for it) while it is empty; a failure only warns."""
    try:
        store.delete_file(probe)
    except Exception as exc:  # noqa: BLE001 - the check's verdict matters, not the probe's removal
        log.warning("could not remove the store probe %s (%s: %s); it is safe to delete", probe, type(exc).__name__,
                    exc)
    if folder:
        with contextlib.suppress(OSError):  # not empty: another try of this run wrote there meanwhile
            os.rmdir(folder)
