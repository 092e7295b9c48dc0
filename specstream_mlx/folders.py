"""Folders written atomically: built beside their target, then renamed into place."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import SpecstreamError


@contextmanager
def staged_folder(target: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """A new folder beside `target` to build in. When the block ends it takes `target`'s name
    (an existing folder is moved aside first and removed last, so a reader finds the old folder
    or the new one, never neither); when the block raises it is removed."""
    target = Path(target)
    if target.exists() and not overwrite:
        raise SpecstreamError(f"output folder exists: {target} (pass --overwrite to replace it)")
    if target.exists() and not target.is_dir():
        raise SpecstreamError(f"output {target} exists and is not a folder")
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
