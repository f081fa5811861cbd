"""The Nature-DQN convolutional torso (Mnih et al. 2015) for stacks of uint8 frames."""

from __future__ import annotations

from torch import Tensor, nn


def _conv_out(size: int, kernel: int, stride: int) -> int:
    return (size - kernel) // stride + 1


class NatureTorso(nn.Module):
    """``(B, C, H, W)`` uint8 frames -> ``(B, 64 * h * w)`` features (3136 for 84x84).

    Conv 32 8x8 stride 4 -> ReLU -> conv 64 4x4 stride 2 -> ReLU -> conv 64 3x3 stride 1 -> ReLU -> flatten.
    The input is cast to float and scaled by 1/255 here, so replay and the wire carry uint8 frames.
    """

    def __init__(self, in_shape: tuple[int, int, int] = (4, 84, 84)):
        super().__init__()
        c, h, w = in_shape
        for k, s in ((8, 4), (4, 2), (3, 1)):
            h, w = _conv_out(h, k, s), _conv_out(w, k, s)
        if h < 1 or w < 1:
            raise ValueError(f"frames of shape {in_shape} are too small for the Nature-DQN torso (need >= 36x36)")
        self.convs = nn.Sequential(
            nn.Conv2d(c, 32, kernel_size=8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, kernel_size=3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        self.out_features = 64 * h * w

    def forward(self, frames: Tensor) -> Tensor:
        return self.convs(frames.float() * (1.0 / 255.0))
