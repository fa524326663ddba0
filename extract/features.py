"""The project's feature files (HDF5) and an exporter to the official MS-SL layout.

Layout (docs/design.md, Contract 2)::

    /                 attrs: format="prvr-features", format_version=1, profile=<json identity>
    /videos/<key>     group, attrs: id, sha256, duration (s), source (file name), warnings (json list),
                      complete (set last: readers skip groups an interrupted run left behind)
       features       (n, visual_dim) float32, one row per window
       start, end     (n,) float32 seconds of each row
    /captions/<key>   dataset (L, text_dim) float32 token features, attrs: id, text, video_id ("" if none)

``<key>`` is the id with ``%`` and ``/`` percent-escaped; ids are kept verbatim in the ``id`` attribute.
Write with ``FeatureWriter(path, profile)`` (appends; refuses a file of another profile), read with
``FeatureFile(path)``: ``.profile``, ``.video_ids()``, ``.video(id) -> VideoFeatures``,
``.caption_ids()``, ``.caption(id) -> (text, tokens)``, ``.caption_video_id(id)``, ``.has_sha256(hex)``.

``export_official`` writes the official BigFile + HDF5 + caption layout (../shared/docs/mssl-reference.md
section 1) so the official code and ours train on the same features.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from extract.official import BigFileWriter, read_captions
from extract.profiles import Profile, ProfileMismatch, check_identity
from prvr.plural import counted

log = logging.getLogger(__name__)

FORMAT, FORMAT_VERSION = "prvr-features", 1


@dataclass
class VideoFeatures:
    """One video's feature rows and the time span of each."""

    features: np.ndarray  # (n, D) float32
    start: np.ndarray  # (n,) seconds
    end: np.ndarray  # (n,) seconds
    duration: float  # seconds covered (a damaged video: the part that decoded)
    sha256: str
    source: str  # file name the features came from
    warnings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.features = np.asarray(self.features, dtype=np.float32)
        self.start = np.asarray(self.start, dtype=np.float32)
        self.end = np.asarray(self.end, dtype=np.float32)
        n = len(self.features)
        if self.features.ndim != 2 or n == 0 or self.start.shape != (n,) or self.end.shape != (n,):
            raise ValueError(f"{self.source}: features {self.features.shape}, start {self.start.shape}, end "
                             f"{self.end.shape} do not describe n >= 1 rows")


def _key(item_id: str) -> str:
    """HDF5-safe key of an id: '%' and '/' percent-escaped (injective, so ids never collide)."""
    if not item_id:
        raise ValueError("empty id")
    return item_id.replace("%", "%25").replace("/", "%2F")


class FeatureFile:
    """Read access to a feature file; incomplete video groups (interrupted writes) are skipped."""

    def __init__(self, path: str | Path, _mode: str = "r") -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"feature file {self.path} does not exist")
        self._h5 = h5py.File(self.path, _mode)
        if self._h5.attrs.get("format") != FORMAT:
            found = self._h5.attrs.get("format")
            self._h5.close()
            raise ValueError(f"{self.path} is not a prvr feature file (format attr {found!r}); "
                             "write one with `python -m extract`")
        self.profile: dict = json.loads(self._h5.attrs["profile"])
        videos, captions = self._h5.get("videos", {}), self._h5.get("captions", {})
        self._videos = {g.attrs["id"]: k for k, g in videos.items() if g.attrs.get("complete")}
        self._sha = {videos[k].attrs["sha256"] for k in self._videos.values()}
        self._captions = {d.attrs["id"]: k for k, d in captions.items()}

    def video_ids(self) -> list[str]:
        """Ids of the completely written videos, in file order."""
        return list(self._videos)

    def video(self, video_id: str) -> VideoFeatures:
        """Features of one video."""
        if video_id not in self._videos:
            raise KeyError(f"video {video_id!r} is not in {self.path}")
        g = self._h5["videos"][self._videos[video_id]]
        return VideoFeatures(g["features"][...], g["start"][...], g["end"][...], float(g.attrs["duration"]),
                             str(g.attrs["sha256"]), str(g.attrs["source"]), json.loads(g.attrs["warnings"]))

    def has_sha256(self, sha256: str) -> bool:
        """True when a video with these bytes is already in the file."""
        return sha256 in self._sha

    def caption_ids(self) -> list[str]:
        """Ids of the captions, in file order."""
        return list(self._captions)

    def caption(self, cap_id: str) -> tuple[str, np.ndarray]:
        """(text, tokens (L, text_dim) float32) of one caption."""
        if cap_id not in self._captions:
            raise KeyError(f"caption {cap_id!r} is not in {self.path}")
        d = self._h5["captions"][self._captions[cap_id]]
        return str(d.attrs["text"]), d[...]

    def caption_video_id(self, cap_id: str) -> str:
        """The video a caption describes ("" when unknown)."""
        if cap_id not in self._captions:
            raise KeyError(f"caption {cap_id!r} is not in {self.path}")
        return str(self._h5["captions"][self._captions[cap_id]].attrs["video_id"])

    def close(self) -> None:
        """Close the HDF5 file (flushing it when writing)."""
        if self._h5.id.valid:
            self._h5.close()

    def __enter__(self) -> FeatureFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FeatureWriter(FeatureFile):
    """Append videos and captions to a feature file of one profile; each video is flushed when written.

    Opening an existing file of another profile raises ``ProfileMismatch`` naming both profiles.
    """

    def __init__(self, path: str | Path, profile: Profile) -> None:
        path = Path(path)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            with h5py.File(path, "w") as h5:
                h5.attrs.update(format=FORMAT, format_version=FORMAT_VERSION)
                h5.attrs["profile"] = json.dumps(profile.identity())
                h5.create_group("videos", track_order=True)  # iterate in insertion order, not by name
                h5.create_group("captions", track_order=True)
        super().__init__(path, _mode="a")
        self.identity = profile.identity()
        try:
            check_identity(self.identity, self.profile, f"existing feature file {path}")
        except ProfileMismatch:
            self.close()
            raise

    def add_video(self, video_id: str, video: VideoFeatures) -> None:
        """Write (or replace) one video; the ``complete`` attribute is set last, then the file flushed."""
        if video.features.shape[1] != self.identity["visual_dim"]:
            raise ValueError(f"video {video_id}: {video.features.shape[1]}-d rows, profile "
                             f"{self.identity['name']} needs {self.identity['visual_dim']}")
        videos, key = self._h5["videos"], _key(video_id)
        if key in videos:
            del videos[key]
        g = videos.create_group(key)
        g.create_dataset("features", data=video.features)
        g.create_dataset("start", data=video.start)
        g.create_dataset("end", data=video.end)
        g.attrs.update(id=video_id, sha256=video.sha256, duration=video.duration, source=video.source,
                       warnings=json.dumps(video.warnings))
        g.attrs["complete"] = True
        self._h5.flush()
        self._videos[video_id] = key
        self._sha.add(video.sha256)

    def add_caption(self, cap_id: str, text: str, tokens: np.ndarray, video_id: str = "") -> None:
        """Write (or replace) one caption's token features."""
        tokens = np.asarray(tokens, dtype=np.float32)
        if tokens.ndim != 2 or tokens.shape[1] != self.identity["text_dim"] or not len(tokens):
            raise ValueError(f"caption {cap_id}: tokens {tokens.shape}, profile {self.identity['name']} "
                             f"needs (L >= 1, {self.identity['text_dim']})")
        captions, key = self._h5["captions"], _key(cap_id)
        if key in captions:
            del captions[key]
        d = captions.create_dataset(key, data=tokens)
        d.attrs.update(id=cap_id, text=text, video_id=video_id)
        self._captions[cap_id] = key


def export_official(feature_file: str | Path, caption_file: str | Path | Mapping[str, str | Path],
                    out_root: str | Path, collection: str, feature_name: str) -> Path:
    """Write ``<out_root>/<collection>/{FeatureData/<feature_name>, TextData}`` in the official layout.

    ``caption_file`` is one caption file (written as the ``train`` split) or a mapping split -> file
    (e.g. train/val/test). Every caption needs token features in the feature file and its video
    (``cap_id.split('#')[0]``) features; row ids are ``<video_id>_<row>``. Returns the collection folder.
    """
    splits = dict(caption_file) if isinstance(caption_file, Mapping) else {"train": caption_file}
    root = Path(out_root) / collection
    text_dir, feat_dir = root / "TextData", root / "FeatureData" / feature_name
    text_dir.mkdir(parents=True, exist_ok=True)
    feat_dir.mkdir(parents=True, exist_ok=True)
    with FeatureFile(feature_file) as ff:
        captions = {split: read_captions(path) for split, path in splits.items()}
        cap_ids = list(dict.fromkeys(c.cap_id for caps in captions.values() for c in caps))
        video_ids = list(dict.fromkeys(c.video_id for caps in captions.values() for c in caps))
        _check_present(ff, video_ids, cap_ids)
        _write_bigfile(ff, video_ids, feat_dir)
        with h5py.File(text_dir / f"roberta_{collection}_query_feat.hdf5", "w") as h5:
            for cap_id in cap_ids:
                h5.create_dataset(cap_id, data=ff.caption(cap_id)[1])
    for split, caps in captions.items():
        lines = "".join(f"{c.cap_id} {c.text}\n" for c in caps)
        (text_dir / f"{collection}{split}.caption.txt").write_text(lines, encoding="utf-8")
    log.info("exported %s to %s", counted(len(video_ids), "video"), root)
    return root


def _check_present(ff: FeatureFile, video_ids: list[str], cap_ids: list[str]) -> None:
    """Raise naming the first few videos/captions the caption files need but the feature file lacks."""
    missing_v = [v for v in video_ids if v not in set(ff.video_ids())]
    missing_c = [c for c in cap_ids if c not in set(ff.caption_ids())]
    if missing_v or missing_c:
        raise KeyError(f"{ff.path} lacks {len(missing_v)} videos {missing_v[:5]} and {len(missing_c)} "
                       f"captions {missing_c[:5]} named in the caption files; extract them first")
    bad = [v for v in video_ids if any(ch.isspace() for ch in v) or _latin1(v) is None]
    if bad:
        raise ValueError(f"video ids {bad[:5]} cannot be written to id.txt (whitespace-separated ISO-8859-1)")


def _latin1(text: str) -> bytes | None:
    """ISO-8859-1 bytes of text, or None when it has other characters."""
    try:
        return text.encode("iso-8859-1")
    except UnicodeEncodeError:
        return None


def _write_bigfile(ff: FeatureFile, video_ids: list[str], folder: Path) -> None:
    """The videos' rows as a BigFile (row ids ``<video_id>_<k>``) with its video2frames.txt."""
    video2frames: dict[str, list[str]] = {}
    with BigFileWriter(folder, int(ff.profile["visual_dim"])) as writer:
        for vid in video_ids:
            rows = ff.video(vid).features
            video2frames[vid] = [f"{vid}_{k}" for k in range(len(rows))]
            writer.add(video2frames[vid], rows)
        writer.write_video2frames(video2frames)
