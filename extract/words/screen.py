"""Text on screen as timed words: RapidOCR (PP-OCRv4, ONNX, inside the rapidocr-onnxruntime wheel) on frames
sampled where the picture changes.

OCR is slow (0.5-3 s a frame on one loaded core, by how much text it holds), so it reads one frame per
*scene*, not one per second:
1. change detection: the video is decoded at ``sample_fps`` as small grey frames (``extract.decode``'s
   decoder, resized at decode time); a new scene starts at the first sample whose most-changed cell of a 4x4
   grid differs from the scene's first frame by more than ``change_level`` grey levels on average (a cell, not
   the whole frame, so a caption appearing in a corner counts), and not sooner than ``min_gap_s`` after the
   last start (flicker and fast motion do not make scenes);
2. a frame budget: OCR may cost ``share`` of the video's duration on one core, ``max(1, share * duration /
   seconds_per_frame)`` frames; when there are more scenes, the scenes under evenly spaced times are read
   (long scenes, where text worth reading stays on screen, are hit most; every part of the video is
   visited), then the longest others while the budget lasts. The budget also holds in time: when OCR runs
   slower than planned (a loaded machine; frames full of text cost several times a sparse one), the frames
   left are thinned, evenly over the rest of the video, to what ``share * duration`` seconds of OCR allow
   at the pace so far (the first frame is always read): the upload waits no longer, fewer frames are read;
3. each chosen scene's middle frame is read at up to ``max_side`` pixels; lines scoring ``min_score`` or more
   are kept. 0.85 because, on real frames here, text was read at 0.96-0.999 (rendered captions, printed
   labels) while fragments of textures and half-hidden words came back at 0.51-0.84; a line of fewer than
   two letters or digits is dropped (icons read as "口", specks as "l");
4. a line read in consecutive scenes is one segment: start = the first sampled frame of the first scene
   showing it, end = the time the picture changed after the last one (the video's end for the last scene).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from extract.words.segment import WordSegment, WordsUnavailable

log = logging.getLogger(__name__)

OCR_PACKAGE = "rapidocr-onnxruntime"


def package_version(package: str) -> str:
    """An installed package's version, or "not installed"."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


OCR_MODEL = f"RapidOCR PP-OCRv4 ({OCR_PACKAGE} {package_version(OCR_PACKAGE)})"  # what /info shows

_CHANGE_WIDTH = 128  # grey frames for change detection: 128 px wide (about 128x72), enough to see a caption
_GRID = 4  # change is measured per cell of a 4x4 grid


@dataclass(frozen=True)
class ScreenSettings:
    """How on-screen text is read; the defaults are documented in the module's docstring."""

    min_score: float = 0.85  # recognition score a line must reach to be kept
    share: float = 0.5  # OCR may cost this share of the video's duration on one core...
    seconds_per_frame: float = 2.0  # ...this many seconds a frame (measured: 0.5-3.3 s, loaded 2 cores)
    min_gap_s: float = 1.0  # scenes start at least this far apart
    sample_fps: float = 2.0  # change detection looks at this many frames a second
    change_level: float = 12.0  # mean grey difference (0-255) of the most-changed cell that starts a scene
    max_side: int = 1280  # frames are read at up to this many pixels on their longer side (see Ocr)
    threads: int = 1  # onnxruntime threads: one core, the other is speech's (extract.words.reader)

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_score <= 1.0:
            raise ValueError(f"screen min_score {self.min_score}: expected a value in [0, 1]")
        for name in ("share", "seconds_per_frame", "sample_fps", "change_level"):
            if not getattr(self, name) > 0:
                raise ValueError(f"screen {name} {getattr(self, name)}: expected a positive number")
        if self.min_gap_s < 0 or self.max_side < 32 or self.threads < 1:
            raise ValueError(f"screen settings min_gap_s={self.min_gap_s}, max_side={self.max_side}, "
                             f"threads={self.threads}: expected min_gap_s >= 0, max_side >= 32, threads >= 1")

    def budget(self, duration: float) -> int:
        """How many frames OCR may read in a video this long."""
        return max(1, int(self.share * duration / self.seconds_per_frame))


class Ocr:
    """RapidOCR loaded once: ``read(rgb)`` -> [(text, score)] in reading order; safe to share between threads
    (calls are serialised: one OCR at a time keeps it on its core)."""

    model = OCR_MODEL

    def __init__(self, threads: int = 1) -> None:
        try:
            from rapidocr_onnxruntime import RapidOCR
        except ImportError as e:
            raise WordsUnavailable(f"on-screen text needs {OCR_PACKAGE} ({e})") from None
        # detection sees the frame scaled to fit 960 px ("max": never up; the default "min" scales a 640x360
        # frame's short side up to 736 px and doubles the cost for nothing); recognition reads each line's
        # crop of the frame as given: 1280 px wide frames of a 1920x880 screen recording gave 12 lines, spaced
        # right, where 960 px gave 8, words run together, for about 1.5x the time

        self._engine = RapidOCR(intra_op_num_threads=threads, inter_op_num_threads=1,
                                det_limit_type="max", det_limit_side_len=960)
        self._lock = threading.Lock()

    def read(self, rgb: np.ndarray) -> list[tuple[str, float]]:
        """The text lines in an RGB frame with their recognition scores, top to bottom, left to right."""
        with self._lock:
            found, _ = self._engine(np.ascontiguousarray(rgb[..., ::-1]), use_cls=False)  # it takes BGR
        lines = []
        for box, text, score in found or []:
            top, left = min(p[1] for p in box), min(p[0] for p in box)
            lines.append((float(top), float(left), " ".join(str(text).split()), float(score)))
        return [(text, score) for _, _, text, score in sorted(lines) if text]


@dataclass(frozen=True)
class Scene:
    """A stretch of video whose picture stays alike: [start, end) seconds, the time of its middle sample."""

    start: float
    end: float
    middle: float


def scenes(video_path: str | Path, settings: ScreenSettings | None = None,
           progress: Callable[[float], None] | None = None) -> list[Scene]:
    """The video cut where its picture changes (change detection of the module's docstring, step 1)."""
    from extract.decode import MediaError, probe, read_frames

    settings = settings or ScreenSettings()
    try:
        info = probe(video_path)
        width, height = info.display_size
        size = (_CHANGE_WIDTH, max(_GRID, 2 * round(_CHANGE_WIDTH * height / width / 2)))
        reader = read_frames(video_path, fps=settings.sample_fps, size=size)
        starts, times, reference = [], [], None
        for batch in reader:
            grey = batch.frames.astype(np.float32) @ np.float32([0.299, 0.587, 0.114])  # (b, h, w)
            for frame, t in zip(grey, batch.times, strict=True):
                if reference is None or (t - starts[-1] >= settings.min_gap_s
                                         and _change(frame, reference) > settings.change_level):
                    starts.append(float(t))
                    reference = frame
                times.append(float(t))
            if progress:
                progress(min(1.0, float(batch.times[-1]) / info.duration))
    except MediaError as e:
        raise WordsUnavailable(f"frames cannot be read ({e.reason})") from None
    if not times:
        return []
    starts[0] = 0.0  # the first scene is on screen from the start, before the first sample
    ends = starts[1:] + [max(info.duration, times[-1])]
    sampled = np.asarray(times)
    found = []
    for start, end in zip(starts, ends, strict=True):
        inside = sampled[(sampled >= start) & (sampled < end)]
        found.append(Scene(start, end, float(inside[len(inside) // 2]) if len(inside) else start))
    return found


def _change(frame: np.ndarray, reference: np.ndarray) -> float:
    """Mean absolute grey difference of the most-changed cell of a _GRID x _GRID grid."""
    h, w = frame.shape
    ch, cw = h // _GRID, w // _GRID
    diff = np.abs(frame[: ch * _GRID, : cw * _GRID] - reference[: ch * _GRID, : cw * _GRID])
    return float(diff.reshape(_GRID, ch, _GRID, cw).mean(axis=(1, 3)).max())


def choose(found: list[Scene], budget: int) -> list[int]:
    """Indices (in time order) of the scenes OCR reads: all of them within the budget; else the scenes under
    ``budget`` evenly spaced times (a long scene is hit more often, every part of the video is visited), then
    the longest of the others while the budget lasts."""
    if len(found) <= budget:
        return list(range(len(found)))
    start, end = found[0].start, found[-1].end
    starts = [scene.start for scene in found]
    slots = start + (np.arange(budget) + 0.5) * (end - start) / budget
    chosen = {max(0, int(np.searchsorted(starts, t, side="right")) - 1) for t in slots}
    longest = sorted((i for i in range(len(found)) if i not in chosen),
                     key=lambda i: (-(found[i].end - found[i].start), i))
    chosen.update(longest[: budget - len(chosen)])
    return sorted(chosen)


def screen_text(video_path: str | Path, settings: ScreenSettings | None = None, ocr: Ocr | None = None,
                progress: Callable[[float], None] | None = None) -> list[WordSegment]:
    """The text lines on screen with the times they stay there (the module's docstring), sorted by time;
    ``ocr``: a loaded Ocr to reuse (one is loaded otherwise)."""
    from extract.decode import MediaError, probe, read_frames

    settings = settings or ScreenSettings()
    report = progress or (lambda fraction: None)
    found = scenes(video_path, settings, lambda f: report(0.2 * f))  # decoding small frames: ~a fifth
    chosen = choose(found, settings.budget(found[-1].end if found else 0.0))
    if not chosen:
        report(1.0)
        return []
    ocr = ocr or Ocr(settings.threads)
    try:
        info = probe(video_path)
        width, height = info.display_size
        scale = min(1.0, settings.max_side / max(width, height))
        size = None if scale == 1.0 else (2 * round(width * scale / 2), 2 * round(height * scale / 2))
        reader = read_frames(video_path, times=np.array([found[i].middle for i in chosen]), size=size,
                             batch_size=1)  # one frame at a time: frames are big, OCR is the slow part
        cap = settings.share * found[-1].end  # seconds of OCR this video may cost, as the wait grows
        keep, spent, read = set(range(len(chosen))), 0.0, []
        for k, batch in enumerate(reader):
            if k in keep:
                started = time.perf_counter()
                lines = [(t, s) for t, s in ocr.read(batch.frames[0]) if s >= settings.min_score]
                spent += time.perf_counter() - started
                read.append((chosen[k], lines))
                keep = _thinned(keep, k, len(chosen), cap - spent, spent / len(read))
            report(0.2 + 0.8 * (k + 1) / len(chosen))
    except MediaError as e:
        raise WordsUnavailable(f"frames cannot be read ({e.reason})") from None
    if len(read) < len(chosen):
        log.info("%s: OCR read %d of %d planned frames in %.1f s (its share of the duration: %.1f s)",
                 Path(video_path).name, len(read), len(chosen), spent, cap)
    return _merge([found[i] for i, _ in read], [i for i, _ in read], [lines for _, lines in read])


def _thinned(keep: set[int], done: int, planned: int, left_s: float, per_frame_s: float) -> set[int]:
    """The frames still read after frame ``done`` when OCR runs slower than planned (a loaded machine, frames
    full of text): as many as the seconds left allow at the pace so far, evenly spread over the rest of the
    video, so that its end is read too."""
    ahead = [j for j in range(done + 1, planned) if j in keep]
    allowed = max(0, int(left_s / per_frame_s)) if per_frame_s > 0 else len(ahead)
    if allowed >= len(ahead):
        return keep
    spread = {ahead[int((i + 0.5) * len(ahead) / allowed)] for i in range(allowed)}
    return {j for j in keep if j <= done} | spread


def _merge(read: list[Scene], positions: list[int],
           lines: list[list[tuple[str, float]]]) -> list[WordSegment]:
    """One segment per line of text while it stays on screen: a line read in scenes next to each other
    (positions i and i + 1 of all scenes) extends its segment; its score is the best read."""
    open_: dict[str, list] = {}  # key -> [start, end, text, score, position of the last scene showing it]
    done: list[WordSegment] = []
    for scene, position, scene_lines in zip(read, positions, lines, strict=True):
        seen = set()
        for text, score in scene_lines:
            key = _key(text)
            if len(key) < 2 or key in seen:  # one sign alone is an icon or a speck read as "口" or "l"
                continue
            seen.add(key)
            current = open_.get(key)
            if current is not None and current[4] == position - 1:
                current[1], current[3], current[4] = scene.end, max(current[3], score), position
                continue
            if current is not None:
                done.append(_segment(current))
            open_[key] = [scene.start, scene.end, text, score, position]
        for key in [k for k, v in open_.items() if v[4] != position]:  # gone from the screen
            done.append(_segment(open_.pop(key)))
    done += [_segment(v) for v in open_.values()]
    return sorted(done, key=lambda s: (s.start, s.end, s.text))


def _key(text: str) -> str:
    """What makes two reads of a line the same line: its letters and digits, case folded."""
    return re.sub(r"\W+", "", text.casefold())


def _segment(state: list) -> WordSegment:
    """A WordSegment of a merged line."""
    start, end, text, score, _ = state
    return WordSegment("screen", round(start, 3), round(end, 3), text, round(min(1.0, score), 4))
