import os
from pathlib import Path

import pytest

import specstream_mlx  # noqa: F401  (loads OpenBLAS before mlx is imported by the tests)

from .tiny import FAMILIES, save_tiny_model

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "data"
# What the tests read: a few real rows of each data set in the full data's layout
# (tests/fixtures/data, with their licences), so that a clone passes its tests alone.
# SPECSTREAM_DATA points them at the full data sets instead.
DATA = Path(os.environ.get("SPECSTREAM_DATA", FIXTURES))
# The full data sets (training and benchmarks): only tests of figures of whole files read them.
FULL_DATA = Path(os.environ.get("SPECSTREAM_DATA", REPO.parent / "shared" / "data"))


def full_data_file(relative: str) -> Path:
    """A file of the full data sets; the calling test is skipped when they are absent."""
    path = FULL_DATA / relative
    if not path.is_file():
        pytest.skip(
            f"needs the full data set {path} (../shared/data, or set SPECSTREAM_DATA); "
            "tests/fixtures/data holds a few rows only"
        )
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


@pytest.fixture(scope="session")
def wikitext_valid() -> str:
    """The start of WikiText-2's validation text (the fixture holds enough for 1,024 tokens)."""
    return (DATA / "wikitext2" / "valid.txt").read_text()
