import os
import random
import tempfile

# A private compile cache for this test session (set before libkiln loads).
os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-pytest-cache-"))

import pytest  # noqa: E402
import torch  # noqa: E402

import kiln  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_state():
    """Each test starts with a clean Dynamo cache and a fresh, printed seed,
    so random inputs differ from run to run and a failure can be replayed
    with KILN_TEST_SEED."""
    torch._dynamo.reset()
    seed = int(os.environ.get("KILN_TEST_SEED", random.randrange(2 ** 31)))
    torch.manual_seed(seed)
    print(f"seed {seed}")
    yield
    torch._dynamo.reset()


# Tolerances per dtype for model outputs against eager: kiln and PyTorch
# accumulate in different orders, and half types round every op.
TOL = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float64: dict(atol=1e-10, rtol=1e-9),
    torch.bfloat16: dict(atol=5e-2, rtol=5e-2),
    torch.float16: dict(atol=5e-3, rtol=5e-3),
}


def partitioned(fn, *inputs):
    """fn traced to ATen (with tensor metadata) and compiled by kiln's
    partitioner, as AOTAutograd would hand it over."""
    from torch.fx.experimental.proxy_tensor import make_fx
    gm = make_fx(fn)(*inputs)
    opts = kiln.backend.parse_options(None, None)
    return kiln.backend.compile_graph(gm, inputs, opts, "forward")
