"""The embedded demo gallery's recipe and cache: untrimmed videos generated from scikit-image's
photographs, with moments and captions (rendering: ``prvr.render``; evaluation: ``prvr.annotated``).

Every video is rendered from ``assets/demo_gallery.json``: a sequence of scenes, each one photograph with a
gentle camera motion (pan or zoom, as a moving crop), joined by cross-fades, with a few seconds of a plain
grey card between some scenes. So every caption describes only part of a video: this is what PRVR is about.

Moment boundaries (seconds) are exact by construction: a scene's moment is the span in which its photograph
is fully visible, i.e. from the end of the cross-fade into it to the start of the cross-fade out of it
(the first scene starts at 0 s, the last ends at the video's end). Cross-fades belong to no moment.

A caption describes one photograph; every video that shows that photograph is relevant to it, and all the
photograph's scenes in those videos are its moments.

The videos are cached in a data directory (default ``~/.cache/prvr/demo``) and re-rendered only when the
generator version, the render settings or the video's recipe change; rendering is deterministic.

    python -m prvr.demo build [--root DIR]              # render (or reuse) the gallery and list it
    python -m prvr.demo evaluate [--root DIR] [--json]  # the default model's metrics on its captions
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from prvr.annotated import IOU_HIT, AnnotatedSet, Query, evaluate_set, extract_features, format_report
from prvr.paths import cache_dir
from prvr.render import GENERATOR_VERSION, MOTIONS, RenderConfig, Scene, render_videos

log = logging.getLogger(__name__)

SPEC_PATH = Path(__file__).resolve().parents[1] / "assets" / "demo_gallery.json"


@dataclass(frozen=True)
class Moment:
    video_id: str
    photo: str
    start: float  # seconds, photograph fully visible from here ...
    end: float  # ... to here


@dataclass(frozen=True)
class DemoVideo:
    id: str
    title: str
    path: Path
    duration: float
    moments: tuple[Moment, ...]  # one per photograph scene, in time order (filler cards have none)


@dataclass(frozen=True)
class DemoCaption:
    text: str
    photo: str
    relevant: tuple[str, ...]  # ids of every video showing the photograph
    moments: tuple[Moment, ...]  # every scene of the photograph in those videos


@dataclass(frozen=True)
class DemoGallery:
    root: Path
    videos: tuple[DemoVideo, ...]
    captions: tuple[DemoCaption, ...]

    def video(self, video_id: str) -> DemoVideo:
        """The video with this id."""
        for video in self.videos:
            if video.id == video_id:
                return video
        raise KeyError(f"no demo video {video_id!r}; have {[v.id for v in self.videos]}")


# ---------------------------------------------------------------------------------------------- recipe


def load_spec(path: Path = SPEC_PATH) -> dict:
    """Read and validate the gallery recipe (photos with captions, videos as scene lists)."""
    spec = json.loads(Path(path).read_text())
    photos, ids = spec["photos"], set()
    for video in spec["videos"]:
        vid = video["id"]
        if vid in ids:
            raise ValueError(f"{path}: duplicate video id {vid!r}")
        ids.add(vid)
        for scene in video["scenes"]:
            if "filler" in scene:
                continue
            if scene["photo"] not in photos:
                raise ValueError(f"{path}: video {vid!r} uses unknown photo {scene['photo']!r}")
            if scene.get("motion", "zoom_in") not in MOTIONS:
                raise ValueError(f"{path}: video {vid!r} has motion {scene['motion']!r}; known: {MOTIONS}")
    return spec


def timeline(video: dict, transition_s: float) -> list[Scene]:
    """Place a video's scenes on the time axis: each holds for its seconds, then cross-fades."""
    scenes, t = [], 0.0
    for item in video["scenes"]:
        seconds = float(item.get("filler", item.get("seconds", 0)))
        if seconds <= 0:
            raise ValueError(f"video {video['id']!r}: scene {item} needs a positive duration")
        if "filler" in item:
            scenes.append(Scene(None, t, t + seconds))
        else:
            focus = tuple(item.get("focus", (0.5, 0.5)))
            scenes.append(Scene(item["photo"], t, t + seconds, item.get("motion", "zoom_in"), focus))
        t += seconds + transition_s
    return scenes


# ------------------------------------------------------------------------------------------- gallery


def _recipe_key(video: dict, photos: dict, cfg: RenderConfig) -> str:
    """Hash of everything a rendered video depends on (captions excluded: they are not drawn)."""
    used = {s["photo"]: {k: v for k, v in photos[s["photo"]].items() if k != "captions"}
            for s in video["scenes"] if "photo" in s}
    blob = json.dumps([GENERATOR_VERSION, asdict(cfg), video, used], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def caption_list(spec: dict, videos: list[DemoVideo]) -> tuple[DemoCaption, ...]:
    """Every caption of every photograph shown, with its relevant videos and moments."""
    captions = []
    for name, photo in spec["photos"].items():
        moments = tuple(m for v in videos for m in v.moments if m.photo == name)
        if not moments:
            continue
        relevant = tuple(dict.fromkeys(m.video_id for m in moments))
        captions += [DemoCaption(text, name, relevant, moments) for text in photo["captions"]]
    return tuple(captions)


def build_demo_gallery(
    root: str | Path | None = None,
    video_ids: list[str] | None = None,
    cfg: RenderConfig | None = None,
    spec_path: Path = SPEC_PATH,
) -> DemoGallery:
    """Render (or reuse from ``root``) the demo videos, optionally only ``video_ids``; return the gallery."""
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
        path, keys[video["id"]] = root / f"{video['id']}.mp4", _recipe_key(video, spec["photos"], cfg)
        scenes = timeline(video, cfg.transition_s)
        if manifest.get(video["id"]) != keys[video["id"]] or not path.exists():
            stale[video["id"]] = (path, scenes)
        moments = tuple(Moment(video["id"], s.photo, s.start, s.end) for s in scenes if s.photo is not None)
        videos.append(DemoVideo(video["id"], video["title"], path, scenes[-1].end, moments))
    for video_id in render_videos(stale, spec["photos"], cfg):
        manifest[video_id] = keys[video_id]
        tmp = manifest_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
        os.replace(tmp, manifest_path)
    return DemoGallery(root, tuple(videos), caption_list(spec, videos))


# ------------------------------------------------------------------------------------------ evaluation

FEATURES_FILE = "features-{profile}.h5"


def caption_id(caption: DemoCaption, gallery: DemoGallery) -> str:
    """A stable id for a caption: ``<photo>#<n>``, n counting that photo's captions."""
    same = [c for c in gallery.captions if c.photo == caption.photo]
    return f"{caption.photo}#{same.index(caption)}"


def annotated_set(gallery: DemoGallery, profile: str = "lite") -> AnnotatedSet:
    """The gallery as an annotated set: every caption a query, every scene of its photo a moment."""
    queries = []
    for c in gallery.captions:
        moments = {vid: tuple((m.start, m.end) for m in c.moments if m.video_id == vid) for vid in c.relevant}
        queries.append(Query(caption_id(c, gallery), c.text, moments))
    return AnnotatedSet(tuple((v.id, v.path) for v in gallery.videos), tuple(queries),
                        gallery.root / FEATURES_FILE.format(profile=profile))


def extract_demo_features(gallery: DemoGallery, profile: str = "lite") -> Path:
    """Feature file (videos + caption tokens) of the gallery, next to it; only new or changed items run."""
    return extract_features(annotated_set(gallery, profile), profile)


PROTOCOL = ("first-ranked relevant video; SumR = R@1 + R@5 + R@10; key moment = prvr.moments' key moment on "
            f"that video with IoU >= {IOU_HIT} to an annotated moment (key clip: MS-SL's raw key clip)")


def evaluate_demo(root: str | Path | None = None, model=None, video_ids: list[str] | None = None) -> dict:
    """Retrieval and moment metrics of ``model`` (default: the bridge) on the demo gallery's captions."""
    gallery = build_demo_gallery(root, video_ids)
    if not gallery.captions:
        raise ValueError(f"demo gallery in {gallery.root} has no captions to evaluate (videos {video_ids})")
    if model is None:
        from prvr.bridge import BridgeModel

        model = BridgeModel.from_pretrained()
    report = evaluate_set(annotated_set(gallery), model)
    describe = model.describe() if hasattr(model, "describe") else {"fingerprint": model.fingerprint()}
    return {"gallery": {"root": str(gallery.root), "videos": report["videos"], "captions": report["queries"],
                        "relevant_per_caption": report["relevant_per_query"]},
            "model": describe, "protocol": PROTOCOL, "metrics": report["metrics"],
            "localisation": report["localisation"]}


# ------------------------------------------------------------------------------------------------ CLI


def main(argv: list[str] | None = None) -> None:
    """``python -m prvr.demo build|evaluate [--root DIR] [--json]``."""
    parser = argparse.ArgumentParser(prog="python -m prvr.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("build", "evaluate"),
                        help="build: render the gallery; evaluate: metrics of the default model on it")
    parser.add_argument("--root", type=Path, default=None,
                        help=f"data directory (default {cache_dir('demo')})")
    parser.add_argument("--videos", nargs="+", default=None, help="only these video ids (default: all)")
    parser.add_argument("--json", action="store_true", help="print the evaluation as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "build":
        gallery = build_demo_gallery(args.root, args.videos)
        for video in gallery.videos:
            print(f"{video.id}  {video.duration:5.1f} s  {video.title:24s} {video.path}")
        print(f"{len(gallery.captions)} captions")
        return
    report = evaluate_demo(args.root, video_ids=args.videos)
    if args.json:
        print(json.dumps(report, indent=1))
        return
    gallery = report["gallery"]
    print(report["protocol"])
    print(format_report({"videos": gallery["videos"], "queries": gallery["captions"], **report}))


if __name__ == "__main__":
    main()
