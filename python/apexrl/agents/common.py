"""Pieces the agents share: the exploration ladder, flat named-tensor state (checkpoints and actor weights),
and batch conversion.

Flat state. Checkpoints and weight messages are ``dict[str, torch.Tensor]`` that safetensors can store: CPU,
contiguous, every tensor its own storage (cloned), no Python objects. Names are ``/``-paths:

    <net>/<parameter name>          e.g. ``q_net/torso.layers.0.weight``, ``target_critic/out.weight``
    optim/<net>/<i>/<state key>     torch optimizer state of the i-th parameter of ``<net>``'s optimizer, e.g.
                                    ``optim/critic/3/exp_avg``, ``optim/q_net/0/step`` (scalar)
    steps                           int64 scalar: learner updates done

An optimizer's entries are either all absent (no update yet) or complete. Loading checks names, shapes and
dtypes first and changes nothing on a mismatch (ValueError naming every missing, unexpected and mismatched
entry); optimizer hyper-parameters come from the config, never from the checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from apexrl.params.tensors import describe_mismatch, spec_of

__all__ = ["epsilon_ladder"]


def epsilon_ladder(i: int, n: int, base: float = 0.4, alpha: float = 7.0) -> float:
    """Exploration rate of actor ``i`` of ``n`` (Ape-X): ``eps_i = base ** (1 + alpha * i / (n - 1))``.

    Actor 0 explores most (``base``), actor ``n - 1`` least (``base ** (1 + alpha)``); ``n == 1`` gives ``base``.

    Raises:
      ValueError: ``n < 1`` or ``i`` outside ``[0, n)``.
    """
    check_actor_index(i, n)
    if n == 1:
        return float(base)
    return float(base ** (1.0 + alpha * i / (n - 1)))


def check_actor_index(i: int, n: int) -> None:
    """ValueError unless ``n >= 1`` and ``0 <= i < n`` (both ints): an actor's place on an exploration ladder."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"number of actors n must be an int >= 1, got {n!r}")
    if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < n:
        raise ValueError(f"actor index i must be an int in [0, {n}), got {i!r}")


# -- flat named tensors ----------------------------------------------------------------------------------------


def _cpu_copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True).contiguous()


def module_tensors(prefix: str, module: nn.Module) -> dict[str, torch.Tensor]:
    """``{prefix/name: CPU copy}`` for every parameter and buffer of ``module``."""
    return {f"{prefix}/{k}": _cpu_copy(v) for k, v in module.state_dict().items()}


def module_layout(prefix: str, module: nn.Module) -> dict[str, torch.Tensor]:
    """Like ``module_tensors`` but as meta tensors (names, shapes, dtypes only; no copy): what to check against."""
    return {f"{prefix}/{k}": torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in module.state_dict().items()}


def check_tensors(expected: Mapping[str, torch.Tensor], got: Mapping[str, Any], what: str) -> None:
    """Raise ValueError naming every missing, unexpected and mismatched (shape/dtype) entry unless ``got``
    has exactly ``expected``'s names, shapes and dtypes."""
    if not isinstance(got, Mapping):
        raise ValueError(f"{what}: expected a dict of named tensors, got {type(got).__name__}")
    msg = describe_mismatch(spec_of(expected), got)
    if msg:
        raise ValueError(f"{what}: {msg}")


def check_steps(steps: torch.Tensor) -> None:
    """The checkpoint's ``steps`` counter must be a non-negative int64 scalar."""
    if int(steps) < 0:
        raise ValueError(f"checkpoint: steps = {int(steps)}, expected >= 0")


def load_module_tensors(prefix: str, module: nn.Module, d: Mapping[str, torch.Tensor]) -> None:
    """Copy ``d[prefix/name]`` into ``module`` (already checked by the caller)."""
    n = len(prefix) + 1
    module.load_state_dict({k[n:]: v for k, v in d.items() if k.startswith(prefix + "/")}, strict=True)


def _optimizer_layout(opt: torch.optim.Optimizer) -> dict[str, bool]:
    """The state keys this optimizer keeps per parameter -> whether the entry has the parameter's shape
    (True) or is a scalar (False). Found by one step of a throwaway copy on a 2-element parameter, so it follows
    whatever this torch version stores (e.g. RMSprop centered: step, square_avg, grad_avg)."""
    probe = torch.zeros(2, requires_grad=True)
    hyper = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
    twin = type(opt)([probe], **hyper)
    probe.grad = torch.zeros(2)
    twin.step()
    return {k: (isinstance(v, torch.Tensor) and tuple(v.shape) == (2,)) for k, v in twin.state[probe].items()}


def _params(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in opt.param_groups for p in group["params"]]


def optimizer_tensors(prefix: str, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Flatten ``opt``'s per-parameter state into ``{optim/prefix/i/key: tensor}`` (empty before any step)."""
    out: dict[str, torch.Tensor] = {}
    for i, p in enumerate(_params(opt)):
        for key, value in opt.state.get(p, {}).items():
            out[f"optim/{prefix}/{i}/{key}"] = _cpu_copy(torch.as_tensor(value))
    return out


def expected_optimizer_tensors(
    prefix: str, opt: torch.optim.Optimizer, present: Iterable[str]
) -> dict[str, torch.Tensor]:
    """The optimizer entries a checkpoint must hold, as empty tensors with the right shape/dtype: none when
    ``present`` (the checkpoint's names) has no ``optim/prefix/`` entry, all of them otherwise."""
    tag = f"optim/{prefix}/"
    if not any(k.startswith(tag) for k in present):
        return {}
    layout = _optimizer_layout(opt)
    out = {}
    for i, p in enumerate(_params(opt)):
        for key, param_shaped in layout.items():
            shape = tuple(p.shape) if param_shaped else ()
            dtype = p.dtype if param_shaped else torch.float32
            out[f"{tag}{i}/{key}"] = torch.empty(shape, dtype=dtype, device="meta")
    return out


def load_optimizer_tensors(prefix: str, opt: torch.optim.Optimizer, d: Mapping[str, torch.Tensor]) -> None:
    """Restore the state flattened by ``optimizer_tensors`` into ``opt`` (hyper-parameters stay ``opt``'s own).
    The checkpoint was checked by the caller against ``expected_optimizer_tensors``."""
    tag = f"optim/{prefix}/"
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in d.items():
        if name.startswith(tag):
            i, key = name[len(tag) :].split("/", 1)
            state.setdefault(int(i), {})[key] = value.clone()
    sd = opt.state_dict()
    opt.load_state_dict({"state": state, "param_groups": sd["param_groups"]})


# -- batches ---------------------------------------------------------------------------------------------------


def as_tensor(x: np.ndarray, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """numpy -> tensor on ``device`` (no copy on the CPU when the dtype already matches)."""
    t = torch.as_tensor(np.ascontiguousarray(x))
    return t.to(device=device, dtype=dtype or t.dtype, non_blocking=True)


def check_batch(batch: Mapping[str, np.ndarray], names: Sequence[str], weights: np.ndarray | None = None) -> int:
    """Batch size of a transition batch with the fields ``names`` (the agent's ``TransitionSpec.names``);
    ValueError when a field is missing, the sizes disagree, the batch is empty or a weight is not finite."""
    missing = [k for k in names if k not in batch]
    if missing:
        raise ValueError(f"batch is missing field(s) {missing}; expected {list(names)}")
    sizes = {k: len(batch[k]) for k in names}
    if weights is not None:
        sizes["weights"] = len(weights)
    if len(set(sizes.values())) != 1:
        raise ValueError(f"batch fields have different leading sizes: {sizes}")
    n = sizes[names[0]]
    if n == 0:
        raise ValueError("empty batch")
    if weights is not None and not np.all(np.isfinite(weights)):
        raise ValueError("IS weights must be finite")
    return n


def finite_priorities(td_abs: torch.Tensor, eps: float) -> np.ndarray:
    """``|delta| + eps`` as float64 numpy; ValueError if any is not finite (a diverged network must not poison
    the replay's priorities)."""
    p = td_abs.detach().to("cpu", torch.float64).numpy() + eps
    if not np.all(np.isfinite(p)):
        raise ValueError(f"non-finite TD errors ({int(np.sum(~np.isfinite(p)))} of {p.size}): the network diverged")
    return p


def learner_state(
    nets: Mapping[str, nn.Module], optimizers: Mapping[str, torch.optim.Optimizer], steps: int
) -> dict[str, torch.Tensor]:
    """A learner's flat checkpoint: each network's tensors under its name, each optimiser's state under its name,
    ``steps`` (int64)."""
    out: dict[str, torch.Tensor] = {}
    for name, net in nets.items():
        out.update(module_tensors(name, net))
    for name, opt in optimizers.items():
        out.update(optimizer_tensors(name, opt))
    out["steps"] = torch.tensor(steps, dtype=torch.int64)
    return out


def load_learner_state(
    d: Mapping[str, torch.Tensor],
    nets: Mapping[str, nn.Module],
    optimizers: Callable[[], Mapping[str, torch.optim.Optimizer]],
    remake_optimizers: Callable[[], None],
    label: str,
) -> int:
    """Restore what :func:`learner_state` wrote and return its ``steps``: ``d`` is checked against every network's
    and optimiser's layout first (ValueError naming missing, unexpected or mismatched entries, nothing changed),
    then the networks are loaded, ``remake_optimizers()`` builds fresh optimisers over them and
    ``optimizers()`` (the current ones, by name) get their state."""
    expected: dict[str, torch.Tensor] = {"steps": torch.tensor(0, dtype=torch.int64)}
    for name, net in nets.items():
        expected.update(module_layout(name, net))
    if isinstance(d, Mapping):
        for name, opt in optimizers().items():
            expected.update(expected_optimizer_tensors(name, opt, d))
    check_tensors(expected, d, label)
    check_steps(d["steps"])
    for name, net in nets.items():
        load_module_tensors(name, net, d)
    remake_optimizers()
    for name, opt in optimizers().items():
        load_optimizer_tensors(name, opt, d)
    return int(d["steps"])
