"""The demo gallery as an annotated set, and the default model's retrieval and moment metrics on it.

    python -m prvr.evaluate --gallery demo [--root DIR] [--json]
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from extract.features import FeatureFile
from prvr.demo.gallery import DemoCaption, DemoGallery, build_demo_gallery
from prvr.evaluate.annotated import (
    IOU_HIT,
    AnnotatedSet,
    Query,
    evaluate_set,
    extract_features,
    reference_bank,
)
from prvr.index import GalleryVideo, IndexConfig, VideoIndex
from prvr.models.factory import create_model
from prvr.results.search import search

FEATURES_FILE = "features-{profile}.h5"


def caption_id(caption: DemoCaption, gallery: DemoGallery) -> str:
    """A stable id for a caption: ``<clip>#<n>``, n counting that clip's captions."""
    same = [c for c in gallery.captions if c.clip == caption.clip]
    return f"{caption.clip}#{same.index(caption)}"


def annotated_set(gallery: DemoGallery, profile: str = "lite") -> AnnotatedSet:
    """The gallery as an annotated set: every caption a query, every scene of its clip a moment (the clip is
    also the query's bootstrap unit: captions of one clip are resampled together)."""
    queries = []
    for c in gallery.captions:
        moments = {vid: tuple((m.start, m.end) for m in c.moments if m.video_id == vid) for vid in c.relevant}
        queries.append(Query(caption_id(c, gallery), c.text, moments, clip=c.clip))
    return AnnotatedSet(tuple((v.id, v.path) for v in gallery.videos), tuple(queries),
                        gallery.root / FEATURES_FILE.format(profile=profile))


def extract_demo_features(gallery: DemoGallery, profile: str = "lite") -> Path:
    """Feature file (videos + caption tokens) of the gallery, next to it; only new or changed items run."""
    return extract_features(annotated_set(gallery, profile), profile)


PROTOCOL = ("first-ranked relevant video; SumR = R@1 + R@5 + R@10; key moment = prvr.results.moments' key "
            f"moment on that video with IoU >= {IOU_HIT} to an annotated moment "
            "(key clip: MS-SL's raw key clip)")


def evaluate_demo(root: str | Path | None = None, model=None, video_ids: list[str] | None = None) -> dict:
    """Retrieval and moment metrics of ``model`` (default: the bridge) on the demo gallery's captions."""
    gallery = build_demo_gallery(root, video_ids)
    if not gallery.captions:
        raise ValueError(f"demo gallery in {gallery.root} has no captions to evaluate (videos {video_ids})")
    if model is None:
        model = create_model("lite").model
    report = evaluate_set(annotated_set(gallery), model)
    describe = model.describe() if hasattr(model, "describe") else {"fingerprint": model.fingerprint()}
    return {"gallery": {"root": str(gallery.root), "videos": report["videos"], "captions": report["queries"],
                        "relevant_per_caption": report["relevant_per_query"]},
            "model": describe, "protocol": PROTOCOL, "metrics": report["metrics"],
            "localisation": report["localisation"], "ci": report.get("ci")}


def top_videos(gallery: DemoGallery, model=None, profile: str = "lite") -> dict[str, str]:
    """Caption text -> the video the search path ranks first for it (two-branch scores), as ``evaluate_set``
    searches: one index of the gallery's videos with the model's reference bank."""
    if model is None:
        model = create_model("lite").model
    aset = annotated_set(gallery, profile)
    path = extract_features(aset, profile)
    ids = [vid for vid, _ in aset.videos]
    with FeatureFile(path) as ff:
        rows = [ff.video(vid) for vid in ids]
        tokens = [ff.caption(q.id)[1] for q in aset.queries]
    top = {}
    with tempfile.TemporaryDirectory(prefix="prvr-demo-") as tmp:
        index = VideoIndex.create(Path(tmp) / "index", model, IndexConfig(), reference_bank(model))
        index.add([GalleryVideo.from_features(vid, r) for vid, r in zip(ids, rows, strict=True)])
        for q, t in zip(aset.queries, tokens, strict=True):
            top[q.text] = search([index], t, k=1).results[0]["video_id"]
    return top
