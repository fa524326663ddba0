"""Videos going into an index: the input record, its validation, and its encoding by the model.

``encode_for_index`` runs the model protocol (docs/design.md, Contract 3) once per video and keeps what
exact search needs: the clip units, the norm and window index of every stored proposal, the normalised
key-clip-guided frame feature z of every stored proposal (query-independent, see ``prvr.index.kernels``) and
the encoded frames (for the attention shown with a result).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from prvr.clustering import length_aware_kmedoids

COMPACT_PROPOSALS = 32  # MS-SL++ medoids per video in compact mode


class GalleryError(ValueError):
    """Videos that cannot be added (bad features, timestamps, duplicate or unknown ids); nothing changed."""


@dataclass
class GalleryVideo:
    """One video to index: raw feature rows with their time spans (extract.features.VideoFeatures-like)."""

    id: str
    features: np.ndarray  # (n, Dv) float32 raw rows
    start: np.ndarray  # (n,) seconds
    end: np.ndarray  # (n,) seconds
    duration: float = 0.0
    title: str = ""
    path: str = ""
    sha256: str = ""

    @classmethod
    def from_features(cls, video_id: str, vf, title: str = "", path: str = "") -> GalleryVideo:  # noqa: ANN001
        """From an ``extract.features.VideoFeatures``."""
        return cls(video_id, vf.features, vf.start, vf.end, float(vf.duration), title or vf.source,
                   path, vf.sha256)

    def record(self) -> dict:
        """The JSON record stored with the segment."""
        return {"id": self.id, "title": self.title, "path": self.path, "duration": float(self.duration),
                "sha256": self.sha256}


def check_videos(videos: Sequence[GalleryVideo], existing: set[str]) -> None:
    """Raise GalleryError naming the video and the problem; checks everything before anything is written."""
    seen: set[str] = set()
    for v in videos:
        if not isinstance(v.id, str) or not v.id.strip():
            raise GalleryError(f"video id {v.id!r}: ids must be non-empty strings")
        if v.id in existing or v.id in seen:
            where = "in the index" if v.id in existing else "in this batch"
            raise GalleryError(f"video id {v.id!r} is already {where}")
        seen.add(v.id)
        x = np.asarray(v.features)
        if x.ndim != 2 or x.shape[0] == 0:
            raise GalleryError(f"video {v.id!r}: features must be (n >= 1, dim), got shape {x.shape}")
        if not np.isfinite(x).all():
            raise GalleryError(f"video {v.id!r}: features contain NaN or inf")
        start, end = np.asarray(v.start, dtype=np.float64), np.asarray(v.end, dtype=np.float64)
        if start.shape != (len(x),) or end.shape != (len(x),):
            raise GalleryError(f"video {v.id!r}: {len(x)} feature rows but start {start.shape}, "
                               f"end {end.shape}")
        if not (np.isfinite(start).all() and np.isfinite(end).all() and (end >= start).all()):
            raise GalleryError(f"video {v.id!r}: row times must be finite with end >= start")
        if not math.isfinite(float(v.duration)) or v.duration < 0:
            raise GalleryError(f"video {v.id!r}: duration {v.duration} is not a non-negative number")


def _frame_count(mask: torch.Tensor) -> np.ndarray:
    """(Nv, L) float mask -> (Nv,) valid frame counts."""
    return mask.sum(1).round().long().cpu().numpy()


def encode_for_index(model, videos: Sequence[GalleryVideo], mode: str, batch: int) -> dict[str, list]:  # noqa: ANN001
    """Run the model over raw rows: per-video units, proposal norms and indices, normalised z, frames."""
    out: dict[str, list] = {k: [] for k in ("units", "pnorm", "pidx", "zhat", "frames", "n_frames")}
    for a in range(0, len(videos), batch):
        part = videos[a:a + batch]
        try:
            enc = model.encode_videos([np.asarray(v.features, dtype=np.float32) for v in part])
        except ValueError as e:
            raise GalleryError(f"videos {[v.id for v in part]}: {e}") from None
        props, pidx = enc.proposals, enc.proposal_index
        if mode == "compact" and props.shape[1] != COMPACT_PROPOSALS:
            attend_idx = length_aware_kmedoids(props, COMPACT_PROPOSALS)  # (b, 32) into the 528 windows
            pidx = pidx.gather(1, attend_idx)
        else:
            attend_idx = torch.arange(props.shape[1], device=props.device).expand(len(part), -1)
        chosen = props.gather(1, attend_idx[..., None].expand(-1, -1, props.shape[-1]))
        z, _ = model.attend(enc, attend_idx)  # (b, P, H)
        n_frames = _frame_count(enc.frame_mask)
        out["units"].append(enc.clip_units.float().cpu().numpy())
        out["pnorm"].append(torch.linalg.vector_norm(chosen.double(), dim=-1).float().cpu().numpy())
        out["pidx"].append(pidx.cpu().numpy().astype(np.int16))
        out["zhat"].append(F.normalize(z.float(), dim=-1).cpu().numpy())
        frames = enc.frames.float().cpu().numpy()
        out["frames"].extend(frames[i, :n] for i, n in enumerate(n_frames))
        out["n_frames"].append(n_frames)
    return out
