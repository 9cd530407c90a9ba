"""Where the GPU trace's files come from: a folder, or the archive shipped in the package.

``shoal loadtest fragmentation`` and ``defrag`` read the Alibaba GPU trace
(cluster-trace-gpu-v2023, with the FGD paper's published means) file by file. A trace is
either a folder of those CSV files (``--trace DIR``) or a ``.tar.xz`` archive of them with
a ``SHA256SUMS`` beside it. The package ships the whole trace as such an archive,
:data:`BUNDLED` (``data/alibaba-gpu-v2023/``: 13 MB of CSV in 0.5 MB, since the pod files
are samples of one another and one xz stream over all of them stores the rows they share
once; ``NOTICE.md`` there says where it comes from and on what terms), so the commands
work from any directory and from an installed wheel with no download.

Cost: an archive is read whole into memory once per process (13 MB, about 0.3 s of CPU
with the SHA-256 of every member); a folder's file is read when it is asked for.
Every member of an archive is checked against ``SHA256SUMS`` before any is used: a
damaged or altered archive is refused, naming the member.
"""

from __future__ import annotations

import functools
import hashlib
import lzma
import tarfile
from pathlib import Path
from typing import Final

from events.errors import InputError

DATA: Final = Path(__file__).parent / "data" / "alibaba-gpu-v2023"
BUNDLED: Final = DATA / "csv.tar.xz"
"""The trace the package ships: every ``openb_*.csv`` and ``fgd_published_summary.csv``."""
SUMS: Final = "SHA256SUMS"
ARCHIVE_SUFFIX: Final = ".tar.xz"
TRACE_HELP: Final = (
    "a folder of the trace's CSV files, or a .tar.xz of them with SHA256SUMS beside it "
    "(default: the trace shoal ships)"
)


def is_archive(trace: Path) -> bool:
    return trace.name.endswith(ARCHIVE_SUFFIX)


def _sums(path: Path) -> dict[str, str]:
    """``SHA256SUMS`` (``sha256sum``'s format): file name → hex digest."""
    try:
        text = path.read_text()
    except OSError as err:
        raise InputError(
            f"cannot read: {err.strerror} (an archive needs its SHA256SUMS beside it)",
            location=str(path),
        ) from None
    out = {}
    for line, row in enumerate(text.splitlines(), start=1):
        if not row.strip():
            continue
        digest, _, name = row.partition(" ")
        name = name[1:] if name[:1] in (" ", "*") else name  # text or binary mode
        if len(digest) != 64 or not name:
            raise InputError("not 'DIGEST  NAME'", location=f"{path}: line {line}")
        out[name] = digest.lower()
    return out


@functools.lru_cache(maxsize=2)
def _archive(path: Path) -> dict[str, bytes]:
    """The members of the archive at ``path``, each checked against its SHA256SUMS."""
    sums = _sums(path.parent / SUMS)
    members: dict[str, bytes] = {}
    try:
        with tarfile.open(path, "r:xz") as tar:
            for member in tar:
                handle = tar.extractfile(member) if member.isfile() else None
                if handle is not None:
                    members[member.name] = handle.read()
    except OSError as err:
        reason = err.strerror or str(err)
        raise InputError(f"cannot read: {reason}", location=str(path)) from None
    except (tarfile.TarError, lzma.LZMAError, EOFError) as err:
        raise InputError(f"not a readable .tar.xz: {err}", location=str(path)) from None
    for name, data in members.items():
        want = sums.get(name)
        if want is None:
            raise InputError(f"has no line in {path.parent / SUMS}", location=f"{path}: {name}")
        if hashlib.sha256(data).hexdigest() != want:
            raise InputError(
                f"SHA-256 differs from {path.parent / SUMS}: the archive is damaged or altered",
                location=f"{path}: {name}",
            )
    return members


def location(trace: Path, name: str) -> str:
    """How messages name file ``name`` of ``trace`` (a path into the archive for one)."""
    return str(trace / name)


def names(trace: Path) -> list[str]:
    """The file names ``trace`` holds, sorted."""
    if is_archive(trace):
        return sorted(_archive(trace))
    try:
        return sorted(p.name for p in trace.iterdir() if p.is_file())
    except OSError:
        return []


def has(trace: Path, name: str) -> bool:
    if is_archive(trace):
        return trace.is_file() and name in _archive(trace)
    return (trace / name).is_file()


def read_text(trace: Path, name: str) -> str:
    """File ``name`` of ``trace`` as text; :class:`InputError` naming it when it is
    missing or unreadable."""
    if is_archive(trace):
        data = _archive(trace).get(name)
        if data is None:
            raise InputError("not in the archive", location=location(trace, name))
    else:
        try:
            data = (trace / name).read_bytes()
        except OSError as err:
            raise InputError(
                f"cannot read: {err.strerror}", location=location(trace, name)
            ) from None
    try:
        return data.decode()
    except UnicodeDecodeError as err:
        raise InputError(
            f"not UTF-8 text (byte {err.start})", location=location(trace, name)
        ) from None


def trace_source(given: Path | None, node_file: str) -> Path:
    """The trace a command reads: ``--trace`` if given (a folder, or a ``.tar.xz`` with
    its SHA256SUMS beside it), else the bundled one; refused without ``node_file``."""
    trace = given if given is not None else BUNDLED
    if not has(trace, node_file):
        raise InputError(
            f"the Alibaba GPU trace is not there ({node_file} missing)",
            location=f"--trace {trace}" if given is not None else str(trace),
        )
    return trace.resolve()
