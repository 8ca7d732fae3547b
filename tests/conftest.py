import os

import torch

if not torch.cuda.is_available():
    # Triton kernels run on CPU tensors under the interpreter; it must be set before they are imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", deadline=None, max_examples=30, derandomize=True, print_blob=True)
settings.register_profile("dev", deadline=None, max_examples=30)
settings.register_profile("hunt", deadline=None, max_examples=500)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))

HEAD_DIMS = (64, 80, 96, 128, 256)
BITS = (2, 3, 4, 8)
METHODS = ("affine", "turbo")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fresh_dynamo():
    """Compiled-model tests start and end with no Dynamo caches and zeroed counters (they assert on both)."""
    from turboquant.compat import dynamo_counters

    torch._dynamo.reset()
    dynamo_counters().clear()
    yield
    torch._dynamo.reset()
