"""An index of a previous schema (10, or 9) read into this one (11), so that a data dir's gallery, uploads
included, survives the upgrade without extracting or encoding any video again.

Schema 11 adds the words channel (``schema.WORDS``): an upgraded video has no words (they are read from its
media by a later add, not here). Schema 9 also stored each proposal's frame-scale feature whole (``zhat``,
(P, H) float32), which schema 10 onwards stores factored (``encoding.frame_factors``); every other array is
the same. ``open_gallery`` upgrades the built-in index of the model in use when the data dir holds its
schema-10 (else schema-9) directory and no schema-11 one: the new index is written aside and renamed into
place when complete (a crash leaves the old one, and the next start tries again); the old directory is left
as it was. Older schemas are refused with "rebuild the index".
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from prvr.index import store
from prvr.index.encoding import frame_factors
from prvr.index.schema import FIXED, RAGGED, RECORD, SCHEMA_VERSION, WORDS

log = logging.getLogger(__name__)

PREVIOUS = (10, 9)  # the schemas this module reads, the newest first (the one open_gallery tries first)
IDENTITY = ("model_fingerprint", "profile", "map_size", "max_ctx_l", "context_beta", "references", "mode")


def previous_manifest(root: Path) -> dict | None:
    """The manifest of an index of a ``PREVIOUS`` schema at root, or None when root holds none."""
    try:
        manifest = json.loads((Path(root) / store.MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    ok = manifest.get("format") == store.FORMAT and manifest.get("schema_version") in PREVIOUS
    return manifest if ok else None


def videos_of(root: Path, manifest: dict, batch: int = 64) -> Iterator[tuple[list[dict], dict, dict]]:
    """The live videos of an index of a ``PREVIOUS`` schema in insertion order, in batches of (records, FIXED
    arrays, RAGGED lists) in this schema's layout, without words (``Gallery.add_encoded`` adds them empty)."""
    factored = manifest["schema_version"] >= 10  # schema 9 stored zhat whole
    skip = (*WORDS, *(() if factored else ("zbasis", "zcoef")))
    counts = {a: c for a, c in RAGGED.items() if a not in skip}  # (the old schema's ragged arrays)
    for entry in manifest["segments"]:
        directory = Path(root) / entry["name"]
        for fname, fentry in entry["files"].items():
            store.verify_file(directory / fname, fentry, checksum=False)

        def load(name: str, directory: Path = directory) -> np.ndarray:
            return np.load(directory / f"{name}.npy", mmap_mode="r", allow_pickle=False)

        records = store.read_records(directory)
        offsets = {c: np.concatenate([[0], np.cumsum(load(c))]) for c in set(counts.values())}
        removed = set(entry["removed"])
        live = [i for i in range(entry["count"]) if i not in removed]
        for a in range(0, len(live), batch):
            part = live[a:a + batch]
            fixed = {k: np.asarray(load(k)[part]) for k in FIXED}
            ragged: dict[str, list[np.ndarray]] = {}
            for k, c in counts.items():
                ragged[k] = [np.asarray(load(k)[offsets[c][i]:offsets[c][i + 1]]) for i in part]
            if not factored:
                zhat = load("zhat")
                factors = [frame_factors(np.asarray(zhat[i])) for i in part]
                ragged["zbasis"], ragged["zcoef"] = [f[0] for f in factors], [f[1] for f in factors]
            yield [{k: records[i].get(k, "") for k in RECORD} for i in part], fixed, ragged


def upgrade(old: Path, index, identity: dict) -> int:
    """Add every live video of the old index at ``old`` to the new, empty ``index`` (a ``VideoIndex``
    at a temporary path) when it was made for this identity (``gallery.model_identity``, the reference bank,
    the mode); returns how many (0: not the same model, nothing done)."""
    manifest = previous_manifest(old)
    if manifest is None or any(manifest.get(k) != identity.get(k) for k in IDENTITY):
        return 0
    t0, done = time.perf_counter(), 0
    for records, fixed, ragged in videos_of(old, manifest):
        index.add_encoded(records, fixed, ragged)
        done += len(records)
    log.info("upgraded %d videos of %s (schema %d) to schema %d in %.1f s", done, old,
             manifest["schema_version"], SCHEMA_VERSION, time.perf_counter() - t0)
    return done


def upgraded_into(old: Path, new: Path, create, identity: dict) -> bool:
    """Write ``new`` from the old index at ``old`` (``create(path)`` makes an empty index there):
    aside, then renamed into place; False (nothing written) when ``old`` is not one for this identity."""
    if previous_manifest(old) is None:
        return False
    aside = new.with_name(f".{new.name}.upgrading")
    shutil.rmtree(aside, ignore_errors=True)
    try:
        if not upgrade(old, create(aside), identity):
            return False
        aside.rename(new)
        return True
    finally:
        shutil.rmtree(aside, ignore_errors=True)
