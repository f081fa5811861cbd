"""R2D2 on sequences made here (the replay does not store sequences yet): value rescaling, the sequence format's
round trip through the codec and the store, burn-in, n-step targets and masking by hand, sequence priorities,
the learner's checkpoints, the preset data, and a memory task it must learn (and a control it must not)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from apexrl import PrioritizedStore
from apexrl.agents import agent_names, get_agent
from apexrl.agents.r2d2 import (
    R2D2_FIELD_SOURCES,
    R2D2_PRESETS,
    R2D2_SOURCE,
    R2D2Config,
    R2D2Learner,
    RecurrentPolicy,
    empty_sequences,
    inverse_value_rescale,
    sequence_loss,
    sequence_priorities,
    sequence_spec,
    valid_steps,
    value_rescale,
)
from apexrl.agents.r2d2.learner import sequences_to_tensors
from apexrl.agents.r2d2.nets import RecurrentQNetwork
from apexrl.envs.base import EnvSpec
from tests.torch_helpers import one_thread  # noqa: F401 - one_thread is an autouse fixture

VEC = EnvSpec("test:vec3", (3,), np.dtype(np.float32), 2, None, 1, 100)
ATARI = EnvSpec("test:atari", (4, 84, 84), np.dtype(np.uint8), 6, None, 4, 27000)
SMALL = R2D2Config(burn_in=3, trace_length=6, n_step=3, gamma=0.9, lstm_size=8, hidden=(8,), stream_hidden=8)


def random_sequences(rng: np.random.Generator, b: int, length: int, config: R2D2Config = SMALL, env=VEC):
    """Full episodes' worth of random steps: every mask True, no terminal, random stored state."""
    out = empty_sequences(b, length, env.obs_shape, env.obs_dtype, config.lstm_size)
    if env.obs_dtype == np.uint8:
        out["obs"][...] = rng.integers(0, 256, out["obs"].shape, dtype=np.uint8)
    else:
        out["obs"][...] = rng.standard_normal(out["obs"].shape)
    out["action"][...] = rng.integers(0, env.num_actions, (b, length))
    out["reward"][...] = rng.standard_normal((b, length))
    out["mask"][...] = True
    out["state_h"][...] = rng.uniform(-1, 1, out["state_h"].shape)
    out["state_c"][...] = rng.uniform(-2, 2, out["state_c"].shape)
    return out


def loss_of(learner: R2D2Learner, batch, weights=None, target=None):
    b = len(batch["obs"])
    w = torch.ones(b) if weights is None else torch.as_tensor(weights, dtype=torch.float32)
    tensors = sequences_to_tensors(batch, learner.device)
    return sequence_loss(learner.q_net, target or learner.target_q_net, tensors, w, learner.config)


def grads_of(learner: R2D2Learner, batch, target=None) -> list[torch.Tensor]:
    learner.q_net.zero_grad(set_to_none=True)
    loss_of(learner, batch, target=target).loss.backward()
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in learner.q_net.parameters()]


def perturbed_target(learner: R2D2Learner, seed: int = 9) -> None:
    """Make the target network differ from the online one (as after some updates)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in learner.target_q_net.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))


# -- value rescaling --------------------------------------------------------------------------------------------


def test_value_rescaling_by_hand():
    x = torch.tensor([0.0, 3.0, -8.0, 0.25], dtype=torch.float64)
    # sqrt(4) - 1 = 1; sqrt(9) - 1 = 2; sqrt(1.25) - 1
    want = torch.tensor([0.0, 1 + 3e-3, -(2 + 8e-3), math.sqrt(1.25) - 1 + 0.25e-3], dtype=torch.float64)
    torch.testing.assert_close(value_rescale(x), want, rtol=0, atol=1e-15)


def test_value_rescaling_and_its_inverse_agree_to_1e_6_over_a_wide_range():
    mags = torch.logspace(-8, 6, 2001, dtype=torch.float64)
    x = torch.cat([-mags.flip(0), torch.zeros(1, dtype=torch.float64), mags])
    back = inverse_value_rescale(value_rescale(x))
    assert torch.all((back - x).abs() <= 1e-6)  # absolute, up to |x| = 1e6 (measured: 5e-10)
    y = torch.linspace(-2000.0, 2000.0, 4001, dtype=torch.float64)  # h(1e6) ~ 2e3: the rescaled range
    assert torch.all((value_rescale(inverse_value_rescale(y)) - y).abs() <= 1e-6)
    # float32 too, as the learner uses it (h^-1 computes in float64 inside)
    x32 = torch.linspace(-1e4, 1e4, 20001)
    back32 = inverse_value_rescale(value_rescale(x32.double())).float()
    assert torch.all((back32 - x32).abs() <= 1e-6 * torch.clamp(x32.abs(), min=1.0))
    assert inverse_value_rescale(torch.zeros(3)).dtype == torch.float32


# -- the sequence format ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("env", [VEC, ATARI], ids=["vector", "frames"])
def test_sequences_and_their_state_round_trip_bit_for_bit_through_the_codec_and_the_store(env):
    rng = np.random.default_rng(0)
    length, b = SMALL.min_sequence_length, 5
    batch = random_sequences(rng, b, length, SMALL, env)
    batch["mask"][1, 7:] = False
    batch["discount"][2, 4] = 0.0
    # states with every kind of float32 bit pattern the LSTM can hold: tiny, subnormal, -0.0, extremes
    special = np.array([1e-38, 1e-45, -0.0, np.finfo(np.float32).max, -np.finfo(np.float32).tiny], np.float32)
    batch["state_h"][0, : len(special)] = special
    batch["state_c"][3, -len(special) :] = special[::-1]
    spec = sequence_spec(env.obs_shape, env.obs_dtype, length, SMALL.lstm_size)
    assert spec.names == ("obs", "action", "reward", "discount", "mask", "state_h", "state_c")
    assert spec["obs"].compress == (env is ATARI)

    data, offsets = spec.encode(batch)
    decoded = spec.decode(data, offsets)
    store = PrioritizedStore(capacity=100, alpha=0.0, shards=2, seed=3)
    keys = store.insert(np.ones(b), data, offsets)
    row_of = {int(k): i for i, k in enumerate(keys)}
    sample = store.sample(3 * b)  # alpha 0, stratified: every item comes back
    sampled = spec.decode_batch(sample)
    rows = np.array([row_of[int(k)] for k in sample.keys])
    assert set(rows.tolist()) == set(range(b))

    for name, original in batch.items():
        for got, want in ((decoded[name], original), (sampled[name], original[rows])):
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert got.tobytes() == want.tobytes(), name  # bit for bit (-0.0 and subnormals included)


def test_a_batch_of_the_wrong_shape_or_too_short_is_refused():
    learner = R2D2Learner(VEC, SMALL, seed=0)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="at least"):
        learner.update(random_sequences(rng, 2, SMALL.min_sequence_length - 1), np.ones(2))
    bad = random_sequences(rng, 2, SMALL.min_sequence_length)
    bad["state_h"] = bad["state_h"][:, :-1]
    with pytest.raises(ValueError, match="state_h"):
        learner.update(bad, np.ones(2))
    with pytest.raises(ValueError, match="missing"):
        learner.update({k: v for k, v in random_sequences(rng, 2, 10).items() if k != "mask"}, np.ones(2))


# -- burn-in ------------------------------------------------------------------------------------------------------


def test_burn_in_steps_pass_no_gradient_and_change_the_loss_only_through_the_state():
    rng = np.random.default_rng(1)
    learner = R2D2Learner(VEC, SMALL, seed=1)
    net, s = learner.q_net, SMALL.burn_in
    batch = random_sequences(rng, 4, SMALL.min_sequence_length + 2)

    # No gradient reaches the burn-in observations or the stored state; the trained steps' observations get one.
    tensors = sequences_to_tensors(batch, learner.device)
    for k in ("obs", "state_h", "state_c"):
        tensors[k].requires_grad_(True)
    out = sequence_loss(net, net, tensors, torch.ones(4), SMALL)
    out.loss.backward()
    assert tensors["state_h"].grad is None and tensors["state_c"].grad is None
    obs_grad = tensors["obs"].grad
    assert obs_grad is not None
    assert torch.count_nonzero(obs_grad[:, :s]) == 0
    assert torch.count_nonzero(obs_grad[:, s : s + SMALL.trace_length]) > 0
    params_with_input_grads = [p.grad.clone() for p in net.parameters()]

    # The same parameter gradients whether or not the inputs ask for gradients ...
    plain = grads_of(learner, batch, target=net)
    for g1, g2 in zip(params_with_input_grads, plain):
        torch.testing.assert_close(g1, g2, rtol=0, atol=0)

    # ... and the same loss and gradients as a sequence without burn-in whose stored state is the state the
    # burn-in reaches: the burn-in observations act only through that state.
    with torch.no_grad():
        _, (h, c) = net(
            torch.as_tensor(batch["obs"][:, :s]), (torch.as_tensor(batch["state_h"]), torch.as_tensor(batch["state_c"]))
        )
    cut = {k: v[:, s:] for k, v in batch.items() if k not in ("state_h", "state_c")}
    cut["state_h"], cut["state_c"] = h.numpy(), c.numpy()
    no_burn = dataclasses.replace(SMALL, burn_in=0)
    learner0 = R2D2Learner(VEC, no_burn, seed=1)
    learner0.q_net.load_state_dict(net.state_dict())
    cut_grads = grads_of(learner0, cut, target=learner0.q_net)
    torch.testing.assert_close(
        loss_of(learner0, cut, target=learner0.q_net).loss, loss_of(learner, batch, target=net).loss, rtol=1e-6, atol=0
    )
    for g1, g2 in zip(cut_grads, plain):
        torch.testing.assert_close(g1, g2, rtol=1e-5, atol=1e-7)

    # Other burn-in observations give another state, hence another loss: the burn-in is not ignored.
    other = {k: v.copy() for k, v in batch.items()}
    other["obs"][:, :s] = rng.standard_normal(other["obs"][:, :s].shape)
    assert not torch.equal(loss_of(learner, other, target=net).loss, loss_of(learner, batch, target=net).loss)


def test_the_target_network_burns_in_from_the_stored_state_too():
    rng = np.random.default_rng(2)
    learner = R2D2Learner(VEC, SMALL, seed=2)
    perturbed_target(learner)
    batch = random_sequences(rng, 3, SMALL.min_sequence_length)
    base = loss_of(learner, batch).loss
    other = {k: v.copy() for k, v in batch.items()}
    other["state_h"] = other["state_h"] * 0.5
    assert not torch.equal(loss_of(learner, other).loss, base)


# -- n-step targets, masking and priorities by hand ------------------------------------------------------------------


def constant_q(net: RecurrentQNetwork, value: float, advantage: list[float]) -> None:
    """Q(., a) = value + advantage[a] - mean(advantage) for every observation and state."""
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        net.value.layers[-1].bias.fill_(value)
        net.advantage.layers[-1].bias.copy_(torch.tensor(advantage))


def test_n_step_targets_with_truncation_and_termination_by_hand():
    # Online Q = (0.5, 1.5) everywhere -> a* = 1; target Q' = (0, 2) everywhere, so Q'(., a*) = 2.
    cfg = dataclasses.replace(SMALL, burn_in=1, trace_length=4, n_step=3, gamma=0.9)
    learner = R2D2Learner(VEC, cfg, seed=0)
    constant_q(learner.q_net, 1.0, [-0.5, 0.5])
    constant_q(learner.target_q_net, 1.0, [-1.0, 1.0])
    length = 7  # steps 0..6; trained 1..4
    batch = random_sequences(np.random.default_rng(3), 2, length, cfg)
    r = np.array([[9.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [9.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]], np.float32)
    batch["reward"][...] = r
    batch["action"][...] = 0  # Q(s, 0) = 0.5
    # Sequence 1: the episode terminates with action 2 (obs 3 is terminal); steps 4.. are another episode's.
    batch["discount"][1, 2] = 0.0
    out = loss_of(learner, batch)

    g, boot = 0.9, float(inverse_value_rescale(torch.tensor(2.0, dtype=torch.float64)))

    def y(ret, scale):
        return float(value_rescale(torch.tensor(ret + scale * boot, dtype=torch.float64)))

    want0 = [  # t = 1..4, sequence 0: full 3-step returns while the sequence lasts, then shorter
        y(1 + g * 2 + g * g * 3, g**3),
        y(2 + g * 3 + g * g * 4, g**3),
        y(3 + g * 4 + g * g * 5, g**3),
        y(4 + g * 5, g**2),  # only steps 4, 5 remain before the last observation (6)
    ]
    want1 = [y(1 + g * 2, 0.0), y(2, 0.0)]  # t = 1, 2: the return stops at the terminal; t = 3, 4 masked
    np.testing.assert_allclose(out.delta[0].numpy(), np.array(want0) - 0.5, rtol=1e-5)
    np.testing.assert_allclose(out.delta[1, :2].numpy(), np.array(want1) - 0.5, rtol=1e-5)
    assert out.valid.tolist() == [[True] * 4, [True, True, False, False]]
    assert out.delta[1, 2:].tolist() == [0.0, 0.0]
    d1 = np.abs(np.array(want1) - 0.5)
    torch.testing.assert_close(
        out.priorities[1], torch.tensor(0.9 * d1.max() + 0.1 * d1.mean(), dtype=torch.float32), rtol=1e-5, atol=0
    )


def test_sequence_priorities_match_the_formula_on_a_hand_made_example():
    td = torch.tensor([[1.0, 3.0, 2.0, 100.0], [5.0, 5.0, 5.0, 5.0], [0.5, 0.0, 0.0, 0.0]])
    valid = torch.tensor([[True, True, True, False], [False] * 4, [True, False, False, False]])
    got = sequence_priorities(td, valid, 0.9)
    # row 0: max 3, mean 2 -> 2.7 + 0.2; row 1: nothing valid -> 0; row 2: one step of 0.5 -> 0.5
    torch.testing.assert_close(got, torch.tensor([2.9, 0.0, 0.5]), rtol=0, atol=1e-6)
    torch.testing.assert_close(sequence_priorities(td, valid, 0.0)[0], torch.tensor(2.0))
    torch.testing.assert_close(sequence_priorities(td, valid, 1.0)[0], torch.tensor(3.0))


def test_update_returns_the_sequence_priorities_of_its_td_errors():
    rng = np.random.default_rng(4)
    learner = R2D2Learner(VEC, SMALL, seed=4)
    perturbed_target(learner)
    batch = random_sequences(rng, 6, SMALL.min_sequence_length)
    batch["mask"][2, 6:] = False
    out = loss_of(learner, batch)
    td, valid = out.delta.abs().numpy(), out.valid.numpy()
    want = [0.9 * td[i][valid[i]].max() + 0.1 * td[i][valid[i]].mean() + SMALL.priority_eps for i in range(6)]
    priorities, metrics = learner.update(batch, np.ones(6))
    np.testing.assert_allclose(priorities, want, rtol=1e-6)
    assert priorities.dtype == np.float64
    assert set(metrics) == set(learner.metric_names)
    assert metrics["valid_steps"] == 6 * SMALL.trace_length - 4  # sequence 2 trains steps 3, 4 of 3..8


def test_importance_weights_scale_each_sequences_loss():
    rng = np.random.default_rng(5)
    learner = R2D2Learner(VEC, SMALL, seed=5)
    batch = random_sequences(rng, 2, SMALL.min_sequence_length)
    each = [loss_of(learner, {k: v[i : i + 1] for k, v in batch.items()}).loss.item() for i in range(2)]
    got = loss_of(learner, batch, weights=[0.25, 2.0]).loss.item()
    assert got == pytest.approx((0.25 * each[0] + 2.0 * each[1]) / 2, rel=1e-5)


@pytest.mark.parametrize("end", ["terminated", "truncated", "padding"])
def test_whatever_follows_an_episodes_end_changes_nothing(end):
    rng = np.random.default_rng(6)
    learner = R2D2Learner(VEC, SMALL, seed=6)
    perturbed_target(learner)
    length = SMALL.min_sequence_length + 2
    batch = random_sequences(rng, 3, length)
    e = 5  # the episode's last action is at step 5 (trained); its last observation is step 6
    if end == "terminated":
        batch["discount"][:, e] = 0.0
        batch["mask"][:, e + 2 :] = rng.random((3, length - e - 2)) < 0.5  # the writer's mask must not matter
    else:  # time limit (bootstrap from obs 6), or padding after a sequence that simply ends at step 6
        batch["mask"][:, e + 2 :] = False
    after = {k: v.copy() for k, v in batch.items()}
    after["obs"][:, e + 2 :] = rng.standard_normal(after["obs"][:, e + 2 :].shape) * 10
    after["reward"][:, e + 1 :] = rng.standard_normal(after["reward"][:, e + 1 :].shape) * 10
    after["action"][:, e + 1 :] = 1 - after["action"][:, e + 1 :]
    after["discount"][:, e + 1 :] = 0.0
    if end == "terminated":
        after["obs"][:, e + 1] += 5.0  # the terminal observation: bootstrapped from with weight 0

    a, b = loss_of(learner, batch), loss_of(learner, after)
    assert torch.equal(a.valid, b.valid)
    assert a.valid[:, : e - SMALL.burn_in + 1].all() and not a.valid[:, e - SMALL.burn_in + 1 :].any()
    torch.testing.assert_close(a.loss, b.loss, rtol=0, atol=0)
    torch.testing.assert_close(a.priorities, b.priorities, rtol=0, atol=0)
    for g1, g2 in zip(grads_of(learner, batch), grads_of(learner, after)):
        torch.testing.assert_close(g1, g2, rtol=0, atol=0)


def test_valid_steps_follow_the_mask_prefix_and_stop_after_a_terminal():
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    discount = torch.ones(3, 6)
    discount[2, 1] = 0.0  # step 1 ends the episode: obs 2 is terminal (valid), obs 3.. are not
    assert valid_steps(mask, discount).int().tolist() == [[1] * 6, [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]]


def test_invalid_items_name_sequences_the_update_cannot_train_on():
    learner = R2D2Learner(VEC, SMALL, seed=0)
    batch = random_sequences(np.random.default_rng(7), 5, SMALL.min_sequence_length)
    batch["discount"][0, SMALL.burn_in] = 0.0  # ends with the first trained step: fine
    assert learner.invalid_items(batch) == (None, None)
    batch["action"][1, 3] = 2
    batch["mask"][3, SMALL.burn_in + 1 :] = False  # no trained step
    batch["discount"][4, SMALL.burn_in - 1] = 0.0  # the episode ends in the burn-in: no trained step
    bad, message = learner.invalid_items(batch)
    assert bad is not None and bad.tolist() == [False, True, False, True, True]
    assert message is not None and message.startswith("item 1: action")
    assert loss_of(learner, {k: v[[3, 4]] for k, v in batch.items()}).valid.sum() == 0
    assert loss_of(learner, {k: v[[0, 2]] for k, v in batch.items()}).valid[:, 0].all()


# -- the learner's state -------------------------------------------------------------------------------------------


def test_target_copy_schedule_and_checkpoint_round_trip():
    cfg = dataclasses.replace(SMALL, target_update_period=2)
    learner = R2D2Learner(VEC, cfg, seed=8)
    rng = np.random.default_rng(8)
    learner.update(random_sequences(rng, 2, cfg.min_sequence_length), np.ones(2))
    assert not all(torch.equal(a, b) for a, b in zip(learner.q_net.parameters(), learner.target_q_net.parameters()))
    learner.update(random_sequences(rng, 2, cfg.min_sequence_length), np.ones(2))
    assert all(torch.equal(a, b) for a, b in zip(learner.q_net.parameters(), learner.target_q_net.parameters()))

    state = learner.state_dict()
    fresh = R2D2Learner(VEC, cfg, seed=99)
    fresh.load_state_dict(state)
    assert fresh.steps == 2
    batch = random_sequences(rng, 2, cfg.min_sequence_length)
    p1, _ = learner.update(batch, np.ones(2))
    p2, _ = fresh.update(batch, np.ones(2))
    np.testing.assert_array_equal(p1, p2)
    with pytest.raises(ValueError, match="R2D2 checkpoint"):
        fresh.load_state_dict({k: v for k, v in state.items() if k != "steps"})


def test_the_learning_rate_schedule_is_linear_then_held_and_survives_a_checkpoint():
    cfg = dataclasses.replace(SMALL, lr=1e-3, lr_end=1e-4, lr_decay_steps=4)
    assert [cfg.lr_at(s) for s in (0, 2, 4, 9)] == pytest.approx([1e-3, 5.5e-4, 1e-4, 1e-4])
    learner = R2D2Learner(VEC, cfg, seed=8)
    rng = np.random.default_rng(8)
    used = []
    for _ in range(3):
        learner.update(random_sequences(rng, 2, cfg.min_sequence_length), np.ones(2))
        used.append(learner.optimizer.param_groups[0]["lr"])
    assert used == pytest.approx([1e-3, 7.75e-4, 5.5e-4])
    # A resumed learner goes on with the schedule where the checkpoint left it, not from lr.
    fresh = R2D2Learner(VEC, cfg, seed=99)
    fresh.load_state_dict(learner.state_dict())
    batch = random_sequences(rng, 2, cfg.min_sequence_length)
    p1, _ = learner.update(batch, np.ones(2))
    p2, _ = fresh.update(batch, np.ones(2))
    np.testing.assert_array_equal(p1, p2)
    assert fresh.optimizer.param_groups[0]["lr"] == pytest.approx(3.25e-4)
    # Without a schedule the rate is lr on every update.
    plain = R2D2Learner(VEC, SMALL, seed=8)
    plain.update(random_sequences(rng, 2, SMALL.min_sequence_length), np.ones(2))
    assert plain.optimizer.param_groups[0]["lr"] == SMALL.lr


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(lr_end=1e-4), "go together"),
        (dict(lr_decay_steps=10), "go together"),
        (dict(lr_end=0.0, lr_decay_steps=10), "lr_end must be a finite number > 0"),
        (dict(lr_end=1e-4, lr_decay_steps=-1), "lr_decay_steps must be an int >= 0"),
        (dict(lr_end=1e-4, lr_decay_steps=2.5), "lr_decay_steps must be an int >= 0"),
    ],
)
def test_a_learning_rate_schedule_needs_both_fields_and_sane_values(fields, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(SMALL, **fields)


def test_the_atari_network_is_nature_torso_lstm_512_and_dueling_heads():
    learner = R2D2Learner(ATARI, R2D2Config(), seed=0)
    net = learner.q_net
    assert net.lstm.input_size == 3136 and net.lstm.hidden_size == 512
    assert net.value.out_features == 1 and net.advantage.out_features == 6
    frames = torch.zeros(1, 2, 4, 84, 84, dtype=torch.uint8)
    q, (h, c) = net(frames, net.initial_state(1))
    assert q.shape == (1, 2, 6) and h.shape == c.shape == (1, 512)


# -- presets ------------------------------------------------------------------------------------------------------


def test_the_r2d2_presets_are_registered_with_a_source_for_every_setting():
    from apexrl.agents.config import FIELD_SOURCES
    from apexrl.launch import preset_table
    from apexrl.launch.presets import PRESETS

    assert "r2d2" in agent_names() and get_agent("r2d2").replay.reader == "sequences"
    assert set(R2D2_PRESETS) <= set(PRESETS)
    assert set(R2D2_FIELD_SOURCES) == {f.name for f in dataclasses.fields(R2D2Config)}
    assert FIELD_SOURCES[R2D2Config] is R2D2_FIELD_SOURCES
    assert set(R2D2_SOURCE) <= set(preset_table.SOURCES)
    for name in R2D2_PRESETS:
        preset = PRESETS[name]
        rows = preset_table.settings(preset)
        assert {source for _, _, source, _ in rows} <= set(preset_table.SOURCES), name
        assert {setting for setting, *_ in rows} >= set(preset.agent_overrides) | {"tables", "beta"}
        unused = set(preset.sources) - {"*"} - {setting for setting, *_ in rows}
        assert not unused, (name, unused)
        config = preset.agent_config()
        assert config.min_sequence_length == config.burn_in + config.trace_length + 1
        # One prioritized sequence table, the one the run's actors write to and its learner samples.
        assert preset.tables is not None and [t.name for t in preset.tables] == ["default"]
        assert preset.tables[0].sampler == "prioritized" and preset.tables[0].alpha == 0.9
    paper = R2D2Config()
    assert (paper.n_step, paper.gamma, paper.burn_in, paper.trace_length, paper.sequence_period) == (
        5,
        0.997,
        40,
        80,
        40,
    )
    assert (paper.batch_size, paper.lr, paper.adam_eps, paper.target_update_period) == (64, 1e-4, 1e-3, 2500)
    assert (paper.priority_eta, paper.rescale_eps, paper.lstm_size) == (0.9, 1e-3, 512)
    assert (
        R2D2_PRESETS["r2d2-atari"]["tables"][0]["alpha"] == 0.9 and R2D2_PRESETS["r2d2-atari"]["learner"]["beta"] == 0.6
    )


# -- a memory task it must learn -----------------------------------------------------------------------------------

DECIDE = 4  # the step at which the action counts
MEMORY = EnvSpec("test:memory", (3,), np.dtype(np.float32), 2, None, 1, DECIDE + 1)
MEMORY_CONFIG = R2D2Config(
    burn_in=0, trace_length=DECIDE + 1, n_step=5, gamma=0.9, batch_size=32, lr=3e-3, target_update_period=20,
    lstm_size=32, hidden=(32,), stream_hidden=32,
)  # fmt: skip


def memory_episodes(rng: np.random.Generator, b: int, show_cue: bool = True):
    """A cue (+-1) shown only at step 0, a clock, a "decide now" flag at step DECIDE: reward 1 at that step when
    the action matches the cue, then the episode terminates. Earlier actions do nothing. Random actions."""
    length = DECIDE + 2
    out = empty_sequences(b, length, MEMORY.obs_shape, MEMORY.obs_dtype, MEMORY_CONFIG.lstm_size)
    cue = rng.integers(0, 2, b)
    if show_cue:
        out["obs"][:, 0, 0] = 2.0 * cue - 1.0
    out["obs"][:, :, 2] = np.arange(length) / DECIDE
    out["obs"][:, DECIDE, 1] = 1.0
    out["action"][...] = rng.integers(0, 2, (b, length))
    out["reward"][:, DECIDE] = out["action"][:, DECIDE] == cue
    out["discount"][:, DECIDE] = 0.0
    out["mask"][...] = True
    return out, cue


def greedy_accuracy(learner: R2D2Learner, show_cue: bool, n: int = 400) -> float:
    """The fraction of fresh episodes a greedy RecurrentPolicy (K = n environments at once) gets right."""
    episodes, cue = memory_episodes(np.random.default_rng(123), n, show_cue)
    policy = RecurrentPolicy(MEMORY, MEMORY_CONFIG, epsilons=[0.0] * n, seed=0)
    policy.load_policy_state_dict(learner.policy_state_dict())
    first = np.ones(n, bool)
    for t in range(DECIDE + 1):
        actions, _ = policy.act_batch_state(episodes["obs"][:, t], first)
        first[:] = False
    return float(np.mean(np.asarray(actions) == cue))


def train_memory(show_cue: bool, updates: int = 300) -> R2D2Learner:
    """``updates`` steps on fresh random-action episodes (about a second of one CPU core)."""
    rng = np.random.default_rng(0)
    learner = R2D2Learner(MEMORY, MEMORY_CONFIG, seed=0)
    for _ in range(updates):
        batch, _ = memory_episodes(rng, MEMORY_CONFIG.batch_size, show_cue)
        learner.update(batch, np.ones(MEMORY_CONFIG.batch_size))
    return learner


def test_it_learns_to_act_on_a_cue_it_saw_steps_ago_and_cannot_without_the_cue():
    # Chance is 0.5, and so is the best any policy without memory can do: the decision step looks the same
    # whatever the cue was. (Measured: 1.0 after about 200 updates with this seed.)
    assert greedy_accuracy(train_memory(show_cue=True), show_cue=True) >= 0.95
    # The control: the same training with the cue hidden stays at chance, so the assertion above can fail.
    assert greedy_accuracy(train_memory(show_cue=False), show_cue=False) < 0.65
