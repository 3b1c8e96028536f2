"""File access confined to one directory tree, safe against symlinks planted by the tree's users.

Members can make any file in their workspace a symlink (run_command: `ln -s`), so a path check
followed by a by-name open is a time-of-check/time-of-use hole: the name is looked up again by the
kernel and a symlink swapped in between is followed out of the tree. Here nothing is ever opened by
path. The workdir is opened once as a directory descriptor and every component is opened relative
to its parent's descriptor with O_NOFOLLOW, `openat`-style; files are created with O_EXCL under a
random temporary name and renamed with `os.replace(..., dir_fd=)`, which never follows a symlink at
the destination. A swap after a component was opened changes nothing: we hold the directory itself.

Symlink policy: a link *inside* the tree that leads to another place inside the tree is followed,
but by us, not by the kernel: its text is read with `readlink(dir_fd=)` and its components are
walked the same way (at most MAX_SYMLINKS links per path, '..' never climbs above the root). A link
whose target is outside (absolute elsewhere, or '..' past the root) is refused. Walks over the tree
(grep, glob) never follow symlinks, so each real file is reported once under its real path.
(Linux's openat2(RESOLVE_BENEATH) does the same in the kernel but has no stdlib binding; the
`pathrs` bindings need libpathrs, which no package here ships.)
"""
from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

NAME_MAX = 255  # bytes per path component (Linux file systems)
PATH_MAX = 4096  # bytes per path
MAX_SYMLINKS = 40  # links followed per path, as the kernel's own limit
MAX_DEPTH = 128  # directory levels a path or a walk goes down (each level holds one descriptor)
FILE_MODE, DIR_MODE = 0o644, 0o755  # new entries; the process umask may narrow them further

O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
O_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO never hangs us
O_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(Exception):
    """The path is not usable; the text names the path and the rule it breaks."""


class Missing(Refused):
    """A directory on the way does not exist (or is not a directory)."""


def shown(raw: str, limit: int = 80) -> str:
    """A path as an error message may quote it: control characters escaped, long ones cut."""
    text = printable(raw)
    return text if len(text) <= limit else text[:limit] + "…"


def printable(name: str) -> str:
    """A name as a tool result may carry it: undecodable bytes become U+FFFD, control characters
    are escaped (a name with a newline cannot forge a line of a listing; NUL never reaches the DB)."""
    try:
        text = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a lone surrogate that stands for no byte (JSON can carry one)
        text = name.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return "".join(c if c.isprintable() or c == " " else f"\\x{ord(c):02x}" for c in text)


def components(raw: str) -> list[str]:
    """Split and check a path: NUL bytes, undecodable text and over-long names are refused."""
    if "\x00" in raw:
        raise Refused(f"path '{shown(raw)}' contains a NUL byte; paths cannot contain NUL")
    try:
        size = len(os.fsencode(raw))
    except UnicodeEncodeError:
        raise Refused(f"path '{shown(raw)}' is not valid UTF-8 text") from None
    if size > PATH_MAX:
        raise Refused(f"path '{shown(raw)}' is {size} bytes; the limit is {PATH_MAX} bytes")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if len(parts) > MAX_DEPTH:
        raise Refused(f"path '{shown(raw)}' is more than {MAX_DEPTH} directories deep")
    for part in parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise Refused(f"path '{shown(raw)}' has a name of {len(os.fsencode(part))} bytes; "
                          f"the limit is {NAME_MAX} bytes per name")
    return parts


@dataclass
class Entry:
    """What a directory holds under one name, never following a symlink."""
    name: str
    kind: str  # "dir", "file", "symlink" or "other"
    size: int
    target: str = ""


class Tree:
    """One confined directory tree, open as a descriptor for the duration of a `with` block."""

    def __init__(self, root: Path, aliases: tuple[str, ...] = ()):
        self.root = root
        self.prefixes = (str(root), *aliases)  # absolute spellings of the root (e.g. the sandbox's view)
        self.fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the operator's path: trusted

    def __enter__(self) -> "Tree":
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)

    def outside(self, raw: str) -> Refused:
        return Refused(f"path '{shown(raw)}' is outside the workspace; use a path relative to the workspace root")

    def relative(self, raw: str, target: str) -> list[str]:
        """Components of an absolute path that names a place in the tree (the old by-path API took them)."""
        for root in self.prefixes:
            if target == root or target.startswith(root.rstrip("/") + "/"):
                return components(target[len(root):])
        raise self.outside(raw)

    def locate(self, raw: str, *, create_dirs: bool = False) -> "Place":
        """The directory (as a descriptor) that holds the path's last name, and that name.

        Symlinks on the way, the last name included, are followed inside the tree and refused when
        they lead out. With create_dirs missing directories are made (DIR_MODE) on the way."""
        pending = components(raw)
        if raw.startswith("/"):
            pending = self.relative(raw, raw)
        stack: list[tuple[str, int]] = [("", os.dup(self.fd))]
        links = 0
        try:
            while pending:
                name = pending.pop(0)
                if name == "..":
                    if len(stack) == 1:
                        raise self.outside(raw)
                    os.close(stack.pop()[1])
                    continue
                parent = stack[-1][1]
                target = self._link_text(parent, name)
                if target is not None:
                    links += 1
                    if links > MAX_SYMLINKS:
                        raise Refused(f"path '{shown(raw)}' goes through more than {MAX_SYMLINKS} symbolic links")
                    if target.startswith("/"):
                        pending = self.relative(raw, target) + pending
                        while len(stack) > 1:
                            os.close(stack.pop()[1])
                    else:
                        pending = components(target) + pending
                    continue
                if not pending:
                    return Place([n for n, _ in stack[1:]], os.dup(parent), name)
                if len(stack) > MAX_DEPTH:
                    raise Refused(f"path '{shown(raw)}' is more than {MAX_DEPTH} directories deep")
                # no directory is made for a path that climbs back out of it ('new/../..'): refused first
                stack.append((name, self._open_dir(raw, parent, name, create_dirs and ".." not in pending)))
            # the path ends in a directory already held ('', 'src/..', a link to '.'): name it as '.'
            # of its own descriptor, so nothing is looked up by name again
            return Place([n for n, _ in stack[1:]], os.dup(stack[-1][1]), ".")
        finally:
            for _, fd in stack:
                os.close(fd)

    @staticmethod
    def _link_text(parent: int, name: str) -> str | None:
        try:
            return os.readlink(name, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.ENOENT):  # not a symlink / not there yet
                return None
            raise

    @staticmethod
    def _open_dir(raw: str, parent: int, name: str, create: bool) -> int:
        try:
            return os.open(name, O_DIR, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise Missing(f"'{shown(raw)}': there is no directory '{shown(name)}'") from None
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.ELOOP):  # a file, or a symlink swapped in since we looked
                raise Missing(f"'{shown(raw)}': '{shown(name)}' is not a directory") from None
            raise
        try:
            os.mkdir(name, DIR_MODE, dir_fd=parent)
        except FileExistsError:
            pass  # made meanwhile; the no-follow open below decides what it is
        return Tree._open_dir(raw, parent, name, False)

    def walk(self, start: "Place", skip: set[str]) -> Iterator[tuple[list[str], int, str]]:
        """(directory components, directory fd, name) of every regular file below a directory,
        files before subdirectories, both sorted; symlinks are not followed, `skip` dirs not entered."""
        try:
            fd = os.open(start.name, O_DIR, dir_fd=start.dir_fd)
        except OSError:
            return
        yield from self._walk_fd(start.parts + ([] if start.name == "." else [start.name]), fd, skip, 0)

    def _walk_fd(self, parts: list[str], fd: int, skip: set[str], depth: int) -> Iterator[tuple[list[str], int, str]]:
        try:
            entries = sorted(os.scandir(fd), key=lambda e: e.name)
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    yield parts, fd, entry.name
            if depth >= MAX_DEPTH:
                return
            for entry in entries:
                if entry.is_dir(follow_symlinks=False) and entry.name not in skip:
                    try:
                        child = os.open(entry.name, O_DIR, dir_fd=fd)
                    except OSError:
                        continue  # replaced by a symlink or removed since the listing
                    yield from self._walk_fd([*parts, entry.name], child, skip, depth + 1)
        finally:
            os.close(fd)


@dataclass
class Place:
    """A name in a directory held open: `dir_fd` is owned by the Place (use it in a `with`)."""
    parts: list[str]  # components of the directory, from the root
    dir_fd: int
    name: str  # "." when the place is the directory itself

    def __enter__(self) -> "Place":
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.dir_fd)

    @property
    def path(self) -> str:
        return "/".join([*self.parts, self.name] if self.name != "." else self.parts) or "."

    def lstat(self) -> os.stat_result | None:
        try:
            return os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def is_dir(self) -> bool:
        st = self.lstat()
        return st is not None and stat.S_ISDIR(st.st_mode)

    def read(self, limit: int) -> bytes | None:
        """Up to `limit` bytes of a regular file; None when the name is not one."""
        return read_regular(self.dir_fd, self.name, limit)

    def size(self) -> int | None:
        st = self.lstat()
        return st.st_size if st is not None and stat.S_ISREG(st.st_mode) else None

    def write(self, data: bytes) -> None:
        """Replace the name atomically: a random temporary created exclusively, then renamed over it."""
        old = self.lstat()
        if old is not None and stat.S_ISDIR(old.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory")
        tmp = f".veronica-{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, O_CREATE, FILE_MODE, dir_fd=self.dir_fd)
        try:
            try:
                if old is not None and stat.S_ISREG(old.st_mode):  # keep the file's own mode, minus the risky bits
                    os.fchmod(fd, stat.S_IMODE(old.st_mode) & 0o775)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=self.dir_fd)
            except OSError:
                pass
            raise

    def entries(self) -> list[Entry]:
        """The directory's entries, none followed: a symlink is reported as one, with its text."""
        fd = os.open(self.name, O_DIR, dir_fd=self.dir_fd)
        try:
            found = []
            for entry in os.scandir(fd):
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # removed since the listing
                if stat.S_ISDIR(st.st_mode):
                    found.append(Entry(entry.name, "dir", 0))
                elif stat.S_ISREG(st.st_mode):
                    found.append(Entry(entry.name, "file", st.st_size))
                elif stat.S_ISLNK(st.st_mode):
                    found.append(Entry(entry.name, "symlink", 0, Tree._link_text(fd, entry.name) or ""))
                else:
                    found.append(Entry(entry.name, "other", 0))
            return found
        finally:
            os.close(fd)


def read_regular(dir_fd: int, name: str, limit: int) -> bytes | None:
    """Up to `limit` bytes of the regular file `name` in `dir_fd`; None for anything else: a
    directory, a FIFO or device, a missing name, or a symlink (swapped in since we looked)."""
    try:
        fd = os.open(name, O_READ, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None
        raise
    try:
        return read_fd(fd, limit) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    finally:
        os.close(fd)


def read_fd(fd: int, limit: int) -> bytes:
    chunks, left = [], limit
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
