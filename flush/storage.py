"""Where a table's files live: a local folder or an S3-compatible bucket, behind one
set of calls.

delta-rs reads and writes the log for both. Everything else this system does to a
table's files (writing Parquet, listing the log, deleting a dropped table) goes
through here, so a location is only ever a string: a local path, or
``s3://bucket/prefix/...``. On S3 the settings come from the standard AWS
environment variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``AWS_ALLOW_HTTP``), which delta-rs and
pyarrow both read. A local file is made durable with ``fsync`` (the file and its
folder); an object is durable once its upload is answered, and folders do not exist.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import pyarrow.fs as pafs

__all__ = [
    "OBJECT_STORE_SCHEMES",
    "delete_file",
    "delete_tree",
    "describe_store_error",
    "exists",
    "file_names",
    "fsync_folder",
    "is_object_store",
    "is_store_error",
    "join",
    "make_folder",
    "read_bytes",
    "write_new_file",
]

#: Location prefixes that name an object store rather than a local folder.
OBJECT_STORE_SCHEMES = ("s3://",)


def is_object_store(location: str | Path) -> bool:
    """Whether ``location`` lies in an object store (``s3://...``)."""
    return str(location).startswith(OBJECT_STORE_SCHEMES)


def join(location: str | Path, *parts: str) -> str:
    """``location`` with ``parts`` appended, as a string (``/``-separated in a bucket)."""
    if is_object_store(location):
        return posixpath.join(str(location).rstrip("/"), *parts)
    return os.path.join(location, *parts)


def _filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem holding ``location``, and the location's path in it."""
    filesystem, path = pafs.FileSystem.from_uri(location)
    return filesystem, path


def make_folder(location: str | Path) -> None:
    """Make a local folder and its parents; nothing in a bucket (folders do not exist)."""
    if not is_object_store(location):
        Path(location).mkdir(parents=True, exist_ok=True)


def fsync_folder(path: str | Path) -> None:
    """Make a new or renamed file's directory entry durable (local folders only)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_new_file(location: str, relative: str, write: Callable[[BinaryIO], None]) -> int:
    """Write a new file ``relative`` to ``location`` with ``write(handle)`` and make it
    durable before returning its size in bytes: fsynced with its folder on local disk,
    uploaded in a bucket."""
    target = join(location, relative)
    if is_object_store(location):
        filesystem, path = _filesystem(target)
        with filesystem.open_output_stream(path) as stream:
            write(stream)  # type: ignore[arg-type]  # a pyarrow stream has write()
        size: int = filesystem.get_file_info(path).size
        return size
    folder = os.path.dirname(target)
    os.makedirs(folder, exist_ok=True)
    with open(target, "wb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())
    fsync_folder(folder)
    return os.stat(target).st_size


def read_bytes(location: str, relative: str) -> bytes | None:
    """The content of file ``relative`` of ``location``; None if there is none."""
    target = join(location, relative)
    if not is_object_store(location):
        try:
            return Path(target).read_bytes()
        except FileNotFoundError:
            return None
    filesystem, path = _filesystem(target)
    try:
        with filesystem.open_input_stream(path) as stream:
            return bytes(stream.read())
    except FileNotFoundError:
        return None


def exists(location: str | Path, relative: str = "") -> bool:
    """Whether ``relative`` (a file or a folder; ``""``: the location itself) exists.
    In a bucket a "folder" exists while any object lies below it."""
    target = join(location, relative) if relative else str(location)
    if not is_object_store(target):
        return os.path.exists(target)
    filesystem, path = _filesystem(target)
    return bool(filesystem.get_file_info(path).type != pafs.FileType.NotFound)


def file_names(location: str | Path, folder: str, suffix: str = "") -> list[str]:
    """The names of the files directly inside ``folder`` of ``location`` that end with
    ``suffix`` (none if the folder does not exist)."""
    target = join(location, folder)
    if not is_object_store(target):
        try:
            return [name for name in os.listdir(target) if name.endswith(suffix)
                    and os.path.isfile(os.path.join(target, name))]  # fmt: skip
        except FileNotFoundError:
            return []
    filesystem, path = _filesystem(target)
    found = filesystem.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return [posixpath.basename(info.path) for info in found
            if info.type == pafs.FileType.File and info.path.endswith(suffix)]  # fmt: skip


def delete_file(location: str | Path, relative: str) -> None:
    """Delete one file if it exists."""
    target = join(location, relative)
    if not is_object_store(target):
        Path(target).unlink(missing_ok=True)
        return
    filesystem, path = _filesystem(target)
    with contextlib.suppress(FileNotFoundError):
        filesystem.delete_file(path)


def delete_tree(location: str | Path) -> None:
    """Delete a folder and everything below it (a prefix in a bucket), if it exists."""
    if not is_object_store(location):
        shutil.rmtree(location, ignore_errors=True)
        return
    filesystem, path = _filesystem(str(location))
    with contextlib.suppress(FileNotFoundError):
        filesystem.delete_dir(path)


def describe_store_error(error: BaseException, limit: int = 600) -> str:
    """An object store's error on one line: delta-rs' run over many lines, with colour
    codes and arrows (``Generic S3 error ↳ Error performing ...``)."""
    text = " ".join(re.sub(r"\x1b\[[0-9;]*m|↳", " ", str(error)).split())
    return text if len(text) <= limit else text[:limit] + " ..."


def is_store_error(error: BaseException) -> bool:
    """Whether an error is an object store's (delta-rs' or pyarrow's S3 calls raise
    ``OSError`` without an ``errno``), not a local file's, which carries one."""
    return isinstance(error, OSError) and error.errno is None
