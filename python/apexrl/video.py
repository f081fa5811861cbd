"""Videos of evaluation episodes (``apexrl evaluate --video FILE.gif|FILE.mp4``).

Frames come from ``Env.render()`` (HxWx3 uint8). GIF is written with Pillow, MP4 with imageio-ffmpeg (which
ships its own ffmpeg binary): both in the ``video`` extra. The file appears only when complete: frames go to a
temporary file next to it (created exclusively, never through a link, mode 0600) that is renamed at the end
and removed on any failure.

A GIF holds its frames in memory until it is written, so at most ``MAX_GIF_FRAMES`` frames are kept (later
frames are dropped and the count said); GIF frame delays are in hundredths of a second and most viewers slow
down delays under 20 ms, so fast environments are subsampled to about 25 frames per second.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from apexrl.durable import create_private, open_private

__all__ = ["VideoError", "open_writer", "prepare_rendering"]

INSTALL_HINT = "pip install 'apexrl[video]'"
MAX_GIF_FRAMES = 3000
GIF_FPS = 25.0


class VideoError(Exception):
    """The video cannot be written (missing package, unsupported suffix, no offscreen OpenGL)."""


def prepare_rendering(env_name: str) -> None:
    """dm_control renders offscreen through EGL on a headless machine; MUJOCO_GL is read when dm_control is
    first imported, so it is set (unless the user chose a backend) before any dmc environment exists. "disable"
    counts as unset: apexrl's own processes set it for training (apexrl.envs.dmc) and children inherit it."""
    if env_name.startswith("dmc:") and os.environ.get("MUJOCO_GL", "disable") == "disable":
        os.environ["MUJOCO_GL"] = "egl"


class _Writer:
    def __init__(self, path: str):
        self.path = path
        self.tmp = f"{path}.tmp.{os.getpid()}{os.path.splitext(path)[1]}"
        self.frames = 0
        self.dropped = 0
        self.fps = 30.0

    def begin(self, fps: float) -> None:
        """Frames per second of the environment (its real time), before the first frame."""
        self.fps = float(fps)

    def frame_of(self, environment: Any) -> None:
        """``play_episodes``' on_frame: render the environment and add the frame."""
        from apexrl.envs import RenderError

        try:
            frame = environment.render()
        except RenderError as e:
            raise VideoError(str(e)) from None
        frame = np.asarray(frame)
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            raise VideoError(f"{environment.spec.name}: render() gave {frame.dtype} {frame.shape}, not HxWx3 uint8")
        self.add(frame)

    def add(self, frame: np.ndarray) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Finish the file and move it into place."""
        if self.frames == 0:
            raise VideoError("no frame was rendered")
        self._finish()
        os.replace(self.tmp, self.path)

    def _finish(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        try:
            os.remove(self.tmp)
        except FileNotFoundError:
            pass


class _Gif(_Writer):
    def __init__(self, path: str, image_module: Any):
        super().__init__(path)
        self._image = image_module
        self._frames: list[Any] = []

    def add(self, frame: np.ndarray) -> None:
        if len(self._frames) >= MAX_GIF_FRAMES:
            self.dropped += 1
            return
        # A palette image is a third of the RGB frame's memory.
        self._frames.append(self._image.fromarray(frame).quantize(colors=255))
        self.frames += 1

    def _finish(self) -> None:
        stride = max(1, round(self.fps / GIF_FPS))
        frames = self._frames[::stride]
        duration = max(20, round(1000.0 * stride / self.fps / 10) * 10)
        with open_private(self.tmp, text=False) as f:  # exclusive, no symlink, 0600 (apexrl.durable)
            frames[0].save(f, format="GIF", save_all=True, append_images=frames[1:], duration=duration, loop=0)


class _Mp4(_Writer):
    """Streams frames to ffmpeg as they come (nothing accumulates in memory)."""

    def __init__(self, path: str, ffmpeg_module: Any):
        super().__init__(path)
        self._ffmpeg = ffmpeg_module
        self._gen: Any = None
        self._size: tuple[int, int] | None = None

    def add(self, frame: np.ndarray) -> None:
        if self._gen is None:
            # yuv420p needs even sizes: drop an odd last row/column rather than rescale.
            self._size = (frame.shape[1] // 2 * 2, frame.shape[0] // 2 * 2)
            os.close(create_private(self.tmp))  # ffmpeg then writes into this private file, not through a link
            self._gen = self._ffmpeg.write_frames(
                self.tmp,
                self._size,
                fps=self.fps,
                codec="libx264",
                pix_fmt_out="yuv420p",
                macro_block_size=1,
                quality=7,
                ffmpeg_log_level="error",
            )
            self._gen.send(None)
        assert self._size is not None  # set with _gen above
        w, h = self._size
        self._gen.send(np.ascontiguousarray(frame[:h, :w]))
        self.frames += 1

    def _finish(self) -> None:
        self._gen.close()
        self._gen = None

    def abort(self) -> None:
        if self._gen is not None:
            try:
                self._gen.close()
            except Exception:  # noqa: BLE001 - the temporary file is removed below anyway
                pass
            self._gen = None
        super().abort()


def open_writer(path: str) -> _Writer:
    """A writer for ``path`` (.gif or .mp4); VideoError naming the extra if its package is missing."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".gif":
        try:
            from PIL import Image
        except ImportError:
            raise VideoError(f"GIF videos need Pillow: {INSTALL_HINT}") from None
        writer: _Writer = _Gif(path, Image)
    elif suffix == ".mp4":
        try:
            import imageio_ffmpeg
        except ImportError:
            raise VideoError(f"MP4 videos need imageio-ffmpeg: {INSTALL_HINT}") from None
        writer = _Mp4(path, imageio_ffmpeg)
    else:
        raise VideoError(f"--video {path}: the file name must end in .gif or .mp4")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise VideoError(f"--video {path}: directory {directory} does not exist")
    return writer
