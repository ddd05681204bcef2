"""Files read while they are written: HDF5's single-writer / multiple-reader mode (SWMR).

agentsim's writers (trajectories, studies) create their files in HDF5's v110 format (read by
HDF5 1.10 and newer, h5py 2.8 and newer) and write them in SWMR mode from the start (a new file
before it gets its final name; a file continued by a resumed run before anything in it changes).
Meanwhile any other process may open the file read-only with ``swmr=True`` (every agentsim reader
does: :func:`open_to_read`) and sees what the writer's last flush put on disk. In this mode HDF5
writes its metadata in an order that keeps the file readable at every moment, so a writer killed
at any point leaves a file that reads up to its last flush.

A writer that stops without closing (killed, or given up after a failed write) leaves its file
marked as open for writing. Such a file opens with ``h5py.File(path, "r", swmr=True)`` (plain
``h5py.File(path)`` refuses it: "file is already open for write"), and HDF5 refuses to open it
for writing again: :func:`reopen_to_write` first copies it into a fresh file that replaces it.

Files written before agentsim 0.4 (HDF5's earliest format) are read the same way; a writer that
continues one cannot turn SWMR on (:func:`share`), so such a file is readable only between runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import time
from collections.abc import Callable
from typing import Any, cast

import h5py

__all__ = ["CHUNK_CACHE_BYTES", "LIBVER", "UncopiedError", "bound_caches", "marked_open", "open_to_read",
           "reopen_to_write", "reopen_unshared", "share"]

LIBVER = ("v110", "v110")  # the oldest HDF5 file format with SWMR, and no newer one
# A writer that appends needs a dataset's last chunk or two in HDF5's chunk cache (1 MiB per
# dataset by default), and little metadata cache (which grows to 32 MiB by default): a run with
# --out grew by about 210 bytes a step without these bounds (25 series, 600,000 rows: +130 MB),
# and stays within about 5 MB with them.
CHUNK_CACHE_BYTES = 1 << 17
METADATA_CACHE_BYTES = 4 << 20


class UncopiedError(OSError):
    """A file whose writer stopped without closing it could not be copied (a damaged object, no
    space for the copy).
    """


# A SWMR reader reads a metadata block again when its checksum fails (the writer may be rewriting
# it) as often as this; HDF5's default, 100 tries with growing waits, holds a reader of a damaged
# file (a full disk's) for minutes on every damaged block.
_READ_ATTEMPTS = 10
# A reader holds its lock on a file while it has the file open (``study status``, ``inspect``: a few
# milliseconds); a writer that opens the file meanwhile tries again for this long before it gives up.
LOCK_WAIT_SECONDS = 5.0


@functools.cache
def _set_read_attempts() -> Callable[[int, int], int] | None:
    """HDF5's ``H5Pset_metadata_read_attempts`` (h5py does not wrap it) from the libhdf5 that h5py
    loaded, found in ``/proc/self/maps``; None where that is not there (not Linux).
    """
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "libhdf5" in line}
    except OSError:
        return None
    for path in sorted(paths):
        if path.startswith("/") and "_hl" not in os.path.basename(path):
            with contextlib.suppress(OSError, AttributeError):
                fn = ctypes.CDLL(path).H5Pset_metadata_read_attempts
                fn.argtypes, fn.restype = [ctypes.c_int64, ctypes.c_uint], ctypes.c_int
                return cast(Callable[[int, int], int], fn)
    return None


def open_to_read(path: str) -> h5py.File:
    """``path`` opened read-only: as plain h5py opens it (which checks, e.g., that the file is not
    cut short), or where HDF5 says it is open for writing (a writer in SWMR mode appends to it, or
    one was killed), in SWMR read mode (a damaged metadata block then fails after
    :data:`_READ_ATTEMPTS` tries).
    """
    try:
        return h5py.File(path, "r")
    except OSError as e:
        if not marked_open(e):
            raise
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_EARLIEST, h5py.h5f.LIBVER_LATEST)  # (h5py's default)
    set_attempts = _set_read_attempts()
    if set_attempts is not None:
        set_attempts(fapl.id, _READ_ATTEMPTS)
    return h5py.File(h5py.h5f.open(os.fsencode(path), h5py.h5f.ACC_RDONLY | h5py.h5f.ACC_SWMR_READ, fapl=fapl))


def share(file: h5py.File) -> bool:
    """Turn SWMR writing on for ``file`` (open for writing, all its objects flushed): from now on
    other processes may read it. False, doing nothing, for a file of a format older than v110 (one of
    agentsim < 0.4 continued by a resumed run), or written through h5py's ``fileobj`` driver.

    Raises:
        OSError, RuntimeError: The write this makes (HDF5 flushes the file) failed.
    """
    if file.swmr_mode:
        return True
    if file.id.get_create_plist().get_version()[0] < 3:  # superblock version 3 is v110's
        return False
    if file.driver == "fileobj":  # (the write-fault test hook's files: this driver keeps no SWMR marks)
        return False
    file.swmr_mode = True
    return True


def bound_caches(file: h5py.File) -> h5py.File:
    """``file`` (opened with ``rdcc_nbytes=CHUNK_CACHE_BYTES``: agentsim.io.hdf5.open_for_writing)
    with its metadata cache bounded too.
    """
    config = file.id.get_mdc_config()
    config.max_size = METADATA_CACHE_BYTES
    file.id.set_mdc_config(config)
    return file


def marked_open(e: BaseException) -> bool:
    """Whether ``e`` is HDF5 refusing a file whose writer stopped without closing it."""
    return isinstance(e, OSError) and "already open for" in str(e)


def reopen_to_write(path: str, mode: str, opener: Callable[..., h5py.File], **kwargs: Any) -> h5py.File:
    """``opener(path, mode, **kwargs)``; a file whose writer stopped without closing it (see the
    module doc) is first copied (root attributes and every object under the root, as the last flush
    left them) into ``.NAME.reopenPID`` beside it, which then replaces it.

    Raises:
        UncopiedError: The file needed the copy, and it failed.
        OSError: The file cannot be opened.
    """
    try:
        return _when_unlocked(opener, path, mode, **kwargs)
    except OSError as e:
        if not marked_open(e):
            raise
    directory, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(directory, f".{name}.reopen{os.getpid()}")
    try:
        with open_to_read(path) as src, h5py.File(tmp, "w", libver=LIBVER) as dst:
            for key, value in src.attrs.items():
                dst.attrs[key] = value
            for key in src:
                src.copy(src[key], dst, name=key)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if isinstance(e, (OSError, RuntimeError, KeyError, ValueError)):
            raise UncopiedError(f"its writer stopped without closing it, and copying it into a fresh file "
                                f"failed: {e}") from e
        raise
    return _when_unlocked(opener, path, mode, **kwargs)


def _when_unlocked(opener: Callable[..., h5py.File], path: str, mode: str, **kwargs: Any) -> h5py.File:
    """``opener(path, mode, **kwargs)``, tried again every 50 ms for up to :data:`LOCK_WAIT_SECONDS`
    while another process holds the file's lock (a reader that has it open for a moment).
    """
    deadline = time.monotonic() + LOCK_WAIT_SECONDS
    while True:
        try:
            return opener(path, mode, **kwargs)
        except OSError as e:
            if "unable to lock file" not in str(e).lower() or time.monotonic() >= deadline:
                raise
        time.sleep(0.05)


def reopen_unshared(file: h5py.File, path: str, opener: Callable[..., h5py.File]) -> h5py.File:
    """``file`` (at ``path``, in SWMR mode) closed and opened again, ``opener(path, "r+",
    locking=False)``, for writing outside SWMR mode whatever readers hold it open: HDF5 cannot delete
    an object while in SWMR mode. The caller makes its change, then shares the file again
    (:func:`share`); a reader opening the file meanwhile may fail (agentsim's readers say so, and a
    second try reads).
    """
    raw = getattr(file, "agentsim_failing", None)  # (the write-fault test hook's file under it)
    file.close()
    if raw is not None:
        raw.close()
    return opener(path, "r+", locking=False)
