"""One code path from media to features, used for training data, the demo and uploads alike.

``VideoExtractor(profile).extract(path) -> VideoFeatures``: probe, split the video into the profile's
windows, decode only the sampled frames (in a background thread, so decoding overlaps inference), run
every visual backbone on its share of each window and concatenate. The two halves are public on their own:
``frames(path, info)`` is the CPU half (decoding and resizing, streamed as whole windows of uint8 frames) and
``embed(windows)`` the model half (the backbones on prepared frames), so a caller can run them apart (in
other processes: ``extract.frames.FrameFile`` carries the frames between them on local disk).
``TextEncoder(profile).encode(texts)`` returns one (L, text_dim) token array per text. Bad media raises
``extract.decode.MediaError``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from extract.backbones import (
    TextBackbone,
    VisualBackbone,
    backbone_context,
    backbone_dim,
    create_backbone,
    default_device,
    get_backbone_cfg,
    list_backbones,
)
from extract.decode import (
    CorruptVideo,
    DecodeLimits,
    FrameBatch,
    FrameReader,
    VideoInfo,
    probe,
    sha256_file,
    window_times,
)
from extract.features import VideoFeatures
from extract.profiles import Profile, get_profile
from extract.weights import Weights, resolve_weights

log = logging.getLogger(__name__)
T = TypeVar("T")


def configure_threads(device: torch.device) -> None:
    """On CPU use one intra-op thread per core this process may run on (containers often allow fewer
    cores than the machine has, and torch's default counts the machine's)."""
    if device.type == "cpu":
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))


def weights_for(profile: Profile, weights: str | Mapping[str, str] | None, names: tuple[str, ...]) -> dict:
    """Per-backbone weights specs; a plain string is allowed when ``names`` holds one backbone.

    The text tower of an image-text model takes the weights given for its visual backbone (one folder
    holds both towers: ``clip=DIR`` sets ``clip_text`` too).
    """
    if weights is None:
        return {}
    if isinstance(weights, str):
        if len(names) != 1:
            raise ValueError(f"profile {profile.name} has backbones {names}: pass weights as {{name: spec}}")
        weights = {names[0]: weights}
    unknown = set(weights) - {b for b, _ in profile.weights}
    if unknown:
        raise KeyError(f"profile {profile.name} has no backbone {sorted(unknown)}")
    specs = dict(weights)
    for backbone, _ in profile.weights:
        tower_of = get_backbone_cfg(backbone).tower_of
        if tower_of in specs and backbone not in specs:
            specs[backbone] = specs[tower_of]
    return specs


def parse_weights(items: Sequence[str]) -> str | dict[str, str] | None:
    """``--weights SPEC`` (one backbone) or repeated ``--weights BACKBONE=SPEC`` (the CLI and app flag)."""
    if not items:
        return None
    named = [i.partition("=") for i in items]
    if all(sep and name in list_backbones() for name, sep, _ in named):
        return {name: spec for name, _, spec in named}
    if len(items) == 1:
        return items[0]
    raise ValueError("with several --weights, write each as BACKBONE=SPEC (backbones: "
                     f"{', '.join(list_backbones())})")


def resolve_profile(profile: str | Profile, specs: Mapping[str, str | Weights] | None = None) -> Profile:
    """The profile carrying the identity of the given weights (other backbones keep their defaults), resolved
    once: its ``sources`` hold those weights, which ``TextEncoder`` and ``VideoExtractor`` build from.

    Backbones sized by their weights (image-text models) also set the profile's dims from them. A profile
    already resolved is returned as it is (it takes no further weights).
    """
    profile = get_profile(profile)
    if profile.resolved:
        if specs:
            raise ValueError(f"profile {profile.name} is already resolved with its weights; give them once")
        return profile
    resolved = {name: w if isinstance(w, Weights) else resolve_weights(w)
                for name, w in (specs or {}).items()}
    profile = profile.with_weights({name: w.identity for name, w in resolved.items()})
    sources = tuple(resolved.items())
    if not any(get_backbone_cfg(b).sized_by_weights for b in resolved):
        return dataclasses.replace(profile, sources=sources)
    visual_dim = sum(backbone_dim(b, resolved.get(b)) for b in profile.visual)
    text = resolved.get(profile.text)
    sized = get_backbone_cfg(profile.text).sized_by_weights and text is not None
    # an image-text model's text is cut where its authors cut it: at the model's context length
    max_tokens = backbone_context(profile.text, text) if sized else profile.max_tokens
    return dataclasses.replace(profile, visual_dim=visual_dim, max_tokens=max_tokens,
                               text_dim=backbone_dim(profile.text, text), sources=sources)


def as_resolved(profile: str | Profile, weights: str | Mapping[str, str] | None = None,
                names: tuple[str, ...] | None = None) -> Profile:
    """``profile`` resolved with ``weights`` (``weights_for``: a plain string is allowed when ``names``,
    default every backbone, holds one); a resolved profile passes as it is."""
    profile = get_profile(profile)
    if profile.resolved and not weights:
        return profile
    names = names or tuple(b for b, _ in profile.weights)
    return resolve_profile(profile, weights_for(profile, weights, names))


def _subset(total: int, k: int) -> np.ndarray:
    """k indices spread evenly over range(total) (centres of k equal parts)."""
    return ((np.arange(k) + 0.5) * total / k).astype(np.int64)


def _prefetch(batches: Iterator[T], depth: int = 2) -> Iterator[T]:
    """Run ``batches`` in a background thread, at most ``depth`` batches ahead (bounded memory).

    decord and PyAV release the GIL while decoding (and torch while resizing), so preparing the next batch
    overlaps inference.
    Exceptions in the thread are re-raised here, in the caller's thread.
    """
    buffer: queue.Queue = queue.Queue(maxsize=depth)
    done, stop = object(), threading.Event()

    def produce() -> None:
        try:
            for batch in batches:
                while not stop.is_set():
                    try:
                        buffer.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            buffer.put(done)
        except BaseException as e:  # handed to the consumer, which re-raises it
            buffer.put(e)

    thread = threading.Thread(target=produce, name="extract-decode", daemon=True)
    thread.start()
    try:
        while (item := buffer.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()  # the consumer stopped early (error, or generator closed): let the thread end
        thread.join(timeout=5)


def _as_decoded(frames: np.ndarray) -> np.ndarray:
    """Frames decoded at the model's input size need no preparing."""
    return frames


def _whole_windows(batches: Iterator[FrameBatch], per_window: int) -> Iterator[np.ndarray]:
    """Regroup decoded frames so each array holds whole windows (readers may split one across batches)."""
    carry = None
    for batch in batches:
        frames = batch.frames if carry is None else np.concatenate([carry, batch.frames])
        cut = len(frames) - len(frames) % per_window
        if cut:
            yield frames[:cut]
        carry = frames[cut:]


@dataclass
class FrameStream:
    """The CPU half of extraction: a video's sampled frames, decoded and prepared for the model, as whole
    windows in order.

    Iterating yields (w, F, S, S, 3) uint8 arrays (``w`` whole windows of ``F`` frames of ``S`` px), decoded
    and prepared in a background thread at most two batches ahead. After iteration ``warnings`` says what
    the decoder skipped; a damaged video yields fewer windows than ``windows`` (only those that decoded
    whole).
    """

    reader: FrameReader
    per_window: int
    ends: np.ndarray  # (windows,) end of each window, seconds
    duration: float
    side: int  # S: prepared frames are S x S
    prepare: Callable[[np.ndarray], np.ndarray]  # decoded (n, H, W, 3) -> prepared (n, S, S, 3), uint8

    @property
    def windows(self) -> int:
        """Windows of the whole video (the rows it has when nothing is damaged)."""
        return len(self.ends)

    @property
    def frame_shape(self) -> tuple[int, ...]:
        """(F, S, S, 3): one window's frames."""
        return (self.per_window, self.side, self.side, 3)

    @property
    def warnings(self) -> list[str]:
        """What the decoder skipped (complete once the stream is exhausted)."""
        return list(self.reader.warnings)

    def seconds_done(self, windows: int) -> float:
        """Seconds of video covered by the first ``windows`` windows."""
        return float(min(self.ends[min(windows, len(self.ends)) - 1], self.duration)) if windows else 0.0

    def __iter__(self) -> Iterator[np.ndarray]:
        for frames in _prefetch(self._prepared()):
            yield frames.reshape(len(frames) // self.per_window, *self.frame_shape)

    def _prepared(self) -> Iterator[np.ndarray]:
        """Whole windows' frames, prepared (run in the decoding thread)."""
        for frames in _whole_windows(iter(self.reader), self.per_window):
            yield self.prepare(frames)


class VideoExtractor:
    """Turn video files into feature rows with a profile's visual backbones."""

    def __init__(self, profile: str | Profile = "lite", weights: str | Mapping[str, str] | None = None,
                 device: str | torch.device | None = None, batch_frames: int | None = None,
                 limits: DecodeLimits | None = None) -> None:
        """``profile``: a name (resolved here with ``weights``) or a resolved ``Profile`` (weights None)."""
        # text weights only enter the identity; a resolved profile (the model factory's) is not resolved
        # again
        profile = self.profile = as_resolved(profile, weights, get_profile(profile).visual)
        self.device = default_device(device)
        configure_threads(self.device)
        self.backbones: list[VisualBackbone] = [
            create_backbone(b, profile.source(b), self.device, profile.frame_fit) for b in profile.visual]
        self.limits = limits or DecodeLimits()
        # frames decoded and embedded at once (default: 32 on a GPU; 4 on a CPU, where larger batches are no
        # faster and progress is reported after each batch)
        batch_frames = batch_frames or (32 if self.device.type == "cuda" else 4)
        self.batch_windows = max(1, batch_frames // profile.frames_per_window)  # whole windows per batch

    def extract(self, path: str | Path, sha256: str | None = None, *, info: VideoInfo | None = None,
                progress: Callable[[float, float], None] | None = None) -> VideoFeatures:
        """Features of one video; raises a MediaError subclass for unusable media.

        ``info``: the file's ``probe`` where the caller already has it (else it is probed here).
        ``progress(done_s, total_s)``: called after each decoded batch with the seconds of video done.
        In-process, on this extractor's device, decoding overlapped with the backbones.
        """
        path = Path(path)
        info = info or probe(path, self.limits)
        rows, warnings = self.rows(path, info, progress=progress)
        return self.features(path, info, rows, warnings, sha256)

    def frames(self, path: str | Path, info: VideoInfo) -> FrameStream:
        """The CPU half: the profile's sampled frames of ``path`` (probed as ``info``), decoded and prepared
        for the backbones, streamed as whole windows (nothing is decoded until iterated).

        frame_fit "squash": decoded straight to the square input. Otherwise decoded at display size and cut
        by the image-text model's own processor (resize, crop), the rest of which ``embed`` does: what goes
        from here to the model (a ZeroGPU slot's frame file) is S x S, whatever the video's size."""
        per_window = self.profile.frames_per_window
        _, ends, times = window_times(info.duration, self.profile.window_s, per_window)
        if self.profile.frame_size is not None:
            side, size, prepare = self.profile.frame_size, (self.profile.frame_size,) * 2, _as_decoded
        else:  # one image-text tower (profiles check it): its processor prepares the frames
            (tower,) = self.backbones
            side, size, prepare = tower.cfg.input_size, None, tower.prepare
        reader = FrameReader(str(path), times, size, self.batch_windows * per_window, self.limits, info)
        return FrameStream(reader, per_window, ends, float(info.duration), side, prepare)

    def rows(self, path: str | Path, info: VideoInfo, *,
             progress: Callable[[float, float], None] | None = None) -> tuple[np.ndarray, list[str]]:
        """Decode the sampled frames of ``path`` (probed as ``info``) and run the backbones.

        Returns ``(rows (n, visual_dim) float32, decoder warnings)``; ``n`` counts the whole windows that
        decoded (all of them unless the video is damaged). Raises a MediaError for unusable media.
        """
        stream = self.frames(path, info)
        rows = []
        for windows in stream:
            rows.append(self.embed(windows))
            if progress is not None:  # seconds of video done after this batch, of the total
                progress(stream.seconds_done(sum(len(r) for r in rows)), stream.duration)
        if not rows:
            return np.zeros((0, self.profile.visual_dim), np.float32), stream.warnings
        return np.concatenate(rows), stream.warnings

    def features(self, path: str | Path, info: VideoInfo, rows: np.ndarray, warnings: Sequence[str],
                 sha256: str | None = None) -> VideoFeatures:
        """``VideoFeatures`` from the output of ``rows`` (raises CorruptVideo when no window decoded)."""
        path = Path(path)
        start, end, _ = window_times(info.duration, self.profile.window_s, self.profile.frames_per_window)
        n = len(rows)  # a damaged video keeps only whole windows that decoded
        if n == 0:
            raise CorruptVideo(path, f"not one whole {self.profile.window_s:g} s window decodes.",
                               "Re-encode or re-download the file.")
        duration = info.duration if n == len(start) else float(end[n - 1])
        return VideoFeatures(rows, start[:n], end[:n], duration, sha256 or sha256_file(path), path.name,
                             list(warnings))

    def embed(self, windows: np.ndarray) -> np.ndarray:
        """The model half: (w, F, H, W, 3) uint8 frames of whole windows -> (w, visual_dim) float32 rows."""
        w = len(windows)
        parts = []
        for backbone, k in zip(self.backbones, self.profile.frames, strict=True):
            chosen = windows[:, _subset(windows.shape[1], k)]  # (w, k, H, W, 3)
            if backbone.cfg.kind == "clip":
                parts.append(backbone.embed(chosen))  # (w, D): one clip per window
            else:  # mean of the per-frame features over the window
                feats = backbone.embed(chosen.reshape(w * k, *chosen.shape[2:]))
                parts.append(feats.reshape(w, k, -1).mean(1))
        return np.concatenate(parts, axis=1)


class TextEncoder:
    """Turn captions or queries into token features with a profile's text backbone."""

    def __init__(self, profile: str | Profile = "lite", weights: str | Mapping[str, str] | None = None,
                 device: str | torch.device | None = None) -> None:
        """``profile``: a name (resolved here with ``weights``) or a resolved ``Profile`` (weights None)."""
        # visual weights only enter the identity; a resolved profile (the model factory's) is not resolved
        # again
        profile = self.profile = as_resolved(profile, weights, (get_profile(profile).text,))
        self.backbone: TextBackbone = create_backbone(profile.text, profile.source(profile.text), device)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """One (L_i, text_dim) float32 array per text (all non-padding tokens, specials included)."""
        return self.backbone.encode(texts, max_tokens=self.profile.max_tokens)
