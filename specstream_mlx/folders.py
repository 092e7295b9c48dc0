"""Folders written atomically: built beside their target, then renamed into place."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import SpecstreamError

# what the folders this package writes hold (an MLX or PyTorch adapter, an exported model, a
# training checkpoint): --overwrite replaces an empty folder or one holding one of these, never
# another kind of folder
MARKERS = ("adapter_config.json", "stream_config.json", "config.json", "progress.json")


def check_replaceable(target: str | os.PathLike) -> None:
    """Raises unless `target`, an existing folder, may be replaced by a written one: not the
    root, not the current folder or one above it, and empty or one of ours (MARKERS)."""
    path = Path(os.path.abspath(target)).resolve()
    here = Path.cwd().resolve()
    if path == here or path in here.parents:
        raise SpecstreamError(
            f"{target} is the current folder or holds it: give the folder to write itself "
            "(for example ./my-adapter)"
        )
    if path.is_dir() and any(path.iterdir()) and not any((path / m).is_file() for m in MARKERS):
        raise SpecstreamError(
            f"{target} holds files that are not an adapter, model or checkpoint (none of "
            f"{', '.join(MARKERS)}): not replaced; give a new folder or remove it first"
        )


@contextmanager
def staged_folder(target: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """A new folder beside `target` to build in. When the block ends it takes `target`'s name
    (an existing folder is moved aside first and removed last, so a reader finds the old folder
    or the new one, never neither); when the block raises it is removed."""
    given, target = target, Path(os.path.abspath(target))  # "." or "" names the folder itself
    if target.exists() and not target.is_dir():
        raise SpecstreamError(f"output {given} exists and is not a folder")
    if target.exists() and not overwrite:
        raise SpecstreamError(f"output folder exists: {given} (pass --overwrite to replace it)")
    blocking = next((p for p in target.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise SpecstreamError(f"cannot write {given}: {blocking} is a file, not a folder")
    if target.exists():
        check_replaceable(given)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    except OSError as exc:
        raise SpecstreamError(f"cannot write {target}: {exc.strerror or exc}") from None
    tmp.chmod(0o755)  # mkdtemp makes it private; these are ordinary folders
    try:
        yield tmp
        _move_into_place(tmp, target)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SpecstreamError(f"cannot write {target}: {exc}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _move_into_place(tmp: Path, target: Path) -> None:
    old = target.with_name(f".{target.name}.old")
    moved = target.exists()
    if moved:
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
    try:
        os.replace(tmp, target)
    except OSError:
        if moved:
            os.replace(old, target)  # the previous folder goes back
        raise
    shutil.rmtree(old, ignore_errors=True)
