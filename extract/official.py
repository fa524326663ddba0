"""The official MS-SL on-disk layout: W2VV BigFile visual features and caption files.

One implementation for both directions: ``extract.features.export_official`` writes it, ``prvr.data.official``
and ``prvr.data.synthetic`` read and write it (../shared/docs/mssl-reference.md section 1)::

    FeatureData/FEATURE/shape.txt         "<n_rows> <dim>"
    FeatureData/FEATURE/id.txt            the row ids, whitespace-separated (ISO-8859-1)
    FeatureData/FEATURE/feature.bin       n_rows x dim little-endian float32, row-major
    FeatureData/FEATURE/video2frames.txt  a Python dict literal {video_id: [row ids]}
    TextData/NAME<split>.caption.txt      "<cap_id> <text>" a line; video_id = cap_id.split('#')[0]
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class DataError(ValueError):
    """Bad or inconsistent data on disk; the message names the file and the offending id."""


@dataclass(frozen=True)
class Caption:
    cap_id: str
    video_id: str
    text: str


def video_id_of(cap_id: str) -> str:
    """The official rule: a caption id is ``<video_id>#...``."""
    return cap_id.split("#")[0]


def read_captions(path: str | Path, require_text: bool = True) -> list[Caption]:
    """Read ``<cap_id> <text>`` lines; blank lines are skipped, anything else malformed is an error."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"caption file not found: {path}")
    captions, seen = [], set()
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        cap_id, _, text = line.strip().partition(" ")
        if require_text and not text.strip():
            raise DataError(f"{path}:{lineno}: malformed caption line {line!r}: expected '<cap_id> <text>'")
        if cap_id in seen:
            raise DataError(f"{path}:{lineno}: duplicate caption id {cap_id!r}")
        seen.add(cap_id)
        captions.append(Caption(cap_id, video_id_of(cap_id), text.strip()))
    if not captions:
        raise DataError(f"{path}: no captions")
    return captions


class BigFile:
    """The W2VV BigFile feature store: shape.txt, id.txt, feature.bin (read through a memory map)."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        for name in ("shape.txt", "id.txt", "feature.bin"):
            if not (self.dir / name).is_file():
                raise FileNotFoundError(f"BigFile {self.dir}: missing {name}")
        try:
            self.n_rows, self.dim = (int(v) for v in (self.dir / "shape.txt").read_text().split())
        except ValueError as e:
            raise DataError(f"{self.dir / 'shape.txt'}: expected '<n_rows> <dim>': {e}") from None
        ids = (self.dir / "id.txt").read_bytes().decode("ISO-8859-1").split()
        if len(ids) != self.n_rows:
            raise DataError(f"{self.dir / 'id.txt'}: {len(ids)} ids but shape.txt says {self.n_rows} rows")
        self.row_of = {rid: i for i, rid in enumerate(ids)}
        if len(self.row_of) != len(ids):
            raise DataError(f"{self.dir / 'id.txt'}: duplicate row ids")
        size = (self.dir / "feature.bin").stat().st_size
        if size != self.n_rows * self.dim * 4:
            raise DataError(f"{self.dir / 'feature.bin'}: {size} bytes, but shape.txt says "
                            f"{self.n_rows} x {self.dim} float32 = {self.n_rows * self.dim * 4}")
        self.matrix = np.memmap(self.dir / "feature.bin", dtype="<f4", mode="r",
                                shape=(self.n_rows, self.dim))

    def read(self, row_ids: list[str], what: str) -> np.ndarray:
        """Rows for ``row_ids``, in that order, as an (n, dim) float32 array."""
        missing = [r for r in row_ids if r not in self.row_of]
        if missing:
            raise DataError(f"{self.dir / 'id.txt'}: {what}: row ids not found: {missing[:5]}")
        return np.asarray(self.matrix[[self.row_of[r] for r in row_ids]], dtype=np.float32)


class BigFileWriter:
    """Write a BigFile row chunk by row chunk: ``with BigFileWriter(dir, dim) as w: w.add(ids, rows)``."""

    def __init__(self, directory: str | Path, dim: int):
        self.dir, self.dim, self.ids = Path(directory), dim, []
        self.dir.mkdir(parents=True, exist_ok=True)
        self.file = open(self.dir / "feature.bin", "wb")  # closed in __exit__

    def add(self, ids: list[str], rows: np.ndarray) -> None:
        """Append rows (n, dim) with their ids."""
        if rows.ndim != 2 or rows.shape != (len(ids), self.dim):
            raise ValueError(f"BigFileWriter: rows of shape {rows.shape} for {len(ids)} ids, dim {self.dim}")
        bad = [i for i in ids if not i or any(c.isspace() for c in i)]
        if bad:
            raise ValueError(f"BigFileWriter: row ids must be non-empty without whitespace: {bad[:5]}")
        self.file.write(np.ascontiguousarray(rows, dtype="<f4").data)
        self.ids += ids

    def __enter__(self) -> BigFileWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()
        (self.dir / "id.txt").write_bytes(" ".join(self.ids).encode("ISO-8859-1"))
        (self.dir / "shape.txt").write_text(f"{len(self.ids)} {self.dim}")

    def write_video2frames(self, video2frames: dict[str, list[str]]) -> None:
        """video2frames.txt next to the features: a Python dict literal, as the official loader reads it."""
        (self.dir / "video2frames.txt").write_text(repr(video2frames), encoding="ISO-8859-1")


def read_video2frames(path: str | Path) -> dict[str, list[str]]:
    """Parse video2frames.txt, a Python dict literal, safely (``ast.literal_eval``, never ``eval``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"video2frames file not found: {path}")
    try:
        table = ast.literal_eval(path.read_text(encoding="ISO-8859-1"))
    except (ValueError, SyntaxError) as e:
        raise DataError(f"{path}: not a Python dict literal: {e}") from None
    if not isinstance(table, dict) or not all(
        isinstance(k, str) and isinstance(v, list | tuple) for k, v in table.items()
    ):
        raise DataError(f"{path}: expected a dict {{video_id: [row ids]}}")
    return {k: list(v) for k, v in table.items()}
