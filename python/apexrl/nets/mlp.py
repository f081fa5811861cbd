"""A plain multilayer perceptron."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn


class MLP(nn.Module):
    """``Linear -> act -> ... -> Linear -> act`` over ``hidden``, then an optional output ``Linear`` (no act).

    Args:
      in_features: input size.
      hidden: sizes of the hidden layers; ``()`` with no ``out_features`` is the identity.
      out_features: size of a final linear layer, or None for none (the output is the last hidden layer).
      activation: the module class applied after every hidden layer (``nn.ReLU``, ``nn.Tanh``).

    ``self.out_features`` is the size of what ``forward`` returns.
    """

    def __init__(
        self,
        in_features: int,
        hidden: Sequence[int],
        out_features: int | None = None,
        activation: type[nn.Module] = nn.ReLU,
    ):
        super().__init__()
        layers: list[nn.Module] = []
        size = in_features
        for h in hidden:
            layers += [nn.Linear(size, h), activation()]
            size = h
        if out_features is not None:
            layers.append(nn.Linear(size, out_features))
            size = out_features
        self.layers = nn.Sequential(*layers)
        self.out_features = size

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)
