"""Videos going into an index: the input record, its validation, and its encoding by the model.

``encode_for_index`` runs the model protocol (docs/design.md, Contract 3) once per video and keeps what
exact search needs: the clip units, the norm and window index of every stored proposal, the normalised
key-clip-guided frame feature z of every stored proposal (query-independent, see ``prvr.index.kernels``),
factored (``frame_factors``: an attended feature mixes the video's L frames, so the P of them span at most L
dimensions, and P x H floats become (P + H) x r), and the encoded frames (for the attention shown with a
result). For the results layer it also keeps, per video,
the model's fine rows (``model.encode_rows``: unit vectors in the query space, float16, with their seconds),
the video's query-independent segments (``prvr.temporal.segments.segment_video`` of the extracted rows, moved
onto the fine rows) and, when given ``ReferenceQueries`` (the encoded reference captions of
``prvr.results.confidence``; the index never sees text), the clip- and frame-scale scores (float16, rounded
up) of every reference caption on the video: a video's confidence cuts for any branch weights are computed
from them at search time; and with them the reference bank's statistics of every fine row and context row
(``prvr.temporal.hubness.bank_stats``: mean and std of the row's cosine with the reference captions' vectors),
which localisation normalises its similarities by.

With ``text_encoder``, each video's words (``GalleryVideo.words``: timed segments of subtitles, speech, text
on screen) are stored too (``prvr.index.words.encode_words``: embedded as queries are, with their times,
source, score and text); a video without words stores none (``words.no_words``).

Layout: ``FIXED`` arrays have one row per video; each ``RAGGED`` array is a list of per-video
arrays whose lengths the index stores under the named count.
"""

from __future__ import annotations

import math
from collections.abc import Container, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from extract.words.segment import WordSegment
from prvr.index.schema import FINE, FIXED, RAGGED, RECORD, WORDS
from prvr.index.words import TextEncoder, encode_words, no_words
from prvr.models.clustering import length_aware_kmedoids
from prvr.temporal.hubness import bank_stats
from prvr.temporal.propagation import BETA, propagate_finest
from prvr.temporal.segments import resample, segment_video

COMPACT_PROPOSALS = 32  # MS-SL++ medoids per video in compact mode
FACTOR_TOL = 2e-6  # the largest distance of a stored frame-scale feature from its unit original (factors)
# the propagation strength of the stored moments context: recorded with every gallery (``model_identity``),
# so a gallery built with another one is refused rather than read with the wrong context
CONTEXT_BETA = BETA


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
    words: tuple[WordSegment, ...] = field(default=())  # timed text it says or shows (needs a text encoder)

    @classmethod
    def from_features(cls, video_id: str, vf, title: str = "", path: str = "",
                      words: Sequence[WordSegment] = ()) -> GalleryVideo:
        """From an ``extract.features.VideoFeatures`` (and the video's words, if any)."""
        return cls(video_id, vf.features, vf.start, vf.end, float(vf.duration), title or vf.source,
                   path, vf.sha256, tuple(words))

    def record(self) -> dict:
        """The record a gallery stores and returns (``schema.RECORD``)."""
        record = {"id": self.id, "title": self.title, "path": self.path, "duration": float(self.duration),
                  "sha256": self.sha256}
        return {k: record[k] for k in RECORD}


def check_ids(ids: Sequence[object], existing: Container[str]) -> None:
    """GalleryError unless every id is a non-empty string, new to the gallery and to this batch."""
    seen: set[str] = set()
    for i in ids:
        if not isinstance(i, str) or not i.strip():
            raise GalleryError(f"video id {i!r}: ids must be non-empty strings")
        if i in existing or i in seen:
            where = "in the index" if i in existing else "in this batch"
            raise GalleryError(f"video id {i!r} is already {where}")
        seen.add(i)


def check_videos(videos: Sequence[GalleryVideo], existing: Container[str]) -> None:
    """Raise GalleryError naming the video and the problem; checks everything before anything is written."""
    check_ids([v.id for v in videos], existing)
    for v in videos:
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
        check_words(v)


def check_words(video: GalleryVideo) -> None:
    """GalleryError unless the video's words are ``WordSegment``s, each with some text."""
    check_segments(video.id, video.words)


def check_segments(video_id: str, words: object) -> None:
    """GalleryError unless ``words`` (video ``video_id``'s) are ``WordSegment``s, each with some text."""
    if not isinstance(words, Sequence) or isinstance(words, str | bytes):
        raise GalleryError(f"video {video_id!r}: words must be a sequence of WordSegment, got "
                           f"{type(words).__name__}")
    for i, segment in enumerate(words):
        if not isinstance(segment, WordSegment):
            raise GalleryError(f"video {video_id!r}: words[{i}] is a {type(segment).__name__}, not a "
                               "WordSegment")
        if not segment.text.strip():
            raise GalleryError(f"video {video_id!r}: words[{i}] at {segment.start:g} s has no text")


@dataclass(frozen=True)
class ReferenceQueries:
    """A fixed bank of queries, encoded by the model, whose scores every indexed video stores (confidence).

    ``queries``: what ``model.encode_queries`` returns for them (an (R, H) tensor, or ``EncodedQueries``);
    ``id``: identifies the bank (recorded by the index: an index built with another bank is refused)."""

    queries: object
    id: str

    def __len__(self) -> int:
        return len(getattr(self.queries, "vectors", self.queries))


def _frame_count(mask: torch.Tensor) -> np.ndarray:
    """(Nv, L) float mask -> (Nv,) valid frame counts."""
    return mask.sum(1).round().long().cpu().numpy()


def half_up(x: np.ndarray) -> np.ndarray:
    """float16 rounded up (never below x): a reference score's cut is never lower than its exact value."""
    h = x.astype(np.float16)
    return np.where(h.astype(np.float64) < x, np.nextafter(h, np.float16(np.inf)), h)


def bank_vectors(references: ReferenceQueries | None) -> np.ndarray | None:
    """The reference queries' (R, H) float32 vectors (what ``model.encode_queries`` gave), None for none."""
    if references is None:
        return None
    v = getattr(references.queries, "vectors", references.queries)
    return v.detach().float().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v, np.float32)


def fine_rows(model, video: GalleryVideo, bank: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """One video's rows at the model's finest resolution (float16) with seconds, its segments,
    the moments' query-independent context (the stored rows propagated over the segments:
    ``propagate_finest`` at ``CONTEXT_BETA``, the moments' default, which the results layer uses) and, given
    the reference bank's (R, H) vectors, both's ``bank_stats`` ((0, 2) each without a bank)."""
    vectors, start, end = model.encode_rows(video.features, video.start, video.end)
    segments = resample(segment_video(np.asarray(video.features)), np.asarray(video.start), start)
    return localisation_arrays(vectors, start, end, segments, bank)


def localisation_arrays(vectors: np.ndarray, start: np.ndarray, end: np.ndarray, segments: np.ndarray,
                        bank: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """What an index stores for localisation from a video's (n, H) unit fine rows, their seconds and
    segments: the rows as float16, their propagated context, both's bank statistics, seconds, segments."""
    fine = np.asarray(vectors).astype(np.float16)
    stored = fine.astype(np.float32)  # what the results layer reads back
    context = propagate_finest(stored, segments, CONTEXT_BETA).astype(np.float32)
    none = np.zeros((0, 2), np.float32)
    return {"fine": fine, "context": context,
            "fine_bank": none if bank is None else bank_stats(stored, bank),
            "context_bank": none if bank is None else bank_stats(context, bank),
            "fine_start": np.asarray(start, np.float32),
            "fine_end": np.asarray(end, np.float32), "segments": np.asarray(segments, np.int32)}


def frame_factors(zhat: np.ndarray | torch.Tensor,
                  alpha: np.ndarray | torch.Tensor | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One video's unit frame-scale features (P, H) -> (zbasis (r, H), zcoef (P r,)) float32, zbasis's rows
    orthonormal, zcoef the (P, r) coefficients row by row, every ``zcoef.reshape(P, r)[j] @ zbasis`` within
    ``FACTOR_TOL`` of ``zhat[j]``.

    ``alpha`` (P, L): the attention weights the features were made with (``model.attend``); each feature is
    a mix of L value rows, so ``alpha.T @ zhat`` spans the same space in L rows and its SVD finds the basis
    cheaply. Without it, or if that basis misses (a model whose features are not such mixes), the SVD of
    ``zhat`` itself does. The rank keeps singular values above 1e-10 of the largest (a frame that only a
    few proposals attend to, faintly, still moves them by more than the tolerance); the check is what makes
    the stored features the ones bounds and scores use (``docs/design.md``). In torch (float64): numpy's
    BLAS threads, woken right after the model's torch ops, would wait ~20 ms for the cores."""
    def tensor(x: np.ndarray | torch.Tensor) -> torch.Tensor:  # (a copy of numpy rows: they may be mapped)
        return x.double() if isinstance(x, torch.Tensor) else torch.tensor(np.asarray(x), dtype=torch.float64)

    z = tensor(zhat)
    sketches = [z] if alpha is None else [tensor(alpha).T @ z, z]
    for sketch in sketches:
        _, s, vt = torch.linalg.svd(sketch, full_matrices=False)
        rank = max(1, int((s > s[0] * 1e-10).sum())) if s[0] > 0 else 1
        basis = vt[:rank].float()
        coef = (z @ basis.double().T).float()  # (P, r)
        error = torch.linalg.vector_norm(coef.double() @ basis.double() - z, dim=1).max()
        if float(error) <= FACTOR_TOL:
            return basis.numpy(), np.ascontiguousarray(coef.numpy()).reshape(-1)
    raise GalleryError(f"frame-scale features of rank {rank} cannot be stored within {FACTOR_TOL}")


def unfactor(zbasis: np.ndarray, zcoef: np.ndarray) -> np.ndarray:
    """The (P, H) frame-scale features of one video's stored factors (float64: what bounds are made from)."""
    basis = np.asarray(zbasis, np.float64)
    return np.asarray(zcoef, np.float64).reshape(-1, len(basis)) @ basis


def encode_for_index(model, videos: Sequence[GalleryVideo], mode: str, batch: int,
                     references: ReferenceQueries | None = None, text_encoder: TextEncoder | None = None
                     ) -> tuple[dict[str, np.ndarray], dict[str, list[np.ndarray]]]:
    """Run the model over raw rows: the ``FIXED`` arrays (one row per video) and the ``RAGGED`` ones (a
    list of one array per video); without references the reference scores are (V, 0). The videos' words
    are embedded with ``text_encoder`` (needed when any video has words)."""
    fixed: dict[str, list] = {k: [] for k in FIXED}
    ragged: dict[str, list] = {k: [] for k in RAGGED}
    bank = bank_vectors(references)
    for a in range(0, len(videos), batch):
        part = videos[a:a + batch]
        try:
            enc = model.encode_videos([np.asarray(v.features, dtype=np.float32) for v in part])
            fine = [fine_rows(model, v, bank) for v in part]
        except ValueError as e:
            raise GalleryError(f"videos {[v.id for v in part]}: {e}") from None
        props, pidx = enc.proposals, enc.proposal_index
        if mode == "compact" and props.shape[1] != COMPACT_PROPOSALS:
            attend_idx = length_aware_kmedoids(props, COMPACT_PROPOSALS)  # (b, 32) into the 528 windows
            pidx = pidx.gather(1, attend_idx)
        else:
            attend_idx = torch.arange(props.shape[1], device=props.device).expand(len(part), -1)
        chosen = props.gather(1, attend_idx[..., None].expand(-1, -1, props.shape[-1]))
        z, alpha = model.attend(enc, attend_idx)  # (b, P, H), (b, P, L)
        fixed["units"].append(enc.clip_units.float().cpu().numpy())
        fixed["pnorm"].append(torch.linalg.vector_norm(chosen.double(), dim=-1).float().cpu().numpy())
        fixed["pidx"].append(pidx.cpu().numpy().astype(np.int16))
        zhat, alpha = F.normalize(z.float(), dim=-1).cpu(), alpha.float().cpu()
        for zb, zc in (frame_factors(zv, av) for zv, av in zip(zhat, alpha, strict=True)):
            ragged["zbasis"].append(zb)
            ragged["zcoef"].append(zc)
        if references is not None:
            with torch.no_grad():
                scores = model.score(references.queries, enc)  # (R, b): the model's own scores
            fixed["ref_clip"].append(half_up(scores.clip.T.double().cpu().numpy()))
            fixed["ref_frame"].append(half_up(scores.frame.T.double().cpu().numpy()))
        else:
            fixed["ref_clip"].append(np.zeros((len(part), 0), np.float16))
            fixed["ref_frame"].append(np.zeros((len(part), 0), np.float16))
        frames = enc.frames.float().cpu().numpy()
        ragged["frames"].extend(frames[i, :n] for i, n in enumerate(_frame_count(enc.frame_mask)))
        ragged["row_start"].extend(np.asarray(v.start, np.float32) for v in part)
        ragged["row_end"].extend(np.asarray(v.end, np.float32) for v in part)
        for key in FINE:
            ragged[key].extend(f[key] for f in fine)
        width = int(enc.clip_units.shape[-1])
        for v in part:
            words = (encode_words(model, v.words, text_encoder, width, bank) if v.words
                     else no_words(width))
            for key in WORDS:
                ragged[key].append(words[key])
    return {k: np.concatenate(v) for k, v in fixed.items()}, ragged


def segment_arrays(fixed: dict[str, np.ndarray],
                   ragged: dict[str, list[np.ndarray]]) -> dict[str, np.ndarray]:
    """The stored arrays of one segment's videos: the fixed ones as given, each ragged one concatenated,
    with its per-video count (int64)."""
    out = dict(fixed)
    for key, count in RAGGED.items():
        out[key] = np.concatenate(ragged[key])
        out[count] = np.array([len(x) for x in ragged[key]], dtype=np.int64)
    return out


def check_encoded(fixed: dict[str, np.ndarray], ragged: dict[str, list[np.ndarray]], n: int) -> None:
    """GalleryError unless every FIXED array has n rows and every RAGGED array n entries; the words arrays
    of a producer that has none (``schema.WORDS``: benchmarks, an upgrade) are added here, empty."""
    if "units" in fixed and not any(k in ragged for k in WORDS):
        empty = no_words(int(np.shape(fixed["units"])[-1]))
        ragged.update({k: [empty[k]] * n for k in WORDS})
    missing = [k for k in FIXED if k not in fixed] + [k for k in RAGGED if k not in ragged]
    if missing:
        raise GalleryError(f"encoded videos lack the arrays {missing}")
    bad = [k for k in FIXED if len(fixed[k]) != n] + [k for k in RAGGED if len(ragged[k]) != n]
    if bad:
        raise GalleryError(f"encoded videos: {n} records but arrays {bad} have another length")
