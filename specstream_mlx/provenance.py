"""Where a measured figure comes from: the code's git commit, package versions and the machine,
recorded in bench and calibrate JSON so every figure in the docs can be traced and rerun."""

from __future__ import annotations

import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

PACKAGES = ("specstream-mlx", "mlx", "mlx-lm", "numpy")


def git_commit() -> str | None:
    """The checkout's commit (with "+dirty" when files differ from it); None outside git."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def provenance() -> dict:
    """{"commit", "versions": {package: version}, "machine": {platform, chip, python}}."""
    from .calibration import machine_id

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    return {
        "commit": git_commit(),
        "versions": versions,
        "machine": {
            "platform": platform.platform(),
            "chip": machine_id(),
            "python": platform.python_version(),
        },
    }
