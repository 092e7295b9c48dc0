import os
from pathlib import Path

import pytest

import specstream_mlx  # noqa: F401  (loads OpenBLAS before mlx is imported by the tests)

from .tiny import FAMILIES, save_tiny_model

REPO = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("SPECSTREAM_DATA", REPO.parent / "shared" / "data"))


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
    path = DATA / "wikitext2" / "valid.txt"
    if not path.is_file():
        pytest.fail(f"real data missing: {path} (set SPECSTREAM_DATA to ../shared/data)")
    return path.read_text()
