"""Training and evaluation data: the official MS-SL layout and the project's HDF5 feature files.

Official layout (what the MS-SL code reads; ``prvr.data.synthetic`` writes it, ``--data ROOT --collection NAME
--feature FEATURE`` reads it)::

    ROOT/NAME/TextData/NAME{train,val,test}.caption.txt     one caption a line: "<cap_id> <text>"
    ROOT/NAME/TextData/roberta_NAME_query_feat.hdf5          dataset per cap_id: (n_tokens, Dq) float32
    ROOT/NAME/FeatureData/FEATURE/shape.txt                  "<n_rows> <dim>"
    ROOT/NAME/FeatureData/FEATURE/id.txt                     the row ids, whitespace-separated (ISO-8859-1)
    ROOT/NAME/FeatureData/FEATURE/feature.bin                n_rows x dim little-endian float32, row-major
    ROOT/NAME/FeatureData/FEATURE/video2frames.txt           a Python dict literal {video_id: [row ids]}

A caption line is split on its first space; ``video_id = cap_id.split('#')[0]``; a split's videos are the
distinct video ids in order of first appearance in its caption file.

Our layout (written by ``python -m extract``; ``--features V.h5 --captions C.h5 --splits ...``): one video
feature file and one caption feature file (docs/design.md, Contract 2). Splits are named by *split lists*:
``--splits train=train.txt val=val.txt test=test.txt``, each a text file with one caption id a line (anything
after the first space is ignored, so official ``*.caption.txt`` files work unchanged). A caption's video is
its ``video_id`` attribute, or ``cap_id.split('#')[0]`` when that is empty. Without split lists, the one
split ``all`` holds every caption of C.h5, in file order.

Every video and caption is checked (ids present, dims, finite values, at least one row) with an error naming
the file and the id, then preprocessed once (``prvr.models.preprocess``) into packed tensors kept in memory; a
training batch is then a few gathers (``collate``), like the official ``collate_train``.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch
from torch import Tensor

from extract.features import FeatureFile
from extract.official import (  # noqa: F401 - re-exported: the layout's names live there
    BigFile,
    BigFileWriter,
    Caption,
    DataError,
    read_captions,
    read_video2frames,
    video_id_of,
)
from extract.profiles import check_identity
from prvr.models import preprocess
from prvr.models.preprocess import clip_input, frame_input, query_input
from prvr.plural import counted

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")


def checked_features(x: np.ndarray, dim: int, where: str, what: str) -> np.ndarray:
    """One (n, dim) float feature array checked by ``prvr.models.preprocess.check_rows``, its errors as
    DataError naming the file (``where``) and the id (``what``)."""
    try:
        return preprocess.check_rows(np.asarray(x), f"{where}: {what}", dim).numpy()
    except (TypeError, ValueError) as err:
        raise DataError(str(err)) from None


class OfficialSource:
    """Features and captions in the official MS-SL layout under ``root/collection``."""

    def __init__(self, root: str | Path, collection: str, feature: str):
        self.base = Path(root) / collection
        self.collection = collection
        self.bigfile = BigFile(self.base / "FeatureData" / feature)
        self.v2f_path = self.base / "FeatureData" / feature / "video2frames.txt"
        self.video2frames = read_video2frames(self.v2f_path)
        self.query_path = self.base / "TextData" / f"roberta_{collection}_query_feat.hdf5"
        if not self.query_path.is_file():
            raise FileNotFoundError(f"query feature file not found: {self.query_path}")
        self.h5 = h5py.File(self.query_path, "r")
        self.visual_dim = self.bigfile.dim
        self.query_dim = _first_dim(self.h5, self.query_path)
        self.profile = None  # the official layout records no feature profile

    def caption_file(self, split: str) -> Path:
        """TextData/<collection><split>.caption.txt."""
        return self.base / "TextData" / f"{self.collection}{split}.caption.txt"

    def has_split(self, split: str) -> bool:
        """True when the split's caption file exists."""
        return self.caption_file(split).is_file()

    def captions(self, split: str) -> list[Caption]:
        """The captions of one split, in caption-file order."""
        return read_captions(self.caption_file(split))

    def video_rows(self, video_id: str) -> np.ndarray:
        """All feature rows of one video, checked."""
        if video_id not in self.video2frames:
            raise DataError(f"{self.v2f_path}: video id {video_id!r} not found")
        where = str(self.bigfile.dir / "feature.bin")
        if not self.video2frames[video_id]:
            raise DataError(f"{self.v2f_path}: video {video_id!r} is empty (0 rows)")
        return checked_features(self.bigfile.read(self.video2frames[video_id], f"video {video_id!r}"),
                                self.visual_dim, where, f"video {video_id!r}")

    def caption_tokens(self, cap_id: str) -> np.ndarray:
        """The token features of one caption, checked."""
        return _read_tokens(self.h5, cap_id, self.query_dim, self.query_path)


def _first_dim(h5: h5py.File, path: Path) -> int:
    """The token feature width of a query HDF5 file (from its first dataset)."""
    for key in h5:
        shape = h5[key].shape
        if len(shape) != 2:
            raise DataError(f"{path}: caption {key!r} has shape {shape}, expected (tokens, dim)")
        return shape[1]
    raise DataError(f"{path}: no caption features")


def _read_tokens(h5: h5py.File, cap_id: str, dim: int, path: Path) -> np.ndarray:
    """One caption's (n_tokens, dim) features from an official query HDF5 file."""
    if cap_id not in h5:
        raise DataError(f"{path}: caption id {cap_id!r} not found")
    return checked_features(np.asarray(h5[cap_id][...]), dim, str(path), f"caption {cap_id!r}")


class HDF5Source:
    """The project's feature files (Contract 2), read through ``extract.features.FeatureFile``."""

    def __init__(self, features: str | Path, captions: str | Path,
                 splits: dict[str, str | Path] | None = None):
        self.features_path, self.captions_path = Path(features), Path(captions)
        self.videos, self.texts = FeatureFile(self.features_path), FeatureFile(self.captions_path)
        self.profile = self.videos.profile
        check_identity(self.profile, self.texts.profile, f"caption file {self.captions_path}")
        self.visual_dim = int(self.profile["visual_dim"])
        self.query_dim = int(self.profile["text_dim"])
        self.split_files = {k: Path(v) for k, v in (splits or {}).items()}
        self._video_set, self._caption_set = set(self.videos.video_ids()), set(self.texts.caption_ids())

    def has_split(self, split: str) -> bool:
        """True when a split list names this split (``all`` always exists)."""
        return split in self.split_files or split == "all"

    def captions(self, split: str) -> list[Caption]:
        """The captions of a split (its split list), or of the whole caption file for split ``all``."""
        if split in self.split_files:
            listed = [(c.cap_id, c.text) for c in read_captions(self.split_files[split], require_text=False)]
        elif split == "all":
            listed = [(cap_id, "") for cap_id in self.texts.caption_ids()]
        else:
            raise DataError(f"no split list for {split!r}: give --splits {split}=FILE "
                            f"(have: {sorted(self.split_files) or 'none'})")
        caps = []
        for cap_id, text in listed:
            self._check_caption(cap_id)
            caps.append(Caption(cap_id, self.texts.caption_video_id(cap_id) or video_id_of(cap_id), text))
        return caps

    def _check_caption(self, cap_id: str) -> None:
        """Raise naming the caption file when it lacks ``cap_id``."""
        if cap_id not in self._caption_set:
            raise DataError(f"{self.captions_path}: caption id {cap_id!r} not found")

    def video_rows(self, video_id: str) -> np.ndarray:
        """All feature rows of one video, checked."""
        if video_id not in self._video_set:
            raise DataError(f"{self.features_path}: video id {video_id!r} not found")
        return checked_features(self.videos.video(video_id).features, self.visual_dim,
                                str(self.features_path), f"video {video_id!r}")

    def caption_tokens(self, cap_id: str) -> np.ndarray:
        """The token features of one caption, checked."""
        self._check_caption(cap_id)
        return checked_features(self.texts.caption(cap_id)[1], self.query_dim, str(self.captions_path),
                                f"caption {cap_id!r}")


Source = OfficialSource | HDF5Source


@dataclass
class Packed:
    """Variable-length (n_i, D) sequences stored as one (R + 1, D) tensor; the last row is zeros (padding)."""

    rows: Tensor
    offsets: Tensor  # (N,) first row of each sequence
    lengths: Tensor  # (N,)

    @classmethod
    def from_list(cls, seqs: list[Tensor]) -> Packed:
        """Pack a list of (n_i, D) tensors."""
        lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
        offsets = torch.cumsum(lengths, 0) - lengths
        rows = torch.cat([*seqs, seqs[0].new_zeros(1, seqs[0].shape[1])])
        return cls(rows, offsets, lengths)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> Tensor:
        return self.rows[self.offsets[i]: self.offsets[i] + self.lengths[i]]

    def gather(self, idx: Tensor) -> tuple[Tensor, Tensor]:
        """Sequences ``idx`` zero-padded to (B, Lmax, D) with a float mask (B, Lmax), in one gather."""
        lengths = self.lengths[idx]
        steps = torch.arange(int(lengths.max()))
        valid = steps < lengths[:, None]  # (B, Lmax)
        pos = torch.where(valid, self.offsets[idx][:, None] + steps, len(self.rows) - 1)
        return self.rows.index_select(0, pos.reshape(-1)).view(*pos.shape, -1), valid.float()


@dataclass
class Batch:
    """One training batch in the official ``collate_train`` form."""

    clip_inputs: Tensor  # (B, map_size, Dv)
    frame_inputs: Tensor  # (B, Lmax, Dv), videos sorted by frame count, descending
    frame_mask: Tensor  # (B, Lmax)
    query_inputs: Tensor  # (Nq, Lq, Dq), captions flattened in video order
    query_mask: Tensor  # (Nq, Lq)
    query_labels: Tensor  # (Nq,) batch index of each query's video

    def to(self, device: torch.device | str) -> Batch:
        """Move every tensor to ``device``."""
        return Batch(*(t.to(device, non_blocking=True) for t in vars(self).values()))


@dataclass
class PreparedSplit:
    """A split preprocessed once: model inputs for every video and caption, kept in memory."""

    video_ids: list[str]  # order of first appearance in the caption list
    captions: list[Caption]
    cap_video: Tensor  # (Nq,) index into video_ids
    clip_inputs: Tensor  # (Nv, map_size, Dv)
    frames: Packed  # frame inputs, (min(n_i, max_ctx_l), Dv) each
    queries: Packed  # query inputs, (min(L_j, max_desc_l), Dq) each

    def __post_init__(self):
        # captions grouped by video (stable: file order within a video), for vectorised collation
        self.caps_by_video = torch.argsort(self.cap_video, stable=True)
        counts = torch.bincount(self.cap_video, minlength=len(self.video_ids))
        self.cap_count, self.cap_start = counts, torch.cumsum(counts, 0) - counts

    @property
    def visual_dim(self) -> int:
        return self.clip_inputs.shape[-1]

    @property
    def query_dim(self) -> int:
        return self.queries.rows.shape[-1]

    def collate(self, video_idx: Tensor) -> Batch:
        """Batch the given videos with all their captions, exactly like the official ``collate_train``."""
        lengths = self.frames.lengths[video_idx]
        videos = video_idx[torch.argsort(lengths, descending=True, stable=True)]
        counts = self.cap_count[videos]
        first = torch.repeat_interleave(self.cap_start[videos], counts)
        batch_start = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
        caps = self.caps_by_video[first + torch.arange(int(counts.sum())) - batch_start]
        frame_inputs, frame_mask = self.frames.gather(videos)
        query_inputs, query_mask = self.queries.gather(caps)
        labels = torch.repeat_interleave(torch.arange(len(videos)), counts)
        return Batch(self.clip_inputs[videos], frame_inputs, frame_mask, query_inputs, query_mask, labels)

    def batches(self, batch_size: int, generator: torch.Generator) -> Iterator[Batch]:
        """One shuffled epoch of training batches (the last one may be smaller, as with drop_last=False)."""
        order = torch.randperm(len(self.video_ids), generator=generator)
        for i in range(0, len(order), batch_size):
            yield self.collate(order[i: i + batch_size])

    def n_batches(self, batch_size: int) -> int:
        return -(-len(self.video_ids) // batch_size)


def prepare_split(source: Source, split: str, map_size: int = 32, max_ctx_l: int = 128,
                  max_desc_l: int = 30) -> PreparedSplit:
    """Read, check and preprocess every video and caption of a split once."""
    captions = source.captions(split)
    video_ids = list(dict.fromkeys(c.video_id for c in captions))
    index = {v: i for i, v in enumerate(video_ids)}
    clips = torch.empty(len(video_ids), map_size, source.visual_dim)
    frames = []
    for i, vid in enumerate(video_ids):
        rows = torch.from_numpy(source.video_rows(vid))
        clips[i] = clip_input(rows, map_size)
        frames.append(frame_input(rows, max_ctx_l))
    queries = [query_input(source.caption_tokens(c.cap_id), max_desc_l) for c in captions]
    log.info("prepared split %s: %s, %s", split, counted(len(video_ids), "video"),
             counted(len(captions), "caption"))
    return PreparedSplit(video_ids, captions, torch.tensor([index[c.video_id] for c in captions]), clips,
                         Packed.from_list(frames), Packed.from_list(queries))


def check_compatible(visual_dim: int, query_dim: int, profile: dict | None, source: Source,
                     owner: str) -> None:
    """Refuse data a model cannot use: other feature widths, or another feature profile (naming both)."""
    if (visual_dim, query_dim) != (source.visual_dim, source.query_dim):
        raise DataError(f"dims mismatch: {owner} expects visual {visual_dim} / query {query_dim}, but the "
                        f"data ({describe(source)}) has visual {source.visual_dim} / "
                        f"query {source.query_dim}")
    if profile is not None and source.profile is not None:

        check_identity(profile, source.profile, f"the data ({describe(source)}) for {owner}")


def describe(source: Source) -> str:
    """A short human-readable name of a data source for messages."""
    if isinstance(source, OfficialSource):
        return f"{source.bigfile.dir}, {source.query_path}"
    return f"{source.features_path}, {source.captions_path}"


def add_source_args(parser: argparse.ArgumentParser) -> None:
    """The data options shared by the train and evaluate CLIs (official layout or our HDF5 files)."""
    g = parser.add_argument_group("data (official layout, or our feature files)")
    g.add_argument("--data", help="official layout root (holds COLLECTION/TextData, COLLECTION/FeatureData)")
    g.add_argument("--collection", help="official layout: collection name, e.g. tvr")
    g.add_argument("--feature", help="official layout: visual feature name, e.g. i3d_resnet")
    g.add_argument("--features", help="our video feature file (HDF5, written by python -m extract)")
    g.add_argument("--captions", help="our caption feature file (HDF5)")
    g.add_argument("--splits", nargs="+", default=[], metavar="SPLIT=FILE",
                   help="our files: caption-id list per split, e.g. train=train.txt val=val.txt")


def source_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Source:
    """Open the data source the CLI options name; exactly one of the two layouts must be given."""
    official = (args.data, args.collection, args.feature)
    ours = (args.features, args.captions)
    if all(official) and not any(ours):
        return OfficialSource(*official)
    if all(ours) and not any(official):
        splits = dict(s.split("=", 1) for s in args.splits if "=" in s)
        if len(splits) != len(args.splits):
            parser.error(f"--splits takes SPLIT=FILE pairs, got {args.splits}")
        return HDF5Source(args.features, args.captions, splits)
    parser.error("give either --data ROOT --collection NAME --feature FEATURE, "
                 "or --features V.h5 --captions C.h5")
