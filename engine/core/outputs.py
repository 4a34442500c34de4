"""Output files and run folders that never overwrite by accident and never end half-written.

Checks run before any work (`check_output_file`, `check_output_dir`): an existing non-empty
output is refused unless `force`, and the location must be writable. One rule, in one function
(`refuse_input_overlap`), holds for every command that writes: an output that is, contains, or
is inside an input (symbolic links resolved) is refused, and `force` never overrides it. A name
that names no file or folder of its own (empty, `.`, `..`) is refused too; `-` (standard
output) is the caller's to allow (`is_stdout`). Writing goes to a temporary name in the same
folder, renamed into place at the end (`staged_file`, `staged_dir`), so an interrupted run
leaves the previous results as they were, and a replaced run folder never mixes two runs' files.

Lives in engine/ because both the engine's `ReplayResult.write` and the simulator's
`SimResult.save` use it (engine/ imports neither sim/ nor advisor/).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

# Files a costline run folder holds (simulator and engine); --force replaces only such folders,
# so a mistyped `--out .` cannot wipe a folder of other things.
RUN_FILES = frozenset({
    "requests.parquet", "requests.csv", "requests.jsonl", "steps.parquet", "steps.csv", "steps.jsonl",
    "summary.json", "metrics.prom", "scheduler_stats.json",
    # `costline advise --out` (advisor/advise/report.py)
    "recommendation.json", "report.md", "serve.sh", "alerts.yaml", "ladder.png", "cost_lines.png", "latency_cdf.png",
})


class OutputPathError(ValueError):
    """An output location that must not or cannot be written; the message names the option."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


STDOUT = "-"


def is_stdout(path: str | Path | None) -> bool:
    """Whether an output option names standard output (`-o -`)."""
    return path is not None and str(path) == STDOUT


def _real(p: Path) -> Path:
    """`p` with every symbolic link resolved (the missing tail of a path taken as written)."""
    return Path(os.path.realpath(p))


def _existing_inputs(inputs: Iterable[str | Path | None]) -> list[Path]:
    """The inputs that name files or folders on disk (a preset name is not a path)."""
    return [Path(p) for p in inputs if p is not None and str(p) and os.path.lexists(p)]


def refuse_input_overlap(path: str | Path, inputs: Iterable[str | Path | None], flag: str) -> None:
    """The one rule for every output: refused when it is an input, contains one (a folder
    holding it) or is inside one (a file or folder in an input folder), after resolving
    symbolic links. No `--force` overrides it: writing there would destroy or mix into an input."""
    out = _real(Path(path))
    for src in _existing_inputs(inputs):
        real = _real(src)
        same = out == real or (out.exists() and real.exists() and os.path.samefile(out, real))
        if same:
            raise OutputPathError(f"{flag} {path} is also the input {src}: writing it would destroy the "
                                  f"input (--force never overrides this); choose another {flag}")
        if real.is_relative_to(out):
            raise OutputPathError(f"{flag} {path} holds the input {src}: replacing it would destroy the "
                                  f"input (--force never overrides this); choose another {flag}")
        if out.is_relative_to(real):
            raise OutputPathError(f"{flag} {path} is inside the input {src}: writing there would change "
                                  f"the input (--force never overrides this); choose a {flag} outside it")


def _refuse_no_name(path: Path, flag: str, noun: str) -> None:
    """An output must name a file or folder of its own: not empty, `.`, `..` or `-`."""
    example = f"{flag} {'runs/a' if noun == 'folder' else 'out.json'}"
    if is_stdout(path):
        raise OutputPathError(f"{flag} -: this command writes a {noun}, not standard output; give its name, "
                              f"e.g. {example}")
    if path.name in ("", ".", ".."):
        raise OutputPathError(f"{flag} {str(path)!r} is empty or names no {noun} of its own ('.', '..'); give "
                              f"a new name, e.g. {example}")


def _probe_writable(folder: Path, flag: str, path: Path) -> None:
    """Create and remove a file in `folder`: the only check that also holds for root and for
    read-only mounts (os.access answers for permissions alone)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".costline-probe-", dir=folder)
    except OSError as exc:
        raise OutputPathError(f"{flag} {path}: cannot write in {folder} ({exc.strerror}); "
                              f"choose a writable location") from None
    os.close(fd)
    os.unlink(probe)


def check_output_file(path: str | Path, *, flag: str, force: bool = False,
                      inputs: Iterable[str | Path | None] = (), force_hint: str = "--force") -> Path:
    """Refuse `path` as an output file unless it can be written now without losing anything.
    `flag` and `force_hint` are how the caller spells the option and the override."""
    path = Path(path)
    _refuse_no_name(path, flag, "file")
    refuse_input_overlap(path, inputs, flag)
    if path.is_dir():
        raise OutputPathError(f"{flag} {path} is a folder; give a file name, e.g. {path / 'out.json'}")
    if path.exists() and not path.is_file():
        raise OutputPathError(f"{flag} {path} is not a regular file; give a file name in a folder")
    if path.exists() and path.stat().st_size > 0 and not force:
        raise OutputPathError(f"{flag} {path} already exists; pass {force_hint} to replace it, "
                              f"or choose another {flag}")
    parent = path.parent
    if not parent.is_dir():
        what = "is a file" if parent.exists() else "does not exist"
        raise OutputPathError(f"{flag} {path}: the folder {parent} {what}; create the folder first or "
                              f"choose another {flag}")
    _probe_writable(parent, flag, path)
    return path


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists():
        p = p.parent
    return p


def check_output_dir(path: str | Path, *, flag: str, force: bool = False,
                     inputs: Iterable[str | Path | None] = (), force_hint: str = "--force") -> Path:
    """Refuse `path` as a run folder unless it can be written now without losing anything.
    A missing folder (and its parents) is created only when the run is written."""
    path = Path(path)
    _refuse_no_name(path, flag, "folder")
    refuse_input_overlap(path, inputs, flag)
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"{flag} {path} is a file; give a folder for the run's files")
    if path.is_dir() and any(path.iterdir()):
        if not force:
            raise OutputPathError(f"{flag} {path} already holds a run; pass {force_hint} to replace it, "
                                  f"or choose another {flag}")
        foreign = sorted(p.name for p in path.iterdir() if p.name not in RUN_FILES or not p.is_file())
        if foreign:
            raise OutputPathError(f"{flag} {path} holds files no costline run wrote ({', '.join(foreign[:3])}); "
                                  f"{force_hint} replaces only run folders: choose another {flag}")
    base = _nearest_existing(path)
    if not base.is_dir():
        raise OutputPathError(f"{flag} {path}: {base} is a file, so no folder can be made there; "
                              f"choose another {flag}")
    _probe_writable(base, flag, path)
    return path


@contextmanager
def staged_file(path: str | Path) -> Iterator[Path]:
    """A temporary file next to `path` (same name at the end, so its suffix still tells the
    format); renamed onto `path` when the block ends normally, removed when it fails."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=".partial-", suffix="-" + path.name, dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
    except BaseException:  # an interrupt too: the previous file stays, no partial one is left
        tmp.unlink(missing_ok=True)
        raise
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 is not what a plain open() gives
        os.replace(tmp, path)
    except OSError as exc:
        raise OutputPathError(f"could not move the finished {tmp} onto {path} ({exc.strerror}); "
                              f"the output is in {tmp}") from None


@contextmanager
def staged_dir(path: str | Path) -> Iterator[Path]:
    """A temporary folder next to `path`; when the block ends normally it takes `path`'s place
    (a folder already there is renamed aside, then removed), when it fails it is removed.
    Call `check_output_dir` first: this replaces whatever is at `path`. A symbolic link is
    followed: the run replaces the folder it points to."""
    path = Path(path)
    if path.is_symlink():
        path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.partial-", dir=path.parent))
    try:
        yield tmp
    except BaseException:  # an interrupt too: the previous run stays, no partial one is left
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _swap_in(tmp, path)


def _swap_in(tmp: Path, path: Path) -> None:
    """Move the finished folder `tmp` to `path`, the folder there (if any) aside and away.
    Two renames: between them `path` is briefly absent, never half-written."""
    old = path.parent / f"{tmp.name.replace('.partial-', '.old-', 1)}"  # unique: mkdtemp chose tmp's name
    moved_aside = False
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 is not what a plain mkdir gives
        if path.exists():
            os.replace(path, old)
            moved_aside = True
        os.replace(tmp, path)
    except OSError as exc:
        if moved_aside and not path.exists():
            os.replace(old, path)  # the previous run back where it was
        raise OutputPathError(f"could not move the finished run from {tmp} to {path} ({exc.strerror}); "
                              f"the results are in {tmp}") from None
    shutil.rmtree(old, ignore_errors=True)


__all__ = ["RUN_FILES", "STDOUT", "OutputPathError", "check_output_dir", "check_output_file", "is_stdout",
           "refuse_input_overlap", "staged_dir", "staged_file"]
