import os

import pytest
import torch

import paraseq  # noqa: F401  (loads the operators)
from paraseq.info import kernel_devices


def tested_devices():
    """PARASEQ_TEST_DEVICES (device types, comma separated, e.g. "cpu,cuda") when set; otherwise cpu,
    and cuda when torch sees a GPU and this build has CUDA kernels."""
    configured = os.environ.get("PARASEQ_TEST_DEVICES")
    if configured:
        return [name.strip() for name in configured.split(",") if name.strip()]
    has_cuda = torch.cuda.is_available() and "CUDA" in kernel_devices("linear_scan")
    return ["cpu"] + (["cuda"] if has_cuda else [])


DEVICES = tested_devices()

# The CUDA-only tests are not collected without cuda: they are absent, not skipped.
collect_ignore = [] if "cuda" in DEVICES else ["test_cuda.py"]


def pytest_generate_tests(metafunc):
    """Every test that takes `device` runs once per tested device (ids: test_x[cuda-...])."""
    if "device" in metafunc.fixturenames:
        metafunc.parametrize("device", DEVICES)


@pytest.fixture(scope="session", autouse=True)
def compiled_extension_cache(tmp_path_factory):
    """One cache directory for the session's generated extensions (odeint's compiled path), so
    that each compiles once; PARASEQ_CACHE_DIR when set."""
    if os.environ.get("PARASEQ_CACHE_DIR"):
        yield
        return
    os.environ["PARASEQ_CACHE_DIR"] = str(tmp_path_factory.mktemp("paraseq-cache"))
    yield
    del os.environ["PARASEQ_CACHE_DIR"]


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


def graph_break_count(fn, *args):
    torch._dynamo.reset()
    return torch._dynamo.explain(fn)(*args).graph_break_count
