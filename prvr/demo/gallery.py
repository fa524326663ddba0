"""The demo gallery's recipe and cache: untrimmed videos of REAL footage, with moments and captions
(building: ``prvr.demo.compose``; the shipped clips: ``prvr.demo.clips``; evaluation: ``prvr.evaluate.demo``).

Every video is built from ``assets/demo_gallery.json``: a sequence of scenes, each a real clip shipped in
``assets/demo_clips`` (CC0, CC-BY-4.0 or NASA footage; credits in ``assets/demo_clips/CREDITS.md``), joined by
1 s cross-fades, with a few seconds of a plain grey or black card between some scenes. So every caption
describes only part of a video: this is what PRVR is about.

Moment boundaries (seconds) are exact by construction: a clip's moment is the span in which it plays, from
its first frame to its last (a looped clip: all its plays); cross-fades and cards belong to no moment.

A caption describes one clip (the clip key is ``DemoCaption.clip``); every video that plays that clip is
relevant to it, and all the clip's scenes in those videos are its moments.

The videos are cached in a data directory (default ``~/.cache/prvr/demo``) and rebuilt only when the
generator version, the build settings, the video's recipe or a clip it plays change; building is
deterministic. ``example_captions`` gives the captions the offline default ranks first for a relevant video,
measured once and stored in the recipe (``python -m prvr.evaluate.measure``), so the app needs no evaluation.

    python -m prvr.demo [--root DIR]                    # build (or reuse) the gallery and list it
    python -m prvr.evaluate --gallery demo [--json]     # the default model's metrics on its captions
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from prvr.demo.compose import (
    CARD_LUMA,
    CLIPS_DIR,
    GENERATOR_VERSION,
    RenderConfig,
    Scene,
    clip_frame_count,
    clip_path,
    render_videos,
)
from prvr.paths import cache_dir

log = logging.getLogger(__name__)

SPEC_PATH = Path(__file__).resolve().parents[2] / "assets" / "demo_gallery.json"


@dataclass(frozen=True)
class Moment:
    video_id: str
    clip: str
    start: float  # seconds: the clip plays from here ...
    end: float  # ... to here


@dataclass(frozen=True)
class DemoVideo:
    id: str
    title: str
    path: Path
    duration: float
    moments: tuple[Moment, ...]  # one per clip scene, in time order (filler cards have none)


@dataclass(frozen=True)
class DemoCaption:
    text: str
    clip: str  # the recipe's clip key the caption describes
    relevant: tuple[str, ...]  # ids of every video playing the clip
    moments: tuple[Moment, ...]  # every scene of the clip in those videos


@dataclass(frozen=True)
class DemoGallery:
    root: Path
    videos: tuple[DemoVideo, ...]
    captions: tuple[DemoCaption, ...]
    examples: tuple[str, ...] = ()  # example_captions: stored answers of the offline default, rank 1

    def video(self, video_id: str) -> DemoVideo:
        """The video with this id."""
        for video in self.videos:
            if video.id == video_id:
                return video
        raise KeyError(f"no demo video {video_id!r}; have {[v.id for v in self.videos]}")


# ---------------------------------------------------------------------------------------------- recipe


def load_spec(path: Path = SPEC_PATH) -> dict:
    """Read and validate the gallery recipe (clips with captions, videos as scene lists)."""
    spec = json.loads(Path(path).read_text())
    clips, ids = spec["clips"], set()
    for key, clip in clips.items():
        segments = clip.get("segments") or []
        if not segments or any(not 0 <= a < b for a, b in segments):
            raise ValueError(f"{path}: clip {key!r} needs segments [start, end] with 0 <= start < end")
        if not 2 <= len(clip.get("captions", ())) <= 3:
            raise ValueError(f"{path}: clip {key!r} needs 2-3 captions")
    for video in spec["videos"]:
        vid = video["id"]
        if vid in ids:
            raise ValueError(f"{path}: duplicate video id {vid!r}")
        ids.add(vid)
        for scene in video["scenes"]:
            if "filler" in scene:
                if scene.get("colour", "grey") not in CARD_LUMA:
                    raise ValueError(f"{path}: video {vid!r} has a {scene['colour']!r} card; known: "
                                     f"{sorted(CARD_LUMA)}")
                continue
            if scene["clip"] not in clips:
                raise ValueError(f"{path}: video {vid!r} uses unknown clip {scene['clip']!r}")
            if int(scene.get("loops", 1)) < 1:
                raise ValueError(f"{path}: video {vid!r}: loops must be >= 1")
    return spec


def clip_seconds(clip: dict, fps: int = RenderConfig.fps) -> float:
    """Seconds of one play of a recipe clip (a whole number of frames)."""
    return sum(round((b - a) * fps) for a, b in clip["segments"]) / fps


def timeline(video: dict, transition_s: float = RenderConfig.transition_s, clips: dict | None = None
             ) -> list[Scene]:
    """Place a video's scenes on the time axis: each plays for its length, then cross-fades into the next.
    ``clips``: the recipe's clips (default: the shipped recipe's)."""
    clips = clips if clips is not None else load_spec()["clips"]
    scenes, t = [], 0.0
    for item in video["scenes"]:
        if "filler" in item:
            seconds = float(item["filler"])
            if seconds <= 0:
                raise ValueError(f"video {video['id']!r}: filler {item} needs a positive duration")
            scenes.append(Scene(None, round(t, 3), round(t + seconds, 3), colour=item.get("colour", "grey")))
        else:
            loops = int(item.get("loops", 1))
            seconds = clip_seconds(clips[item["clip"]]) * loops
            scenes.append(Scene(item["clip"], round(t, 3), round(t + seconds, 3), loops))
        t += seconds + transition_s
    return scenes


# ------------------------------------------------------------------------------------------- gallery


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "missing"


def _recipe_key(video: dict, clips: dict, cfg: RenderConfig, clips_dir: Path) -> str:
    """Hash of everything a built video depends on (captions excluded: they are not shown)."""
    used = {s["clip"]: {"segments": clips[s["clip"]]["segments"],
                        "sha256": _sha256(clip_path(s["clip"], clips_dir))}
            for s in video["scenes"] if "clip" in s}
    blob = json.dumps([GENERATOR_VERSION, asdict(cfg), video, used], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def caption_list(spec: dict, videos: list[DemoVideo]) -> tuple[DemoCaption, ...]:
    """Every caption of every clip shown, with its relevant videos and moments."""
    captions = []
    for name, clip in spec["clips"].items():
        moments = tuple(m for v in videos for m in v.moments if m.clip == name)
        if not moments:
            continue
        relevant = tuple(dict.fromkeys(m.video_id for m in moments))
        captions += [DemoCaption(text, name, relevant, moments) for text in clip["captions"]]
    return tuple(captions)


def interleaved(captions: Sequence[DemoCaption], limit: int | None = None) -> list[str]:
    """Caption texts, one of each clip in turn, each text once (a page's first examples show different
    clips)."""
    by_clip: dict[str, list[str]] = {}
    for c in captions:
        by_clip.setdefault(c.clip, []).append(c.text)
    rounds = max((len(v) for v in by_clip.values()), default=0)
    ordered = [texts[i] for i in range(rounds) for texts in by_clip.values() if i < len(texts)]
    return list(dict.fromkeys(ordered))[:limit]


def example_captions(gallery: DemoGallery | None = None, spec: dict | None = None) -> list[str]:
    """Example queries for the page: the recipe's stored ``examples`` (captions the offline default ranks
    first for a relevant video, over the whole gallery; ``python -m prvr.evaluate.measure``), restricted
    to the captions of ``gallery`` when given (a gallery of some videos only)."""
    spec = spec if spec is not None else load_spec()
    examples = list(spec.get("examples", ()))
    if gallery is not None:
        shown = {c.text for c in gallery.captions}
        examples = [e for e in examples if e in shown]
    return examples


def build_demo_gallery(
    root: str | Path | None = None,
    video_ids: list[str] | None = None,
    cfg: RenderConfig | None = None,
    spec_path: Path = SPEC_PATH,
    clips_dir: Path = CLIPS_DIR,
) -> DemoGallery:
    """Build (or reuse from ``root``) the demo videos, optionally only ``video_ids``; return the gallery."""
    cfg = cfg or RenderConfig()
    root = Path(root) if root is not None else cache_dir("demo")
    root.mkdir(parents=True, exist_ok=True)
    spec = load_spec(spec_path)
    chosen = [v for v in spec["videos"] if video_ids is None or v["id"] in video_ids]
    missing = set(video_ids or ()) - {v["id"] for v in chosen}
    if missing:
        raise KeyError(f"unknown demo video ids {sorted(missing)}; have {[v['id'] for v in spec['videos']]}")
    manifest_path = root / "gallery.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    videos, stale, keys = [], {}, {}
    for video in chosen:
        path = root / f"{video['id']}.mp4"
        keys[video["id"]] = _recipe_key(video, spec["clips"], cfg, clips_dir)
        scenes = timeline(video, cfg.transition_s, spec["clips"])
        if manifest.get(video["id"]) != keys[video["id"]] or not path.exists():
            stale[video["id"]] = (path, scenes)
        moments = tuple(Moment(video["id"], s.clip, s.start, s.end) for s in scenes if s.clip is not None)
        videos.append(DemoVideo(video["id"], video["title"], path, scenes[-1].end, moments))
    frames = {key: clip_frame_count(clip, cfg) for key, clip in spec["clips"].items()}
    for video_id in render_videos(stale, frames, cfg, clips_dir):
        manifest[video_id] = keys[video_id]
        tmp = manifest_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
        os.replace(tmp, manifest_path)
    gallery = DemoGallery(root, tuple(videos), caption_list(spec, videos))
    return replace(gallery, examples=tuple(example_captions(gallery, spec)))
