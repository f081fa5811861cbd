"""TFRMSProp: TensorFlow's centered RMSProp, the Ape-X paper's optimiser, pinned on hand-set numbers."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from apexrl.agents import DQNLearner
from apexrl.agents.optim import TFRMSProp
from apexrl.launch.presets import get_preset
from tests.agents.test_dqn import SMALL, VEC, params, random_batch, through_safetensors
from tests.torch_helpers import one_thread  # noqa: F401 - an autouse fixture

LR, DECAY, EPS = 0.1, 0.95, 1.5e-7


def _steps(grads: list[list[float]], **kw) -> tuple[torch.Tensor, TFRMSProp]:
    w = torch.tensor([1.0, -2.0], dtype=torch.float64, requires_grad=True)
    opt = TFRMSProp([w], lr=LR, decay=DECAY, eps=EPS, **kw)
    for g in grads:
        w.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
    return w.detach(), opt


def test_one_centered_step_divides_by_the_root_of_variance_plus_eps():
    g = [0.5, 2.5e-6]
    w, opt = _steps([g])
    for i, (w0, gi) in enumerate(zip([1.0, -2.0], g)):
        ms = DECAY * 1.0 + (1 - DECAY) * gi * gi  # ms starts at 1, as TensorFlow's does
        mg = (1 - DECAY) * gi
        assert w[i].item() == pytest.approx(w0 - LR * gi / math.sqrt(ms - mg * mg + EPS), rel=1e-12)
    assert set(opt.state[opt.param_groups[0]["params"][0]]) == {"ms", "mg"}


def test_two_steps_accumulate_and_momentum_and_the_uncentered_form():
    g1, g2 = [0.3, -0.1], [0.2, 0.4]
    w, _ = _steps([g1, g2], momentum=0.9)
    for i, w0 in enumerate([1.0, -2.0]):
        ms, mg, mom, x = 1.0, 0.0, 0.0, w0
        for g in (g1[i], g2[i]):
            ms = DECAY * ms + (1 - DECAY) * g * g
            mg = DECAY * mg + (1 - DECAY) * g
            mom = 0.9 * mom + LR * g / math.sqrt(ms - mg * mg + EPS)
            x -= mom
        assert w[i].item() == pytest.approx(x, rel=1e-12)
    w, opt = _steps([g1], centered=False)
    ms = DECAY + (1 - DECAY) * g1[0] ** 2
    assert w[0].item() == pytest.approx(1.0 - LR * g1[0] / math.sqrt(ms + EPS), rel=1e-12)
    assert "mg" not in opt.state[opt.param_groups[0]["params"][0]]


def test_at_atari_gradient_sizes_its_steps_are_far_smaller_than_pytorchs():
    # Gradients of the size an Atari network sees at batch 512 (|g| ~ 2.5e-6): PyTorch divides by
    # sqrt(v) + eps ~ 2.5e-6, TensorFlow by sqrt(v + eps) ~ 3.9e-4 -- two orders of magnitude apart.
    rng = np.random.default_rng(0)
    grads = rng.normal(0.0, 2.5e-6, size=(300, 64))
    moved = {}
    for name, make in (
        ("tf", lambda p: TFRMSProp(p, lr=1e-4, decay=DECAY, eps=EPS, initial_ms=0.0)),
        ("torch", lambda p: torch.optim.RMSprop(p, lr=1e-4, alpha=DECAY, eps=EPS, centered=True)),
    ):
        w = torch.zeros(64, dtype=torch.float64, requires_grad=True)
        opt = make([w])
        for g in grads:
            w.grad = torch.from_numpy(g)
            opt.step()
        moved[name] = w.detach().abs().mean().item()
    assert 10 < moved["torch"] / moved["tf"] < 1000, moved


def test_bad_settings_are_refused():
    for kw in ({"lr": 0.0}, {"decay": 1.0}, {"eps": 0.0}, {"momentum": -1.0}, {"lr": math.nan}):
        with pytest.raises(ValueError, match="TFRMSProp: invalid"):
            TFRMSProp([torch.zeros(1, requires_grad=True)], **{"lr": 0.1, **kw})


def test_the_paper_preset_uses_it_and_a_checkpoint_keeps_it():
    assert get_preset("apex-dqn-atari").agent_config().optimizer == "rmsprop_tf"
    assert get_preset("cartpole").agent_config().optimizer == "rmsprop"
    with pytest.raises(ValueError, match="optimizer must be 'rmsprop' or 'rmsprop_tf'"):
        dataclasses.replace(SMALL, optimizer="adam")
    config = dataclasses.replace(SMALL, optimizer="rmsprop_tf")
    rng = np.random.default_rng(0)
    batches = [random_batch(rng) for _ in range(4)]
    a = DQNLearner(VEC, config, seed=0)
    assert isinstance(a.optimizer, TFRMSProp)
    for b in batches[:2]:
        a.update(b, np.ones(8))
    ckpt = through_safetensors(a.state_dict())
    assert {"optim/q_net/0/ms", "optim/q_net/0/mg"} <= set(ckpt)
    b = DQNLearner(VEC, config, seed=9)
    b.load_state_dict(ckpt)
    assert isinstance(b.optimizer, TFRMSProp)
    for batch in batches[2:]:
        np.testing.assert_array_equal(a.update(batch, np.ones(8))[0], b.update(batch, np.ones(8))[0])
    for x, y in zip(params(a.q_net), params(b.q_net)):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-6)


def test_fused_adam_takes_the_plain_adam_step_and_shares_its_checkpoint_layout():
    """make_adam's fused Adam (where this torch has it) steps as the for-each Adam does, and the state of one
    loads into the other: checkpoints of either kind resume on both."""
    from apexrl.agents.common import (
        check_tensors,
        expected_optimizer_tensors,
        load_optimizer_tensors,
        optimizer_tensors,
    )
    from apexrl.agents.optim import fused_adam_works, make_adam

    assert fused_adam_works("cpu") in (True, False)
    g = torch.Generator().manual_seed(0)
    init = [torch.randn(4, 3, generator=g), torch.randn(3, generator=g)]
    grads = [[torch.randn(4, 3, generator=g), torch.randn(3, generator=g)] for _ in range(3)]
    fused_params = [p.clone().requires_grad_(True) for p in init]
    plain_params = [p.clone().requires_grad_(True) for p in init]
    fused = make_adam(fused_params, lr=1e-2, eps=1e-8)
    plain = torch.optim.Adam(plain_params, lr=1e-2, eps=1e-8)
    assert fused.defaults.get("fused") == (True if fused_adam_works("cpu") else None)
    for step in grads:
        for opt, ps in ((fused, fused_params), (plain, plain_params)):
            for p, gr in zip(ps, step):
                p.grad = gr.clone()
            opt.step()
    for a, b in zip(fused_params, plain_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    saved = optimizer_tensors("net", fused)
    check_tensors(expected_optimizer_tensors("net", plain, saved), saved, "fused Adam state")  # names, shapes, dtypes
    load_optimizer_tensors("net", plain, saved)
    assert all(
        torch.equal(plain.state[p]["exp_avg"], fused.state[q]["exp_avg"]) for p, q in zip(plain_params, fused_params)
    )


def test_apexrl_fused_adam_0_gives_the_plain_adam(monkeypatch):
    from apexrl.agents.optim import FUSED_ADAM_ENV, make_adam

    monkeypatch.setenv(FUSED_ADAM_ENV, "0")
    assert not make_adam([torch.zeros(2, requires_grad=True)], lr=1e-3, eps=1e-8).defaults.get("fused")
