"""TRPO's optimizer: conjugate gradient against numpy's solve, the line search's accept/reject rule, and a trust
region step that keeps its KL bound."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from apexrl.agents.trpo import conjugate_gradient, line_search, trust_region_step
from tests.torch_helpers import one_thread  # noqa: F401  (fixture)


def test_conjugate_gradient_solves_a_small_spd_system_as_numpy_does():
    rng = np.random.default_rng(0)
    m = rng.normal(size=(5, 5))
    a = m @ m.T + 5 * np.eye(5)  # symmetric positive definite
    b = rng.normal(size=5)
    x = conjugate_gradient(lambda v: a @ v, b, steps=5)  # n steps solve an n-dimensional system
    # (to the 1e-8 Tonic adds to each step size's denominator)
    np.testing.assert_allclose(x, np.linalg.solve(a, b), rtol=1e-4)
    rough = conjugate_gradient(lambda v: a @ v, b, steps=2)
    assert np.linalg.norm(a @ rough - b) < np.linalg.norm(b)  # fewer steps: nearer, not there
    assert conjugate_gradient(lambda v: a @ v, np.zeros(5), steps=5) is None


def test_the_line_search_accepts_the_first_step_within_the_kl_bound_that_does_not_raise_the_loss():
    tried = []

    def evaluate(fraction):  # KL grows with the step; the loss is lowest near half the step
        tried.append(fraction)
        return 0.04 * fraction**2, (fraction - 0.5) ** 2 - 0.25

    # full step: KL 0.04 > 0.01; 0.5: KL 0.01, loss -0.25 <= 0: accepted
    got = line_search(evaluate, start_loss=0.0, max_kl=0.01, steps=10, coeff=0.5)
    assert (got.fraction, got.trials, got.kl, got.loss) == (0.5, 2, pytest.approx(0.01), pytest.approx(-0.25))
    assert tried == [1.0, 0.5]
    # a loss that only rises: every trial rejected, the start restored
    tried.clear()
    got = line_search(lambda f: (tried.append(f), (0.0, 1.0 + f))[1], start_loss=0.5, max_kl=0.01, steps=3, coeff=0.5)
    assert (got.fraction, got.trials) == (0.0, 3) and tried == [1.0, 0.5, 0.25, 0.0]


def test_a_trust_region_step_improves_the_loss_within_the_kl_bound():
    torch.manual_seed(0)
    logits = torch.zeros(3, requires_grad=True)
    old = torch.distributions.Categorical(logits=torch.zeros(3))
    adv = torch.tensor([1.0, 0.0, -1.0])

    def loss_fn():
        return -(torch.softmax(logits, 0) * adv).sum()  # surrogate: raise the good action's probability

    def kl_fn():
        return torch.distributions.kl_divergence(torch.distributions.Categorical(logits=logits), old)

    start = loss_fn().item()
    got = trust_region_step(
        loss_fn, kl_fn, [logits], cg_steps=10, damping=0.1, max_kl=0.01, backtrack_steps=10, backtrack_coeff=0.8
    )
    assert got.fraction > 0 and got.kl <= 0.01 and loss_fn().item() < start
    assert kl_fn().item() == pytest.approx(got.kl)
    assert torch.argmax(logits).item() == 0
