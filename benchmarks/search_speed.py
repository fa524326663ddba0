"""Search latency of VideoIndex vs the straightforward (model.score-style) way; prints JSON.

    python -m benchmarks.search_speed [--sizes 2179 10000 100000] [--queries 50] [--threads 2] [--keep DIR]

Synthetic galleries are generated at the stored-array level (no feature extraction, no encoders): an
MS-SL model of hidden size 384 whose key-clip attention projections are the identity supplies the
geometry, fingerprint and ``attend``, and whose query side passes its tokens' mean through every op of
MS-SL's query encoder (``identity_attention_model``). Clip units and frames are drawn from a scene model
that mimics encoded videos: a bank of concept vectors with a power-law spectrum (real embeddings
concentrate their energy in few directions), a shared offset (embeddings are anisotropic), videos made of
2-6 scenes of one concept each plus per-unit noise. A query describes one scene of one video: 8-20 token
features around that scene's vector plus noise (``make_queries``).

Per size and mode it reports p50/p95 latency of ``VideoIndex.rank`` (the encoded query vector in, exact
top-10 Evidence out), of the whole ``prvr.results.search.search`` for the same queries (token features in,
Contract 4 result dicts out, k=10: what users wait for) and for queries that describe nothing in the gallery
(``search_unmatched``: random tokens; every video scores low, so the bounds rule out fewer), how many
videos were scored exactly, the bytes per video that every query reads (the 8-bit sketch) and that are
stored, and for N <= 10,000 the same queries scored the straightforward way (``MSSL.score`` over all 528
proposals and key-clip attention over the frames of every video, as the official evaluation does), whose
top-10 must match. Approximate mode reports recall@10 against exact mode. Each run also reports how fast the
machine was while it ran (``machine``: a numpy read in GB/s, a query-sized matrix product in
microseconds): a shared VM's speed drifts by up to 2x within minutes, and latencies are only comparable at
similar speeds.

Every synthetic video also stores what result building reads, in the real layout (``prvr.index.encoding``):
its fine rows (the unit-normalised frames, float16, 2 s each), their segments (``prvr.temporal.segments`` on
those frames), their statistics against a stand-in reference bank of ``REFERENCES`` random vectors, and the
bank's scores (random numbers of the real shape and dtype: the benchmark times reading and using them, not
their values).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

import prvr  # noqa: F401  - applies the torchvision CPU fix before anything else
from prvr.index import (
    RAGGED,
    WORDS,
    IndexConfig,
    IndexStoreError,
    ReferenceQueries,
    VideoIndex,
    bank_vectors,
    frame_factors,
    half_up,
    localisation_arrays,
)
from prvr.models.branches import EncodedVideos, window_proposals
from prvr.models.mssl import MSSL, MSSLConfig
from prvr.models.preprocess import window_table
from prvr.results.search import encode_query, search
from prvr.temporal.segments import segment_video

H, M, L = 384, 32, 32  # hidden size, clip units, frames per video
TABLE = window_table(M)  # (528, 2) [start, end) units of every window
ROWS = 64  # raw rows (seconds) per synthetic video; the L frames re-bin them in pairs
REFERENCES = 261  # reference captions whose scores every video stores (assets/reference_captions.txt)
GENERATORS = 2  # processes drawing synthetic videos ahead of the index that adds them (one thread each)


class SceneModel:
    """Random concepts and a shared offset: the geometry of the synthetic galleries and queries."""

    def __init__(self, seed: int = 0, n_concepts: int = 2000, decay: float = 1.0, offset: float = 0.5):
        g = torch.Generator().manual_seed(seed)
        spectrum = torch.arange(1, H + 1, dtype=torch.float32) ** (-decay / 2)  # std per principal direction
        basis = torch.linalg.qr(torch.randn(H, H, generator=g))[0]
        concepts = torch.randn(n_concepts, H, generator=g) * spectrum @ basis.T
        self.concepts = torch.nn.functional.normalize(concepts, dim=-1)
        self.offset = offset * torch.nn.functional.normalize(torch.randn(H, generator=g), dim=0)
        self.spectrum, self.basis = spectrum / spectrum.norm(), basis

    def noise(self, shape: tuple[int, ...], g: torch.Generator, scale: float) -> torch.Tensor:
        """Noise with the same spectrum as the concepts, of expected norm ``scale``."""
        return scale * (torch.randn(*shape, H, generator=g) * self.spectrum) @ self.basis.T


def identity_attention_model() -> MSSL:
    """An MS-SL of hidden size 384 whose key-clip attention projections are the identity (z depends on data)
    and whose query side passes the mean of its token features through: an identity input projection
    (its bias keeps the ReLU open; the LayerNorms then remove it), no position embedding, a self-attention
    block whose output is zero and uniform pooling. The token features of a query describing a scene
    then encode to (nearly) that scene's vector, through every op of MS-SL's query encoder."""
    torch.manual_seed(0)  # a fixed model: a kept index (--keep) opens again in the next run
    model = MSSL(MSSLConfig(visual_dim=8, query_dim=H)).eval()
    with torch.no_grad():
        for lin in model.mapping_linear:
            lin.weight.copy_(torch.eye(H) * 4.0)  # keys scaled: attention concentrates on a scene
        proj = model.query_input_proj.net[1]
        proj.weight.copy_(torch.eye(H))
        proj.bias.fill_(100.0)  # LayerNorm-ed tokens stay far above the ReLU's zero
        model.query_pos_embed.position_embeddings.weight.zero_()
        model.query_encoder.output["dense"].weight.zero_()
        model.query_encoder.output["dense"].bias.zero_()
        model.modular_vector_mapping.weight.zero_()
    return model


def _scene_index(cuts: torch.Tensor, length: int) -> torch.Tensor:
    """(n, C) sorted cut points in [0, 1] -> (n, length) scene of each position."""
    pos = (torch.arange(length) + 0.5) / length
    return (pos[None, :, None] > cuts[:, None, :]).sum(-1)


def synthetic_batch(sm: SceneModel, n: int, g: torch.Generator
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(n, M, H) units, (n, L, H) frames and (n, 6) scene concepts of n videos with 2-6 scenes each."""
    n_scenes = torch.randint(2, 7, (n,), generator=g)
    cuts = torch.sort(torch.rand(n, 5, generator=g), dim=1).values
    cuts = torch.where(torch.arange(5)[None] < (n_scenes - 1)[:, None], cuts, torch.full_like(cuts, 2.0))
    concepts = torch.randint(0, len(sm.concepts), (n, 6), generator=g)
    out = []
    for length in (M, L):
        ids = concepts.gather(1, _scene_index(cuts, length))
        out.append(sm.concepts[ids] + sm.offset + sm.noise((n, length), g, 0.4))
    concepts = torch.where(torch.arange(6)[None] < n_scenes[:, None], concepts, -1)
    return out[0], out[1], concepts


def batch_arrays(sm: SceneModel, model: MSSL, n: int, mode: str, seed: int, first: int, bank: np.ndarray
                 ) -> tuple[list[dict], dict[str, np.ndarray], dict[str, list[np.ndarray]], np.ndarray]:
    """One batch of n synthetic videos, ids syn<first>..., drawn from its own generator (``seed``), in the
    index's stored layout: (records, FIXED arrays, RAGGED lists, (n, 6) scene concepts). Compact mode stores
    32 random windows per video (speed does not depend on which)."""
    g = torch.Generator().manual_seed(seed)
    units, frames, concepts = synthetic_batch(sm, n, g)
    if mode == "compact":
        pidx = torch.sort(torch.rand(n, len(TABLE), generator=g).argsort(1)[:, :32], 1).values
    else:
        pidx = torch.arange(len(TABLE)).expand(n, -1)
    props = window_proposals(units).gather(1, pidx[..., None].expand(-1, -1, H))  # the stored windows
    enc = EncodedVideos(units, props, pidx, frames, torch.ones(n, L))
    z, alpha = model.attend(enc, torch.arange(props.shape[1]).expand(n, -1))
    zhat = torch.nn.functional.normalize(z, dim=-1)
    factors = [frame_factors(zv, av) for zv, av in zip(zhat, alpha, strict=True)]
    fixed = {"units": units.numpy(), "pnorm": props.double().norm(dim=-1).float().numpy(),
             "pidx": pidx.numpy().astype(np.int16)}
    records = [{"id": f"syn{first + i}", "title": "", "path": "", "duration": float(ROWS), "sha256": ""}
               for i in range(n)]
    fixed, ragged = results_arrays(fixed, frames.numpy(), np.random.default_rng(seed), bank)
    ragged["zbasis"], ragged["zcoef"] = [f[0] for f in factors], [f[1] for f in factors]
    return records, fixed, ragged, concepts.numpy()


_WORKER: dict = {}  # a generating process's scene model, benchmark model and reference bank


def _start_worker() -> None:
    """A generating process: one thread each (two processes keep both cores busy with small products)."""
    torch.set_num_threads(1)
    model = identity_attention_model()
    _WORKER.update(sm=SceneModel(), model=model, bank=bank_vectors(reference_bank(model)))


def _worker_batch(job: tuple[int, str, int, int]) -> tuple:
    """``batch_arrays`` of one job (n, mode, seed, first) in a generating process."""
    n, mode, seed, first = job
    return batch_arrays(_WORKER["sm"], _WORKER["model"], n, mode, seed, first, _WORKER["bank"])


def synthetic_videos(n: int, mode: str, seed: int, batch: int = 500,
                     workers: int = GENERATORS) -> Iterator[tuple]:
    """n synthetic videos in batches (``batch_arrays``), batch i drawn with seed (seed, i): the same videos
    on every run, generated by ``workers`` processes ahead of their use, at most ``workers`` batches ahead
    (``Pool.imap`` runs ahead without bound: where the index adds slower than they are made, the batches
    waiting in this process grew its memory by 270 KB a video, the index's own memory hidden under them)."""
    jobs = [(min(batch, n - a), mode, seed * 100003 + i, a) for i, a in enumerate(range(0, n, batch))]
    if workers <= 1:
        _start_worker()
        yield from map(_worker_batch, jobs)
        return
    # one BLAS thread per process (read when a process loads numpy: set before they start)
    blas = {k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    os.environ.update(dict.fromkeys(blas, "1"))
    try:
        pool = multiprocessing.get_context("spawn").Pool(workers, _start_worker)
    finally:
        for k, v in blas.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    with pool:
        ahead: collections.deque = collections.deque()
        for job in jobs:
            ahead.append(pool.apply_async(_worker_batch, (job,)))
            if len(ahead) > workers:
                yield ahead.popleft().get()
        while ahead:
            yield ahead.popleft().get()


def build_index(root: Path, n: int, mode: str, model: MSSL, sm: SceneModel, seed: int, batch: int = 500,
                workers: int = GENERATORS) -> tuple[VideoIndex, torch.Tensor]:
    """A synthetic index at the stored-array level; returns it and every video's scene concepts (an index
    already at ``root`` with n videos of this seed is reused: its concepts are kept beside it)."""
    concepts_file = root.parent / f"{root.name}.concepts.npy"
    config = IndexConfig(mode=mode, verify_checksums=False)
    if (root / "manifest.json").exists() and concepts_file.exists():
        try:
            index = VideoIndex.open(root, model, config, reference_bank(model))
        except IndexStoreError:  # another schema (an older version of the code): rebuild
            index = None
        if index is not None and len(index) == n:
            return index, torch.from_numpy(np.load(concepts_file))
    shutil.rmtree(root, ignore_errors=True)
    index = VideoIndex.create(root, model, config, reference_bank(model))
    all_concepts = []
    for records, fixed, ragged, concepts in synthetic_videos(n, mode, seed, batch, workers):
        index.add_encoded(records, fixed, ragged)
        all_concepts.append(concepts)
    np.save(concepts_file, np.concatenate(all_concepts))
    return (VideoIndex.open(root, model, config, reference_bank(model)),
            torch.from_numpy(np.concatenate(all_concepts)))


def reference_bank(model: MSSL) -> ReferenceQueries:
    """A stand-in reference bank of REFERENCES random query vectors (its scores are drawn, not computed)."""
    q = torch.randn(REFERENCES, H, generator=torch.Generator().manual_seed(5))
    return ReferenceQueries(torch.nn.functional.normalize(q, dim=-1), "synthetic-random")


def results_arrays(fixed: dict[str, np.ndarray], frames: np.ndarray, g: np.random.Generator, bank: np.ndarray
                   ) -> tuple[dict[str, np.ndarray], dict[str, list[np.ndarray]]]:
    """The FIXED and RAGGED arrays of a batch of synthetic videos (module docstring), but for the frame-scale
    factors: 64 one-second rows, L frames of two rows each as the fine rows, their segments and bank
    statistics, random reference scores."""
    t = np.arange(ROWS, dtype=np.float32)
    step = ROWS // L
    ragged: dict[str, list] = {k: [] for k in RAGGED if k not in ("zbasis", "zcoef", *WORDS)}  # (no words)
    for f in frames:
        fine = f / np.maximum(np.linalg.norm(f, axis=1, keepdims=True), 1e-12)
        video = {"frames": f, "row_start": t, "row_end": t + 1,
                 **localisation_arrays(fine, t[::step], t[step - 1::step] + 1, segment_video(fine), bank)}
        for k in ragged:
            ragged[k].append(video[k])
    b = len(frames)
    fixed = {**fixed, "ref_clip": half_up(g.uniform(0.0, 0.5, (b, REFERENCES))),
             "ref_frame": half_up(g.uniform(0.0, 0.5, (b, REFERENCES)))}
    return fixed, ragged


def make_queries(sm: SceneModel, concepts: torch.Tensor, n: int, g: torch.Generator) -> list[np.ndarray]:
    """Token features (8-20 tokens, H) of n queries describing one scene of a random video: the scene's
    vector plus noise, and per-token noise around it."""
    out = []
    for _ in range(n):
        video = concepts[int(torch.randint(0, len(concepts), (1,), generator=g))]
        video = video[video >= 0]
        concept = int(video[int(torch.randint(0, len(video), (1,), generator=g))])
        scene = sm.concepts[concept] + sm.offset + sm.noise((), g, 0.5)
        length = int(torch.randint(8, 21, (1,), generator=g))
        out.append((scene + sm.noise((length,), g, 0.5)).numpy())
    return out


def top(index: VideoIndex, evidence: object) -> tuple[np.ndarray, np.ndarray, int]:
    """(positions, totals, scored exactly) of an Evidence."""
    positions = np.array([index.position[h.id] for h in evidence.hits], dtype=np.int64)
    return positions, evidence.totals, evidence.scored_exactly


def unmatched_queries(n: int, seed: int = 11) -> list[np.ndarray]:
    """Token features of n queries that describe nothing in the gallery: 8-20 random tokens each (their
    encoded vectors point in random directions, away from every scene)."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((int(rng.integers(8, 21)), H)).astype(np.float32) for _ in range(n)]


def warm_page_cache(root: Path, chunk: int = 1 << 24) -> float:
    """Read every file of an index once, so that timed queries find it in the page cache ("page cache
    warm"; a bigger index built or kept before may have pushed it out); returns the seconds it took."""
    t0 = time.perf_counter()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        with open(path, "rb") as f:
            while f.read(chunk):
                pass
    return round(time.perf_counter() - t0, 1)


def machine_speed(repeats: int = 5) -> dict:
    """This machine's speed right now, beside each run's latencies (a shared VM's speed drifts by up to 2x
    within minutes): the best of a few 256 MB numpy reads (GB/s, what the first pass is bound by) and of a
    few torch products of 10 x 384 rows by a 384 x 384 float32 matrix (microseconds, the size of a query's
    torch ops; torch's, not numpy's: numpy's BLAS would leave worker threads spinning into the timed run)."""
    block, a, w = np.ones(1 << 25), torch.ones(10, 384), torch.ones(384, 384)
    scan, mm = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        block.sum()
        scan.append(time.perf_counter() - t)
        t = time.perf_counter()
        for _ in range(100):
            a @ w
        mm.append((time.perf_counter() - t) / 100)
    return {"scan_gb_s": round(block.nbytes / min(scan) / 1e9, 1), "matmul_us": round(1e6 * min(mm), 1)}


def latencies(fn, qs: np.ndarray) -> tuple[dict, list]:
    """p50 / p95 milliseconds of fn(q) over the queries, and the outputs."""
    fn(qs[0])  # warm-up (page cache, faiss build)
    times, outs = [], []
    for q in qs:
        t = time.perf_counter()
        outs.append(fn(q))
        times.append(1e3 * (time.perf_counter() - t))
    return {"p50_ms": round(float(np.percentile(times, 50)), 2),
            "p95_ms": round(float(np.percentile(times, 95)), 2)}, outs


def search_latencies(index: VideoIndex, queries: list[np.ndarray]) -> dict:
    """p50 / p95 milliseconds of the whole ``search`` (k=10) over token-feature queries, the p50 of its
    parts (where the time goes) and how many videos it scored exactly on average."""
    out, stats = latencies(lambda tokens: search([index], tokens, k=10).stats, queries)
    for part in ("encode", "rank", "results"):
        out[f"{part}_p50_ms"] = round(float(np.median([s[f"{part}_ms"] for s in stats])), 2)
    out["scored_exactly_mean"] = round(float(np.mean([s["scored_exactly"] for s in stats])), 1)
    return out


def straightforward(index: VideoIndex, model: MSSL, qs: np.ndarray, chunk: int = 1000) -> tuple[dict, list]:
    """model.score over precomputed EncodedVideos (all 528 proposals, attention per pair), in chunks."""
    live = np.arange(len(index))
    encoded = []
    for a in range(0, len(live), chunk):
        pos = live[a:a + chunk]
        units = torch.from_numpy(index.snapshot.gather("units", pos))
        frames = torch.stack([torch.from_numpy(index.snapshot.ragged("frames", p).copy()) for p in pos])
        props = window_proposals(units)
        encoded.append(EncodedVideos(units, props, torch.arange(props.shape[1]).expand(len(pos), -1), frames,
                                     torch.ones(len(pos), frames.shape[1])))

    def run(q: np.ndarray) -> np.ndarray:
        qt = torch.from_numpy(q)[None]
        total = torch.cat([model.score(qt, enc).total[0] for enc in encoded]).numpy()
        return np.lexsort((live, -total))[:10]

    return latencies(run, qs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2179, 10000, 100000])
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--baseline-queries", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--decay", type=float, default=1.0, help="power-law exponent of the concept spectrum")
    parser.add_argument("--exact-max", type=int, default=10000, help="largest N built in exact mode (disk)")
    parser.add_argument("--dir", type=Path, default=None, help="where to build the indexes (a temp dir)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="build the indexes here and keep them for the next run (default: temp, deleted)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    sm, model = SceneModel(decay=args.decay), identity_attention_model()
    report = {"threads": args.threads, "decay": args.decay, "hidden": H, "units": M, "frames": L, "runs": []}
    workdir = args.keep or Path(tempfile.mkdtemp(dir=args.dir))
    try:
        for n in args.sizes:
            for mode in ("exact", "compact"):
                if mode == "exact" and n > args.exact_max:
                    continue
                t0 = time.perf_counter()
                index, concepts = build_index(workdir / f"{mode}-{n}", n, mode, model, sm, seed=n)
                tokens = make_queries(sm, concepts, args.queries, torch.Generator().manual_seed(7))
                qs = np.stack([encode_query(model, t) for t in tokens])  # what rank() takes
                run = {"n": n, "mode": mode, "build_s": round(time.perf_counter() - t0, 1),
                       "page_cache_warm_s": warm_page_cache(workdir / f"{mode}-{n}"),
                       "first_pass_bytes_per_video": round(index.first_pass_bytes() / n),
                       "stored_bytes_per_video": round(index.stored_bytes() / n), "machine": machine_speed()}

                def exact(q: np.ndarray, index: VideoIndex = index) -> tuple:
                    return top(index, index.rank(q, 10))

                def approximate(q: np.ndarray, index: VideoIndex = index) -> tuple:
                    return top(index, index.rank(q, 10, approximate=True))

                run["exact"], tops = latencies(exact, qs)
                run["exact"]["scored_exactly_mean"] = round(float(np.mean([t[2] for t in tops])), 1)
                run["search"] = search_latencies(index, tokens)
                run["search_unmatched"] = search_latencies(index, unmatched_queries(args.queries))
                run["approximate"], approx = latencies(approximate, qs)
                run["approximate"]["recall_at_10"] = float(np.mean(
                    [len(set(a[0]) & set(t[0])) / 10 for a, t in zip(approx, tops, strict=True)]))
                if mode == "exact" and n <= 10000:
                    nb = args.baseline_queries
                    run["straightforward"], base = straightforward(index, model, qs[:nb])
                    run["straightforward"]["same_top10"] = all(
                        b.tolist() == t[0].tolist() for b, t in zip(base, tops[:nb], strict=True))
                    run["speedup_p50"] = round(run["straightforward"]["p50_ms"] / run["exact"]["p50_ms"], 1)
                report["runs"].append(run)
                print(json.dumps(run), flush=True)
                if args.keep is None:
                    shutil.rmtree(workdir / f"{mode}-{n}")
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
