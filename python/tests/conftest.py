import os
import subprocess
import sys
import textwrap

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
    """One cache directory for the run's generated extensions (the compiled path), so that each
    compiles once; PARASEQ_CACHE_DIR when set. pytest-xdist's workers share it (their temporary
    directories' parent): the extensions' file lock lets one compile while the others wait."""
    if os.environ.get("PARASEQ_CACHE_DIR"):
        yield
        return
    run_directory = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        run_directory = run_directory.parent
    cache = run_directory / "paraseq-cache"
    cache.mkdir(exist_ok=True)
    os.environ["PARASEQ_CACHE_DIR"] = str(cache)
    yield
    del os.environ["PARASEQ_CACHE_DIR"]


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


def assert_steps_reproduce_the_solve(cell, x, initials, backends):
    """Decoding with cell.step from each initial state (None: zero) reproduces, step by step, what
    newton_apply solved over x with T iterations of each backend (exact after T of them)."""
    T = x.shape[1]
    for initial in initials:
        for backend in backends:
            solved = paraseq.newton_apply(cell, x, paraseq.NewtonConfig(max_iters=T, scan_backend=backend), h0=initial)
            state = initial
            for t in range(T):
                state = cell.step(state, x[:, t])
                torch.testing.assert_close(state, solved[:, t], rtol=1e-12, atol=1e-12)


def graph_break_count(fn, *args):
    torch._dynamo.reset()
    return torch._dynamo.explain(fn)(*args).graph_break_count


def cached_use_in_a_new_process(setup, call):
    """Runs `setup`, then times `call`, in a new Python process that imports from this folder;
    returns that process's extension compiles and loads (paraseq._extension_build.statistics) and
    the call's seconds."""
    script = "\n".join(["import time", "from paraseq import _extension_build", textwrap.dedent(setup),
                        "start = time.perf_counter()", textwrap.dedent(call),
                        "seconds = time.perf_counter() - start",
                        'print(_extension_build.statistics["compiles"], _extension_build.statistics["loads"], seconds)'])
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__)] + sys.path))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment,
                            check=True)
    compiles, loads, seconds = result.stdout.split()
    return int(compiles), int(loads), float(seconds)
