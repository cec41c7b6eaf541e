import pytest
import torch

import paraseq  # noqa: F401  (loads the operators)


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


def graph_break_count(fn, *args):
    torch._dynamo.reset()
    return torch._dynamo.explain(fn)(*args).graph_break_count
