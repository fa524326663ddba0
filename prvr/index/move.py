"""Moving a gallery to a Qdrant server: every video of a built-in index directory or of an embedded Qdrant
store, copied as stored (the model's outputs, records, insertion order; no model and no video needed) into a
new collection, then counted.

```bash
python -m prvr.index move ~/.cache/prvr/indexes/lite-0123456789ab-v10 qdrant://db:6333/videos
python -m prvr.index move qdrant+local://runs/qdrant qdrant://db:6333/videos
python app.py --index qdrant://db:6333/videos          # the same gallery, now on the server
```

The source is only read; delete it once the app runs on the target. The target must not exist yet: a move
that stops half-way (a server gone) leaves a partial collection, which the next try refuses; delete it
(``DELETE /collections/NAME``) and move again. Both ends hold the schema of this release
(``schema.SCHEMA_VERSION``): an index of an older schema cannot be moved, it is rebuilt.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from prvr.index import store
from prvr.index.qdrant import QdrantConfig, QdrantIndex, QdrantStore, read_meta
from prvr.index.qdrant_store import ARRAYS, META_ID, QdrantTarget, array_id, unpack
from prvr.index.schema import FIXED, RAGGED, RECORD
from prvr.index.snapshot import Snapshot
from prvr.models.preprocess import window_table

log = logging.getLogger(__name__)

IDENTITY = ("model_fingerprint", "profile", "map_size", "max_ctx_l", "context_beta")  # gallery.model_identity
Batch = tuple[list[dict], dict[str, np.ndarray], dict[str, list[np.ndarray]]]  # records, FIXED, RAGGED


def _builtin(root: Path, batch: int) -> tuple[dict, int, Iterator[Batch]]:
    """(metadata, video count, batches of the live videos in insertion order) of a built-in index."""
    manifest = store.read_manifest(root)
    snap = Snapshot(root, manifest, True, window_table(int(manifest["map_size"])).numpy())

    def batches() -> Iterator[Batch]:
        for a in range(0, len(snap.live), batch):
            part = snap.live[a:a + batch]
            yield ([{k: snap.videos[p].get(k, "") for k in RECORD} for p in part],
                   {k: snap.gather(k, part) for k in FIXED},
                   {k: [snap.ragged(k, int(p)) for p in part] for k in RAGGED})

    return manifest, len(snap.live), batches()


def _qdrant(target: QdrantTarget, batch: int) -> tuple[dict, int, Iterator[Batch], Callable[[], None]]:
    """(metadata, video count, batches in insertion order, close) of a Qdrant gallery."""
    source = target.connect(QdrantConfig().timeout)
    try:
        meta = read_meta(source.videos)
        records = sorted((p for i, p in source.videos.scroll([*RECORD, "seq"]) if i != META_ID),
                         key=lambda p: p["seq"])
    except BaseException:
        source.close()
        raise

    def batches() -> Iterator[Batch]:
        for a in range(0, len(records), batch):
            part = records[a:a + batch]
            arrays = [{} for _ in part]
            for group in ("exact", "evidence", "words"):
                ids = [array_id(p["seq"], group) for p in part]
                got = source.arrays.retrieve(ids, list(ARRAYS))
                for x, i in zip(arrays, ids, strict=True):
                    x.update(unpack(got[i]))
            yield ([{k: p[k] for k in RECORD} for p in part],
                   {k: np.stack([x[k] for x in arrays]) for k in FIXED},
                   {k: [x[k] for x in arrays] for k in RAGGED})

    return meta, len(records), batches(), source.close


def _nothing() -> None:
    """What a built-in source releases."""


def move(source: str, target: str, batch: int = 256, report: Callable[[str], None] = log.info,
         shards: int = 1, replicas: int = 1) -> int:
    """Copy every video of ``source`` (a built-in index directory or ``qdrant+local://DIR``) into the new
    Qdrant gallery ``target`` (``qdrant://HOST:PORT/NAME`` or ``qdrant+local://DIR``), its collections made
    with ``shards`` shards of ``replicas`` copies on a server; returns how many. Raises IndexStoreError when
    the target exists or the source is not a gallery of this schema."""
    t0 = time.perf_counter()
    if str(source).startswith(("qdrant://", "qdrants://", "qdrant+local://")):
        meta, total, batches, close = _qdrant(QdrantTarget.parse(source), batch)
    else:
        meta, total, batches = _builtin(Path(source).expanduser(), batch)
        close = _nothing
    try:
        cfg = QdrantConfig(mode=meta["mode"], frame_balls=int(meta.get("frame_balls", 16)),
                           scene_keys=int(meta.get("scene_keys", QdrantConfig.scene_keys)), shards=shards,
                           replicas=replicas)
        dest = QdrantTarget.parse(target)
        out = dest.connect(cfg.timeout)
        if out.exist():
            out.close()
            raise store.IndexStoreError(f"{dest.where} already exists: move into a new collection (delete a "
                                        "partial one left by an interrupted move first)")
        identity = {**{k: meta.get(k) for k in IDENTITY}, "references": meta.get("references"),
                    "mode": cfg.mode}
        gallery = QdrantIndex.create_on(QdrantStore(dest, cfg, out), None, identity=identity)
        try:
            done = 0
            for records, fixed, ragged in batches:
                gallery.add_encoded(records, fixed, ragged)
                done += len(records)
                report(f"moved {done} of {total} videos to {dest.where}")
            if len(gallery) != total:
                raise store.IndexStoreError(f"{dest.where} holds {len(gallery)} videos after the move, the "
                                            f"source {total}")
        finally:
            gallery.close()
    finally:
        close()
    report(f"moved {total} videos from {source} to {dest.where} in {time.perf_counter() - t0:.1f} s; "
           f"start the app with --index {target}")
    return total
