"""Files `cdc` writes where another user may have been first.

Run as root, `cdc` writes configs, secrets and logs into folders the service user owns
(PostgreSQL's, OpenSearch's, Connect's). That user may have left a symbolic link
there, or swapped a folder for one, so that root writes, chowns or chmods a file of its
choosing (/etc/shadow). Every such write therefore goes through a descriptor: the
folders are opened one by one without following a link once the path leaves folders
that only root (or the invoking user) controls, a new file is made beside the old one
(O_EXCL, O_NOFOLLOW), given its mode and owner through its descriptor, and renamed over
the old name (which replaces a link, never its target).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from cdc.core.errors import ComponentError

__all__ = [
    "append_log",
    "chmod_tree",
    "chown_tree",
    "open_dir",
    "private_folder",
    "read_own",
    "read_plain",
    "write_file",
]

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _trusted(info: os.stat_result) -> bool:
    return info.st_uid in (0, os.geteuid())


def open_dir(path: Path) -> int:
    """A descriptor of the folder `path`, reached without following a link placed by
    another user: links in folders that root or this user own are followed (the
    operator's own), below the first folder someone else owns none is."""
    fd = os.open("/", _DIR)
    trusted = True
    try:
        for part in Path(os.path.abspath(path)).parts[1:]:
            try:
                if trusted:
                    info = os.lstat(part, dir_fd=fd)
                    if stat.S_ISLNK(info.st_mode) and not _trusted(info):
                        trusted = False  # another user's link: not followed
                next_fd = os.open(part, _DIR | (0 if trusted else os.O_NOFOLLOW), dir_fd=fd)
            except OSError as exc:
                raise ComponentError(
                    f"cannot open the folder {path} safely ({part}: "
                    f"{exc.strerror or type(exc).__name__}); a symbolic link there is refused: "
                    "remove it"
                ) from None
            os.close(fd)
            fd = next_fd
            trusted = trusted and _trusted(os.fstat(fd))
        return fd
    except BaseException:
        os.close(fd)
        raise


@contextlib.contextmanager
def _folder(path: Path) -> Iterator[int]:
    fd = open_dir(path)
    try:
        yield fd
    finally:
        os.close(fd)


def write_file(
    path: Path, data: str | bytes, mode: int = 0o600, owner: tuple[int, int] | None = None
) -> None:
    """Replace `path` with a new file holding `data`, of `mode` and (uid, gid) `owner`:
    a link at `path` is replaced, its target never written."""
    content = data.encode() if isinstance(data, str) else data
    with _folder(path.parent) as folder:
        temporary = f".{path.name}.{secrets.token_hex(6)}"
        fd = os.open(
            temporary,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=folder,
        )
        try:
            with os.fdopen(fd, "wb", closefd=False) as out:
                out.write(content)
            if owner is not None:
                os.fchown(fd, *owner)
            os.fchmod(fd, mode)
        except BaseException:
            os.unlink(temporary, dir_fd=folder)
            raise
        finally:
            os.close(fd)
        os.replace(temporary, path.name, src_dir_fd=folder, dst_dir_fd=folder)


def private_folder(path: Path, owner: tuple[int, int] | None = None) -> os.stat_result:
    """Make the folder `path` if missing and give it mode 0700 and (uid, gid) `owner`
    (through a descriptor); returns what it is (its owner among it)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _folder(path) as fd:
        if owner is not None:
            os.fchown(fd, *owner)
        os.fchmod(fd, 0o700)
        return os.fstat(fd)


def append_log(path: Path) -> int:
    """A descriptor appending to the log `path` (made 0600): never through a link, never
    a file with another name (a hard link)."""
    with _folder(path.parent) as folder:
        try:
            fd = os.open(
                path.name,
                os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=folder,
            )
        except OSError as exc:
            raise ComponentError(
                f"cannot open the log {path} safely ({exc.strerror}); a symbolic link there "
                "is refused: remove it"
            ) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise ComponentError(f"the log {path} is not a plain file of its own: remove it")
    os.fchmod(fd, 0o600)
    return fd


def read_own(path: Path) -> str | None:
    """The text of `path` if it is a plain file this user (or root) owns, reached
    without a link (None otherwise): what another user wrote is not believed."""
    try:
        with _folder(path.parent) as folder:
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    except (OSError, ComponentError):
        return None
    with os.fdopen(fd, "rb") as source:
        info = os.fstat(source.fileno())
        if not stat.S_ISREG(info.st_mode) or not _trusted(info):
            return None
        return source.read(4096).decode(errors="replace")


def read_plain(path: Path) -> bytes:
    """The bytes of the plain file `path`, reached without a link (one is refused)."""
    with _folder(path.parent) as folder:
        try:
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
        except OSError as exc:
            raise ComponentError(
                f"cannot read {path} safely ({exc.strerror}); a symbolic link there is "
                "refused: remove it"
            ) from None
    with os.fdopen(fd, "rb") as source:
        if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
            raise ComponentError(f"{path} is not a plain file: remove it")
        return source.read()


def chmod_tree(path: Path, folders: int, files: int) -> None:
    """Give the folder `path`, the folders in it and its plain files these modes, through
    descriptors (links are left alone, never followed)."""
    with _folder(path.parent) as parent:
        for _, _, names, fd in os.fwalk(path.name, dir_fd=parent, follow_symlinks=False):
            os.fchmod(fd, folders)
            for name in names:
                flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                try:
                    file_fd = os.open(name, flags, dir_fd=fd)
                except OSError:
                    continue  # a link (ELOOP), or gone
                try:
                    if stat.S_ISREG(os.fstat(file_fd).st_mode):
                        os.fchmod(file_fd, files)
                finally:
                    os.close(file_fd)


def chown_tree(path: Path, uid: int, gid: int) -> None:
    """Give the folder `path` and everything in it to uid:gid, through descriptors: no
    link is followed, not even a folder swapped for a link during the walk."""
    with _folder(path.parent) as parent:
        os.chown(path.name, uid, gid, dir_fd=parent, follow_symlinks=False)
        for _, dirs, files, fd in os.fwalk(path.name, dir_fd=parent, follow_symlinks=False):
            for name in dirs + files:
                with contextlib.suppress(FileNotFoundError):
                    os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)
