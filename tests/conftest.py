import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def seed_torch():
    """Every test starts from the same RNG state, so random inputs and weights are reproducible."""
    torch.manual_seed(0)
    yield
