"""Everything the app can be told: ``AppSettings`` from command-line flags, then ``PRVR_*`` variables, then
defaults (``python app.py --help`` lists them)."""

from __future__ import annotations

import argparse
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

from extract.pipeline import parse_weights
from prvr.index import QdrantTarget
from prvr.paths import default_data_dir

UPLOAD_MODES = ("session", "shared")


def on_spaces() -> bool:
    """True inside a Hugging Face Space (public: listen on all interfaces, keep uploads private)."""
    return bool(os.environ.get("SPACE_ID"))


def on_zerogpu() -> bool:
    """True on ZeroGPU hardware: ``SPACES_ZERO_GPU`` is true (read as the ``spaces`` package reads it) and
    ``spaces`` is installed. The one answer to "are we on ZeroGPU" (the extractor is chosen by it, once, at
    start: ``prvr.serve.extraction.choose_extractor``)."""
    if os.environ.get("SPACES_ZERO_GPU", "").lower() not in ("1", "t", "true"):
        return False
    return importlib.util.find_spec("spaces") is not None


@dataclass
class AppSettings:
    """Everything the app can be told; CLI flags override ``PRVR_*`` environment variables."""

    host: str = field(default_factory=lambda: "0.0.0.0" if on_spaces() else "127.0.0.1")
    port: int = 7860
    data_dir: Path = field(default_factory=default_data_dir)
    checkpoint: Path | None = None  # a trained MS-SL checkpoint; None: a training-free model
    profile: str | None = None  # None: the checkpoint's profile, else "clip" if it loads, else "lite"
    weights: tuple[str, ...] = ()  # BACKBONE=SPEC each (e.g. clip=DIR); env PRVR_WEIGHTS: comma-separated
    gallery: Path | None = None  # a folder of the user's videos, indexed at start (incrementally)
    uploads: str = field(default_factory=lambda: "session" if on_spaces() else "shared")
    max_upload_mb: int = 200
    max_uploads_per_session: int = 10
    # longer uploads are refused (on this project's 2-core CPU lite extracts 3-6 s of video a second: an
    # hour in 10-20 minutes; on ZeroGPU an hour of lite asks for 220 GPU seconds, prvr.serve.zerogpu)
    max_duration_s: float = 60 * 60.0
    session_ttl_s: float = 6 * 3600.0  # a session's private uploads are deleted after this much idle time
    demo_videos: str | None = None  # comma-separated demo video ids to index; None: all (fewer: faster start)
    mcp: bool = False  # also serve the named endpoints as MCP tools at /gradio_api/mcp/ (needs gradio[mcp])
    # comma-separated server dirs whose files the MCP add_video tool may read by path (None: no paths)
    mcp_allow_paths: str | None = None
    # the shared gallery's backend: None, the built-in index in data_dir; qdrant://HOST:PORT/COLLECTION (a
    # server) or qdrant+local://DIR (embedded): prvr.index.qdrant, docs/qdrant.md
    index: str | None = None
    # a folder (a mounted Storage Bucket) keeping the shared gallery across restarts as write-once files
    # (prvr.serve.persist); None: the shared gallery lives in data_dir only
    persist: Path | None = None

    def __post_init__(self) -> None:
        if self.uploads not in UPLOAD_MODES:
            raise ValueError(f"uploads must be one of {UPLOAD_MODES}, got {self.uploads!r}")
        for name in ("max_upload_mb", "max_uploads_per_session", "max_duration_s", "port"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        self.data_dir = Path(self.data_dir).expanduser()
        self.checkpoint = Path(self.checkpoint).expanduser() if self.checkpoint else None
        self.gallery = Path(self.gallery).expanduser() if self.gallery else None
        self.persist = Path(self.persist).expanduser() if self.persist else None
        if self.index:

            QdrantTarget.parse(self.index)  # a bad URL is refused before anything loads
        self.weights = tuple(self.weights)
        self.weight_specs()  # a malformed --weights fails here, naming it

    def weight_specs(self) -> dict[str, str]:
        """``--weights`` as {backbone: spec}; every item must name its backbone (NAME=SPEC)."""
        specs = parse_weights(list(self.weights))
        if isinstance(specs, str):
            raise ValueError(f"--weights {specs!r} must name its backbone, e.g. clip=/path/to/model")
        return specs or {}

    @classmethod
    def from_args(cls, argv: Sequence[str] | None = None) -> AppSettings:
        """Settings from command-line flags, falling back to ``PRVR_<NAME>`` variables, then defaults."""
        parser = argparse.ArgumentParser(description="PRVR video search app (Gradio).")
        for f in fields(cls):
            env = os.environ.get(f"PRVR_{f.name.upper()}")
            if f.name == "weights":  # repeatable; the variable holds comma-separated items
                parser.add_argument("--weights", action="append", metavar="BACKBONE=SPEC",
                                    default=None, help="backbone weights, e.g. clip=/path/to/model "
                                    "(repeatable; env PRVR_WEIGHTS, comma-separated)")
                continue
            kind = {"port": int, "max_upload_mb": int, "max_uploads_per_session": int,
                    "max_duration_s": float, "session_ttl_s": float, "mcp": _yes}.get(f.name, str)
            flag = {"nargs": "?", "const": True} if kind is _yes else {}  # ``--mcp`` alone means yes
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=env,
                                choices=UPLOAD_MODES if f.name == "uploads" else None,
                                help=f"(env PRVR_{f.name.upper()})", **flag)
        # argparse converts string defaults (the environment's values) with ``type`` too
        given = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
        if "weights" not in given and os.environ.get("PRVR_WEIGHTS"):
            given["weights"] = [w.strip() for w in os.environ["PRVR_WEIGHTS"].split(",") if w.strip()]
        try:
            return cls(**given)
        except ValueError as err:
            parser.error(str(err))
            raise  # unreachable: parser.error exits


def _yes(text: str) -> bool:
    """A boolean flag or variable: 1/true/yes/on or 0/false/no/off."""
    value = str(text).strip().lower()
    if value not in ("1", "true", "yes", "on", "0", "false", "no", "off", ""):
        raise argparse.ArgumentTypeError(f"expected yes or no (1/0, true/false), got {text!r}")
    return value in ("1", "true", "yes", "on")
