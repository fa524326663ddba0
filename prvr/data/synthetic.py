"""A learnable synthetic PRVR benchmark with planted moments, written in the official MS-SL layout.

The world has *events* and *objects*, each with a visual prototype (Dv) and a text prototype (Dq). A video
is a sequence of noisy rows (optionally over a per-video scene vector) holding ``captions_per_video``
non-overlapping moments plus ``distractors_per_video`` uncaptioned ones. In a moment the event is a weak
signal on every row of a short span (``moment_frac``) and the object *flickers*: its prototype with
alternating sign on ``object_rows`` consecutive rows. A caption is noisy copies of its event's and object's
text prototypes among function-word tokens, in random order.

Why both MS-SL branches matter: averaging rows into clip units cancels the flicker, so the clip branch sees
the event and single frames keep the object for the frame branch (exactly only with even bins over an even
start, ``object_even_start``). ``SyntheticConfig.branches()`` is the set on which the total beats each branch
alone (``python -m benchmarks.synthetic_branches``); its weak constant part (``object_mean``) lets the shared
query encoder learn the object at all (history: benchmarks/RESULTS.md, "Issue #42: history moved from module
docstrings"). Float32, vectorised; the same seed gives byte-identical files.
``python -m prvr.data.synthetic ROOT [--tvr] [--field=value ...]`` writes one.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import h5py
import numpy as np

from prvr.data.official import SPLITS, BigFileWriter
from prvr.plural import counted

log = logging.getLogger(__name__)


@dataclass
class SyntheticConfig:
    n_videos: tuple[int, int, int] = (240, 60, 200)  # train, val, test
    captions_per_video: int = 2  # = captioned moments per video
    distractors_per_video: int = 0  # uncaptioned moments with random event/object pairs
    visual_dim: int = 32
    query_dim: int = 24
    min_frames: int = 32  # rows per video, uniform in [min_frames, max_frames]
    max_frames: int = 64
    n_events: int = 10
    n_objects: int = 10
    moment_frac: float = 0.12  # event span, as a fraction of the video
    event_strength: float = 0.8  # prototype amplitude per row (noise rows have unit norm on average)
    object_strength: float = 1.5
    object_rows: int = 4  # the object flickers (alternating sign) over this many rows; even = cancels out
    object_style: str = "flicker"  # or "steady": constant sign (an ablation: the clip units keep it all)
    object_mean: float = 0.0  # a constant-sign part added on the same rows (bins keep it)
    object_even_start: bool = False  # flicker starts on an even row: bins of an even row count cancel it
    scene_strength: float = 0.0  # a per-video vector on every row (a nuisance; > 0 invites memorising)
    token_noise: float = 0.3  # relative to a unit text prototype
    event_tokens: tuple[int, int] = (2, 3)  # min, max tokens copying the event's text prototype
    object_tokens: tuple[int, int] = (1, 1)  # min, max tokens copying the object's text prototype
    function_tokens: tuple[int, int] = (4, 10)
    n_function_words: int = 30
    seed: int = 0
    collection: str = "synthetic"
    feature: str = "synthetic_feat"

    @classmethod
    def branches(cls, **overrides) -> SyntheticConfig:
        """The set on which both MS-SL branches help (``benchmarks/synthetic_branches.py``).

        Videos of exactly 64 rows (4 per clip unit at map_size 16, as 128 rows at the official 32; 2 at
        32), two moments each of 30 % of the video. The event (4 kinds) is a steady signal over the
        moment: clip proposals match it exactly, the frame branch's attention must first find it. The
        object (16 kinds) flickers (+-2.0) on 16 rows starting on an even row, so a bin of an even number
        of rows keeps only its weak constant part (0.4): single frames see it far better. A caption names
        both, each with 2-3 tokens; the event alone is ambiguous (about 44 % of the videos hold it).
        """
        return cls(**{**dict(min_frames=64, max_frames=64, moment_frac=0.3, n_events=4, n_objects=16,
                             object_rows=16, object_strength=2.0, object_mean=0.4, object_even_start=True,
                             object_tokens=(2, 3)), **overrides})

    @classmethod
    def tvr_shaped(cls, **overrides) -> SyntheticConfig:
        """TVR's shape: 2,000 videos x 5 captions, 3072-d visual, 768-d query, up to 128 rows."""
        return cls(**{**dict(n_videos=(2000, 250, 250), captions_per_video=5, distractors_per_video=1,
                             visual_dim=3072, query_dim=768, min_frames=32, max_frames=128, n_events=40,
                             n_objects=40), **overrides})


def _unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    """n random unit vectors, float32."""
    x = rng.standard_normal((n, dim), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + l) for every (s, l), vectorised."""
    first = np.repeat(starts - np.cumsum(lengths) + lengths, lengths)
    return first + np.arange(lengths.sum())


class World:
    """The concepts: visual and text prototypes of events, objects and function words."""

    def __init__(self, cfg: SyntheticConfig, rng: np.random.Generator):
        self.event_v, self.object_v = _unit(rng, cfg.n_events, cfg.visual_dim), _unit(rng, cfg.n_objects,
                                                                                     cfg.visual_dim)
        self.event_t, self.object_t = _unit(rng, cfg.n_events, cfg.query_dim), _unit(rng, cfg.n_objects,
                                                                                    cfg.query_dim)
        self.function_t = _unit(rng, cfg.n_function_words, cfg.query_dim)


def _videos(cfg: SyntheticConfig, world: World, rng: np.random.Generator, n: int):
    """Rows of ``n`` videos with planted moments -> (rows (R, Dv), lengths (n,), events, objects (n, m))."""
    m = cfg.captions_per_video + cfg.distractors_per_video
    lengths = rng.integers(cfg.min_frames, cfg.max_frames + 1, n)
    offsets = np.cumsum(lengths) - lengths
    # uniform noise (cheaper to draw than gaussian; the shape of the noise does not matter here), in place,
    # scaled so that a noise row has unit norm on average
    rows = rng.random((lengths.sum(), cfg.visual_dim), dtype=np.float32)
    rows -= np.float32(0.5)
    rows *= np.float32(np.sqrt(12 / cfg.visual_dim))
    scenes = cfg.scene_strength * _unit(rng, n, cfg.visual_dim)
    for i in range(n):  # a slice add per video avoids an (R, Dv) temporary
        rows[offsets[i]: offsets[i] + lengths[i]] += scenes[i]
    events = rng.integers(0, cfg.n_events, (n, m))
    objects = rng.integers(0, cfg.n_objects, (n, m))
    # moment j of a video lies inside segment j of m equal segments, so moments never overlap
    seg = lengths[:, None] / m  # (n, 1)
    span = np.clip(np.round(cfg.moment_frac * lengths), 1, np.floor(seg[:, 0])).astype(int)[:, None]
    start = np.floor(np.arange(m) * seg + rng.random((n, m)) * (seg - span + 1)).astype(int)
    start = np.minimum(start, np.floor((np.arange(m) + 1) * seg).astype(int) - span)
    start += offsets[:, None]
    moment_rows = _ranges(start.ravel(), np.broadcast_to(span, (n, m)).ravel())
    rows[moment_rows] += cfg.event_strength * np.repeat(world.event_v[events.ravel()], span.repeat(m), axis=0)
    # the object flickers: +w, -w, +w, -w over object_rows consecutive rows inside the moment; averaging
    # rows into clip units cancels it, single frames keep it
    k = np.minimum(cfg.object_rows, span)  # (n, 1)
    first = start + np.floor(rng.random((n, m)) * (span - k + 1)).astype(int)
    if cfg.object_even_start:  # move to an even row inside the span when it fits, else round down
        odd = (first - offsets[:, None]) % 2
        first += np.where(odd & (first + 1 + k <= start + span), 1, -odd)
    flicker = _ranges(first.ravel(), np.broadcast_to(k, (n, m)).ravel())
    sign = np.where((flicker - np.repeat(first.ravel(), k.repeat(m))) % 2 == 0, 1.0, -1.0).astype(np.float32)
    sign = sign if cfg.object_style == "flicker" else np.abs(sign)
    rows[flicker] += (cfg.object_strength * sign + cfg.object_mean)[:, None] * np.repeat(
        world.object_v[objects.ravel()], k.repeat(m), axis=0)
    return rows, lengths, events, objects


def _captions(cfg: SyntheticConfig, world: World, rng: np.random.Generator, events: np.ndarray,
              objects: np.ndarray) -> list[np.ndarray]:
    """Token features of one caption per (event, object): noisy prototype copies among function words."""
    n = len(events)
    n_event = rng.integers(cfg.event_tokens[0], cfg.event_tokens[1] + 1, n)
    low, high = cfg.object_tokens  # a fixed count draws nothing: the default sets keep their bytes
    n_object = np.full(n, low) if low == high else rng.integers(low, high + 1, n)
    n_func = rng.integers(cfg.function_tokens[0], cfg.function_tokens[1] + 1, n)
    lengths = n_event + n_object + n_func
    cap = np.repeat(np.arange(n), lengths)  # caption of every token
    pos = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    # token kinds: 0 event, 1 object, 2 function word
    kind = np.where(pos < n_event[cap], 0, np.where(pos < (n_event + n_object)[cap], 1, 2))
    protos = np.empty((len(cap), cfg.query_dim), dtype=np.float32)
    protos[kind == 0] = world.event_t[events[cap[kind == 0]]]
    protos[kind == 1] = world.object_t[objects[cap[kind == 1]]]
    protos[kind == 2] = world.function_t[rng.integers(0, cfg.n_function_words, (kind == 2).sum())]
    protos += rng.standard_normal(protos.shape, dtype=np.float32) * np.float32(
        cfg.token_noise / np.sqrt(cfg.query_dim))
    order = np.lexsort((rng.random(len(cap)), cap))  # shuffle tokens within each caption
    return np.split(protos[order], np.cumsum(lengths)[:-1])


def generate(cfg: SyntheticConfig, root: str | Path) -> Path:
    """Write the benchmark under ``root/cfg.collection`` in the official layout; returns that folder."""
    if cfg.object_style not in ("flicker", "steady"):
        raise ValueError(f"object_style {cfg.object_style!r}: expected flicker or steady")
    if cfg.min_frames < cfg.captions_per_video + cfg.distractors_per_video:
        raise ValueError(f"min_frames={cfg.min_frames} cannot hold "
                         f"{cfg.captions_per_video + cfg.distractors_per_video} moments")
    rng = np.random.default_rng(cfg.seed)
    world = World(cfg, rng)
    base = Path(root) / cfg.collection
    (base / "TextData").mkdir(parents=True, exist_ok=True)
    feature_dir = base / "FeatureData" / cfg.feature
    query_file = base / "TextData" / f"roberta_{cfg.collection}_query_feat.hdf5"
    video2frames, n_cap = {}, cfg.captions_per_video
    with h5py.File(query_file, "w", libver="latest") as h5, BigFileWriter(feature_dir, cfg.visual_dim) as big:
        for split, n in zip(SPLITS, cfg.n_videos, strict=True):
            rows, lengths, events, objects = _videos(cfg, world, rng, n)
            tokens = _captions(cfg, world, rng, events[:, :n_cap].ravel(), objects[:, :n_cap].ravel())
            lines, row_ids = [], []
            for i in range(n):
                vid = f"{split}{i:05d}"
                video2frames[vid] = [f"{vid}_{k}" for k in range(lengths[i])]
                row_ids += video2frames[vid]
                for j in range(n_cap):
                    h5[f"{vid}#enc#{j}"] = tokens[i * n_cap + j]
                    lines.append(f"{vid}#enc#{j} someone {events[i, j]} does something with {objects[i, j]}")
            big.add(row_ids, rows)
            (base / "TextData" / f"{cfg.collection}{split}.caption.txt").write_text("\n".join(lines) + "\n")
        big.write_video2frames(video2frames)
    log.info("wrote synthetic set %s: %s, %s", base, counted(cfg.n_videos, "video"),
             counted(len(big.ids), "row"))
    return base


def main(argv: list[str] | None = None) -> None:
    """CLI: ``python -m prvr.data.synthetic OUT_ROOT [--tvr] [--field=value ...]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="write ROOT/<collection>/... in the official layout")
    preset = parser.add_mutually_exclusive_group()
    preset.add_argument("--tvr", action="store_true", help="TVR-shaped sizes (2,000 videos, 3072/768-d)")
    preset.add_argument("--branches", action="store_true", help="the set on which both branches help")
    for f in fields(SyntheticConfig):
        if f.type in ("int", "float", "str"):
            parser.add_argument(f"--{f.name}", type={"int": int, "float": float, "str": str}[f.type])
    args = parser.parse_args(argv)
    overrides = {f.name: getattr(args, f.name) for f in fields(SyntheticConfig) if getattr(args, f.name, None)
                 is not None}
    make = SyntheticConfig.tvr_shaped if args.tvr else SyntheticConfig.branches if args.branches else \
        SyntheticConfig
    cfg = make(**overrides)
    base = generate(cfg, args.root)
    print(f"{base}  (--data {args.root} --collection {cfg.collection} --feature {cfg.feature})")
    log.debug("config %s", asdict(cfg))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
