"""Everything the app can be told: ``AppSettings`` from command-line flags, then ``PRVR_*`` variables, then
defaults (``python app.py --help`` lists them, with what each does and its default).

Each option is declared once, as a field of ``AppSettings`` with its help text (``option``); the command
line, its ``--help`` and the ``PRVR_*`` variables all come from those fields. Only the standard library (and
``prvr.paths``, itself stdlib-only) is imported here, so that ``--help`` and a malformed flag are answered
before torch and gradio load (``prvr.serve.startup.check_command_line``); what checks a value with the
heavy modules imports them when it runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

from prvr.paths import default_data_dir

UPLOAD_MODES = ("session", "shared")
WORDS_MODES = ("off", "subtitles", "all")  # --words (extract.words.reader.WordsConfig's modes)
SEARCH_MODES = ("auto", "exact", "approximate")  # --search (prvr.index.SEARCH_MODES: no numpy here)
ENV_PREFIX = "PRVR_"


def on_spaces() -> bool:
    """True inside a Hugging Face Space (public: listen on all interfaces, keep uploads private)."""
    return bool(os.environ.get("SPACE_ID"))


def on_zerogpu() -> bool:
    """True on ZeroGPU hardware: ``SPACES_ZERO_GPU`` is true (read as the ``spaces`` package reads it) and
    ``spaces`` is installed. The one answer to "are we on ZeroGPU" (the extractor is chosen by it, once, at
    start: ``prvr.serve.model_choice.choose_extractor``)."""
    if os.environ.get("SPACES_ZERO_GPU", "").lower() not in ("1", "t", "true"):
        return False
    return importlib.util.find_spec("spaces") is not None


def option(help: str, default: object = MISSING, *, default_factory: Callable[[], object] | object = MISSING,
           metavar: str | None = None, default_words: str | None = None, choices: Sequence[str] | None = None,
           repeatable: bool = False) -> object:
    """A field of ``AppSettings`` with what its flag does (``help``: a phrase, no default in it).
    ``default_words``: the default in words where the value alone says too little (None, or one that
    depends on where the app runs); ``repeatable``: the flag may be given several times (its variable holds
    comma-separated items)."""
    return field(default=default, default_factory=default_factory,
                 metadata={"help": help, "metavar": metavar, "default_words": default_words,
                           "choices": choices, "repeatable": repeatable})


@dataclass
class AppSettings:
    """Everything the app can be told; CLI flags override ``PRVR_*`` environment variables."""

    host: str = option("the network address to listen on", metavar="HOST",
                       default_factory=lambda: "0.0.0.0" if on_spaces() else "127.0.0.1",
                       default_words="127.0.0.1, this machine only; 0.0.0.0 on a Hugging Face Space")
    port: int = option("the port of the page, the API and the MCP tools", 7860, metavar="PORT")
    data_dir: Path = option("the working folder on local disk: the index, extracted features, the demo "
                            "videos and caches", default_factory=default_data_dir, metavar="DIR")
    checkpoint: Path | None = option(
        "a trained MS-SL checkpoint to serve: a folder saved by prvr.train or an official model.ckpt", None,
        metavar="DIR_OR_FILE", default_words="none, a training-free model serves")
    profile: str | None = option(
        "the feature profile and model: clip (a CLIP-family model, training-free), clip_whole (the same "
        "model on whole frames), lite (the offline bridge, training-free) or a checkpoint's profile", None,
        metavar="NAME",
        default_words="the checkpoint's; without one, clip where its weights load, else lite")
    weights: tuple[str, ...] = option(
        "a backbone's weights, by Hugging Face hub id or local folder, e.g. clip=/models/siglip or "
        "clip=hf-hub:google/siglip-base-patch16-224; give the flag once per backbone", (),
        metavar="BACKBONE=SPEC", default_words="each backbone's own default weights", repeatable=True)
    gallery: Path | None = option(
        "a folder of your videos, subfolders included, shared with every visitor: indexed in the background "
        "while the app serves (finished videos join in batches; a restart goes on where it stopped) and "
        "kept up with (added, changed and removed files are picked up)", None, metavar="DIR",
        default_words="none")
    uploads: str = option(
        "where uploads go: session (private to one browser session, deleted when it ends) or shared (they "
        "join the shared gallery, for everyone)", metavar="MODE", choices=UPLOAD_MODES,
        default_factory=lambda: "session" if on_spaces() else "shared",
        default_words="shared; session on a Hugging Face Space")
    max_upload_mb: int = option("the largest file an upload may be, in MB", 200, metavar="MB")
    max_uploads_per_session: int = option("how many videos one browser session may add (--uploads session)",
                                          10, metavar="N")
    # longer uploads are refused (on this project's 2-core CPU lite extracts 3-6 s of video a second: an
    # hour in 10-20 minutes; on ZeroGPU an hour of lite asks for 14 GPU seconds, prvr.serve.zerogpu)
    max_duration_s: float = option("the longest video an upload may be, in seconds", 60 * 60.0,
                                   metavar="SECONDS", default_words="3600, one hour")
    session_ttl_s: float = option(
        "a browser session's private uploads are deleted after it has been idle this many seconds",
        6 * 3600.0, metavar="SECONDS", default_words="21600, 6 hours")
    demo_videos: str | None = option(
        "which demo videos to index, comma-separated ids such as demo01,demo05 (fewer start faster)", None,
        metavar="IDS", default_words="all 8 demo videos")
    mcp: bool = option(
        "also serve search, add_video, info and clip as MCP tools at /gradio_api/mcp/; yes or no, the flag "
        "alone means yes", False, metavar="yes|no", default_words="no")
    mcp_allow_paths: str | None = option(
        "comma-separated server folders whose files MCP's add_video may read by path (they join the shared "
        "gallery)", None, metavar="DIR[,DIR]", default_words="none: MCP clients send the file or a URL")
    # prvr.index.qdrant, docs/qdrant.md
    index: str | None = option(
        "the shared gallery in Qdrant: qdrant://HOST:PORT/COLLECTION (a server) or qdrant+local://DIR "
        "(embedded)", None, metavar="URL", default_words="the built-in index in the data dir")
    search: str = option(
        "how the shared gallery is searched: exact (every video can rank), approximate (candidates from the "
        "index, recall@10 >= 0.99 measured) or auto (approximate from a size measured per index: /info says "
        "which and why)", "auto", metavar="MODE", choices=SEARCH_MODES)
    # prvr.serve.persist
    persist: Path | None = option(
        "a folder (a mounted Storage Bucket) that keeps the shared gallery across restarts, as write-once "
        "files", None, metavar="DIR", default_words="none: the shared gallery lives in the data dir only")
    # prvr.serve.folder: --gallery in the background
    folder_rescan_s: float = option("how often the folder of your videos (gallery) is looked at again for "
                                    "added, changed or removed files, in seconds", 30.0, metavar="SECONDS")
    folder_batch_s: float = option("the longest a finished video of the folder (gallery) waits to join the "
                                   "search with others, in seconds (a batch also joins once 10 are finished; "
                                   "0: each joins alone)", 60.0, metavar="SECONDS")
    # extract.words: what each video says and writes, read at ingest beside its pictures (prvr.serve.ingest)
    words: str = option(
        "which words of each video are read and searched beside its pictures: off, subtitles (subtitle "
        "tracks and a sidecar .srt / .vtt) or all (also speech and text on screen)", "all", metavar="MODE",
        choices=WORDS_MODES)
    speech_weights: str | None = option(
        "the speech recogniser: a Whisper model by Hugging Face hub id or local folder, or pocketsphinx "
        "(offline, English); on the GPU when there is one", None, metavar="DIR_OR_HUB_ID",
        default_words="Whisper's default model where its weights load, else pocketsphinx")

    def __post_init__(self) -> None:
        if self.uploads not in UPLOAD_MODES:
            raise ValueError(f"uploads must be one of {UPLOAD_MODES}, got {self.uploads!r}")
        if self.words not in WORDS_MODES:
            raise ValueError(f"words must be one of {', '.join(WORDS_MODES)}, got {self.words!r}")
        if self.search not in SEARCH_MODES:
            raise ValueError(f"search must be one of {', '.join(SEARCH_MODES)}, got {self.search!r}")
        for name in ("max_upload_mb", "max_uploads_per_session", "max_duration_s", "port", "folder_rescan_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.folder_batch_s < 0:
            raise ValueError(f"folder_batch_s must be 0 or more, got {self.folder_batch_s}")
        self.data_dir = Path(self.data_dir).expanduser()
        self.checkpoint = Path(self.checkpoint).expanduser() if self.checkpoint else None
        self.gallery = Path(self.gallery).expanduser() if self.gallery else None
        if self.gallery is not None and not self.gallery.is_dir():
            raise ValueError(f"--gallery must be a folder of videos, got {str(self.gallery)!r} "
                             f"({'a file' if self.gallery.exists() else 'not found'})")
        self.persist = Path(self.persist).expanduser() if self.persist else None
        if self.index:
            from prvr.index import QdrantTarget  # numpy and the index: only to check a URL

            QdrantTarget.parse(self.index)  # a bad URL is refused before anything loads
        self.weights = tuple(self.weights)
        self.weight_specs()  # a malformed --weights fails here, naming it

    def weight_specs(self) -> dict[str, str]:
        """``--weights`` as {backbone: spec}; every item must name its backbone (NAME=SPEC)."""
        from extract.pipeline import parse_weights  # torch: only when there are settings to check

        specs = parse_weights(list(self.weights))
        if isinstance(specs, str):
            raise ValueError(f"--weights {specs!r} must name its backbone, e.g. clip=/path/to/model")
        return specs or {}

    @classmethod
    def parser(cls) -> argparse.ArgumentParser:
        """The command line: one flag per field, its ``PRVR_<NAME>`` variable as the default, help from
        the field (what it does, its default, its variable)."""
        parser = argparse.ArgumentParser(
            prog="python app.py", description="PRVR video search: the Gradio app (page, API, MCP tools).",
            formatter_class=WholeWords,
            epilog=f"Each option can also be set by its {ENV_PREFIX}* environment variable; a flag wins over "
                   "the variable.")
        for f in fields(cls):
            meta, env = f.metadata, f"{ENV_PREFIX}{f.name.upper()}"
            flag = f"--{f.name.replace('_', '-')}"
            if meta["repeatable"]:  # repeatable; the variable holds comma-separated items
                parser.add_argument(flag, action="append", metavar=meta["metavar"], default=None,
                                    help=help_text(f, f"{env}, comma-separated"))
                continue
            kind = {"int": int, "float": float, "bool": _yes}.get(str(f.type), str)
            nargs = {"nargs": "?", "const": True} if kind is _yes else {}  # ``--mcp`` alone means yes
            parser.add_argument(flag, type=kind, default=os.environ.get(env), choices=meta["choices"],
                                metavar=meta["metavar"], help=help_text(f, env), **nargs)
        return parser

    @classmethod
    def from_args(cls, argv: Sequence[str] | None = None) -> AppSettings:
        """Settings from command-line flags, falling back to ``PRVR_<NAME>`` variables, then defaults."""
        parser = cls.parser()
        # argparse converts string defaults (the environment's values) with ``type`` too
        given = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
        repeatable = [f.name for f in fields(cls) if f.metadata["repeatable"]]
        for name in repeatable:
            value = os.environ.get(f"{ENV_PREFIX}{name.upper()}")
            if name not in given and value:
                given[name] = [w.strip() for w in value.split(",") if w.strip()]
        try:
            return cls(**given)
        except ValueError as err:
            parser.error(str(err))
            raise  # unreachable: parser.error exits


class WholeWords(argparse.HelpFormatter):
    """argparse's help layout without breaking lines inside hyphenated words ("hf-hub:...")."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def help_text(f, env: str) -> str:
    """A flag's help: what it does, its default, and its environment variable (with its value when set)."""
    meta = f.metadata
    if meta["default_words"] is not None:
        default = meta["default_words"]
    else:
        default = f.default_factory() if f.default_factory is not MISSING else f.default
    variable = env.split(",")[0]
    now = f", set now: {os.environ[variable]!r}" if os.environ.get(variable) else ""
    return f"{meta['help']} (default: {default}; environment: {env}{now})".replace("%", "%%")


def _yes(text: str) -> bool:
    """A boolean flag or variable: 1/true/yes/on or 0/false/no/off."""
    value = str(text).strip().lower()
    if value not in ("1", "true", "yes", "on", "0", "false", "no", "off", ""):
        raise argparse.ArgumentTypeError(f"expected yes or no (1/0, true/false), got {text!r}")
    return value in ("1", "true", "yes", "on")
