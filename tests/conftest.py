import os
from pathlib import Path

import pytest

import specstream_mlx  # noqa: F401  (loads OpenBLAS before mlx is imported by the tests)
from specstream_mlx.training.trainer import Hooks

from .synthetic_data import write_synthetic_data
from .tiny import FAMILIES, save_tiny_model

QUIET = Hooks(log=lambda s: None)  # what tests that train pass when the log is not checked

REPO = Path(__file__).resolve().parent.parent
# The real data sets (../shared/data, never copied into the repository); SPECSTREAM_DATA moves
# them, and a path that does not exist runs the tests on the synthetic data alone.
REAL_DATA = Path(os.environ.get("SPECSTREAM_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session", autouse=True)
def own_calibrations(tmp_path_factory):
    """The run's latency curves go to a cache of its own (tiny models' curves used to pile up in
    the user's ~/.cache, and a stale one could gate a later run's decoding), while the real
    models converted into the user's cache stay shared with it through links."""
    user = Path(os.environ.get("SPECSTREAM_CACHE", Path.home() / ".cache" / "specstream_mlx"))
    own = tmp_path_factory.mktemp("cache")
    for shared in ("models", "gguf"):
        (user / shared).mkdir(parents=True, exist_ok=True)
        (own / shared).symlink_to(user / shared, target_is_directory=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECSTREAM_CACHE", str(own))
        yield own


@pytest.fixture(scope="session")
def data(tmp_path_factory) -> Path:
    """The data folder the tests read: the real data sets where they are, otherwise invented
    ones in the same layout and row shapes (tests/synthetic_data.py), so a clone passes alone."""
    if REAL_DATA.is_dir():
        return REAL_DATA
    return write_synthetic_data(tmp_path_factory.mktemp("synthetic-data"))


def real_data_file(relative: str) -> Path:
    """A file of the real data sets, for the few tests of figures measured on the real data; the
    calling test is skipped, with the reason, where they are absent."""
    path = REAL_DATA / relative
    if not path.is_file():
        pytest.skip(f"measures the real {relative}, absent here: {path} (set SPECSTREAM_DATA)")
    return path


@pytest.fixture(scope="session")
def default_model():
    """The real default model (SmolLM2-135M-Instruct), loaded once for the whole run."""
    return specstream_mlx.load()


@pytest.fixture(scope="session")
def tiny_folders(tmp_path_factory):
    """family -> folder of a tiny random model saved in mlx-lm format."""
    root = tmp_path_factory.mktemp("tiny")
    return {family: save_tiny_model(root / family, family) for family in FAMILIES}
