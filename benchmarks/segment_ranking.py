"""Ranking experiments for the training-free default: does scoring with the video's segments help R@1?

    python -m benchmarks.segment_ranking [--real DIR]    # DIR: benchmarks/real_set.py's output (optional)

On the demo gallery (and the real-video set when built), every query is scored against every video by the
bridge model (``prvr.models.bridge``) in several ways; first-relevant-video R@1/5/10 and SumR
(``prvr.evaluate.annotated``) are printed as JSON per set and variant. Segments:
``prvr.temporal.segments.segment_video`` of the extracted rows.

- ``two_branch``: today's score (MS-SL's 528 windows + key-clip attention), ``clip`` its clip branch alone;
- ``row_max``: the best single row's cosine;
- ``segment_max``: a segment-level clip branch: the best cosine of any segment of the hierarchy (the
  normalised mean of its rows);
- ``segment_two_branch``: 0.7 ``segment_max`` + 0.3 frame branch attending from the best segment (the
  bridge's temperature), i.e. MS-SL's two branches with the segments as proposals;
- ``propagated_max``: TF-PRVR's propagation (``prvr.temporal.propagation``, beta 0.7), best row;
- ``clip_plus_segment``: 0.7 ``clip`` + 0.3 ``segment_max``;
- ``model_propagated_{beta}``: the model's own propagation (``BridgeConfig.propagation``,
  ``prvr.temporal.propagation``): every row replaced by its propagated segment feature before MS-SL's binning,
  both branches (``model_propagated_clip`` / ``_frame``: each branch alone at beta 0.7).

``two_branch``, ``clip`` and the hand-made variants use the bridge with ``propagation=False`` (rows as
mapped).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

import prvr  # noqa: F401  - applies the compatibility fix first
from prvr.demo import gallery as demo
from prvr.evaluate import demo as demo_set
from prvr.evaluate.annotated import (
    AnnotatedSet,
    extract_features,
    first_relevant_ranks,
    load_moments_file,
    recall_metrics,
)
from prvr.models.branches import key_clip_attention
from prvr.temporal.propagation import propagate
from prvr.temporal.segments import segment_video

BETA = 0.7  # TF-PRVR's propagation strength


def unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero)."""
    return x / np.linalg.norm(x, axis=-1, keepdims=True).clip(1e-9)


def variants(model, aset: AnnotatedSet) -> dict[str, np.ndarray]:
    """Variant name -> (Nq, Nv) scores."""
    from extract.features import FeatureFile

    with FeatureFile(extract_features(aset)) as ff:
        rows = [ff.video(v) for v, _ in aset.videos]
        tokens = [ff.caption(q.id)[1] for q in aset.queries]
    queries = model.encode_queries(tokens)
    scores = model.score(queries, model.encode_videos([r.features for r in rows]))
    q = queries.numpy()
    out = {"two_branch": scores.total.numpy(), "clip": scores.clip.numpy()}
    for beta in (0.5, 0.7, 0.9):  # the model's own propagation (BridgeConfig.propagation), both branches
        cfg = replace(model.cfg, propagation=True, propagation_beta=beta)
        on = type(model)(model.head, model.class_text, cfg, model.profile)
        both = on.score(queries, on.encode_videos([r.features for r in rows]))
        out[f"model_propagated_{beta}"] = both.total.numpy()
        if beta == BETA:
            out["model_propagated_clip"] = both.clip.numpy()
            out["model_propagated_frame"] = both.frame.numpy()
    names = ("row_max", "segment_max", "segment_two_branch", "propagated_max")
    out.update({name: np.zeros_like(out["clip"]) for name in names})
    for j, r in enumerate(rows):
        x = model.to_text_space(r.features).numpy()
        seg = segment_video(r.features)
        spans = np.unique(seg[:, 1:], axis=0)
        feats = unit(np.stack([x[a:b].mean(0) for a, b in spans]))
        sim = q @ feats.T
        frames = torch.from_numpy(x)[None]
        key = torch.from_numpy(feats[sim.argmax(axis=1)])[None]
        z, _ = key_clip_attention(frames, frames, torch.ones(1, len(x)), key, model.cfg.temperature)
        out["row_max"][:, j] = (q @ x.T).max(axis=1)
        out["segment_max"][:, j] = sim.max(axis=1)
        out["segment_two_branch"][:, j] = 0.7 * sim.max(axis=1) + 0.3 * (unit(z[0].numpy()) * q).sum(axis=1)
        out["propagated_max"][:, j] = (q @ propagate(x, seg, BETA).T).max(axis=1)
    out["clip_plus_segment"] = 0.7 * out["clip"] + 0.3 * out["segment_max"]
    return out


def main() -> None:
    """Print R@k per set and variant as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", type=Path, default=None, help="the real set's dir (with moments.json)")
    args = parser.parse_args()
    from prvr.models.bridge import BridgeConfig
    from prvr.models.factory import create_model

    model = create_model("lite", cfg=BridgeConfig(propagation=False)).model  # the baseline: rows as mapped
    sets = {"demo": demo_set.annotated_set(demo.build_demo_gallery())}
    if args.real is not None:
        sets["real"] = load_moments_file(args.real, args.real / "moments.json")
    report = {}
    for name, aset in sets.items():
        relevant = np.array([[vid in q.moments for vid, _ in aset.videos] for q in aset.queries])
        ranks = {label: first_relevant_ranks(s, relevant)[0] for label, s in variants(model, aset).items()}
        report[name] = {label: {k: round(v, 1) for k, v in recall_metrics(r).items()}
                        for label, r in ranks.items()}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
