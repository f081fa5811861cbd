"""Helpers shared by the agent tests (import into a test module; the fixture applies there)."""

from __future__ import annotations

import pytest
import torch
from torch import nn


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread per test: the machine has 2 cores and other tests run beside these."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def set_linear(layer: nn.Linear, weight, bias) -> None:
    """Hand-set a linear layer's weights, so expected values can be computed by hand."""
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weight, dtype=torch.float32))
        layer.bias.copy_(torch.tensor(bias, dtype=torch.float32))
