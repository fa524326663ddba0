"""Confidence that means the same in any gallery: each hit's score against a fixed bank of captions on the
same video, with cuts calibrated per model.

Labels (one vocabulary, ``LABEL_WORDS``; every result carries ``confidence`` and ``confidence_label``):
``high`` "strong match", ``medium`` "possible match", ``low`` "unconfirmed", ``none`` "no match". Words
(``words_label``) can raise a hit's label: a line exactly in the video (source ``EXACT_SOURCES``: a subtitle,
a sidecar line, text on screen) holding the query's content (coverage >= ``STRONG_WORDS``: every content
term by default; ``prvr.index.words``) is a strong match, evidence a user can check; any other matched line
(speech is recognised, inexact; a partial or a dense-only match) at most a possible match. A raw
score is not comparable across queries or videos, and a z-score against the rest of the gallery changes
whenever the gallery does; so a (query, video) label depends only on that pair's total, on the scores of
the reference captions (``assets/reference_captions.txt``, everyday captions written for this) that the
index stored with the video, on the model and on the weights in use: query-bank normalisation (Bogolin et
al., CVPR 2022) reduced to cuts per video. At search time a video's cuts are quantiles of the captions'
totals at the weights in use plus a margin (``cuts``); ``CalibratedConfidence`` labels every hit of a
response, shared and session alike, by that one rule; a response without a ``high`` hit has no strong
match.

The quantiles and margins are a model's ``Calibration`` (``python -m benchmarks.calibrate`` writes it to
the data dir's ``confidence/``, found there first, then among the shipped ``assets/calibrations/``); a
model without one is ``UNCALIBRATED``: every hit "low", and ``describe`` says why. How the shipped cuts
were chosen and what they measured: the calibration files, and benchmarks/RESULTS.md ("Session 13",
"Issue #42: history moved from module docstrings"). The captions' token features are cached per text
encoder in ``cache_dir``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from prvr.index import Evidence, ReferenceQueries, VideoEvidence
from prvr.results.response import LABEL_WORDS, Assessment

log = logging.getLogger(__name__)

REFERENCE_CAPTIONS = Path(__file__).resolve().parents[2] / "assets" / "reference_captions.txt"
SHIPPED_CALIBRATIONS = Path(__file__).resolve().parents[2] / "assets" / "calibrations"
LABELS = tuple(LABEL_WORDS)  # "high", "medium", "low", "none"
# THE strong-match rule of the words channel (the dev set's tuning half decides it, its checking half
# confirms it):
# the lexical coverage (prvr.index.words: IDF-weighted share of the query's content terms, names and numbers
# required) that a line exactly in the video must reach to make its hit "high"
STRONG_WORDS = 1.0
EXACT_SOURCES = ("subtitles", "screen")  # text that is exactly in the video (speech is recognised: inexact)
CALIBRATION_FORMAT = "prvr-calibration"


def load_reference_captions(path: Path = REFERENCE_CAPTIONS) -> list[str]:
    """The reference captions: one per line, ``#`` comment lines and blank lines skipped."""
    lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    captions = [line for line in lines if line and not line.startswith("#")]
    if len(captions) < 50:
        raise ValueError(f"{path}: {len(captions)} reference captions; calibration needs at least 50")
    return captions


@dataclass(frozen=True)
class ConfidenceConfig:
    medium_quantile: float = 1.0  # medium: the score beats this quantile of the reference captions' totals
    high_quantile: float = 1.0  # high: ... this one (1.0: every one of them)
    high_margin: float = 0.1  # ... by more than this (calibrated on the dev set's tuning half: docstring)
    medium_margin: float = 0.1  # equal cuts: no "possible" band (no cut reached its precision target)
    none_quantile: float | None = None  # none: the score is at most this quantile of the reference totals
    none_margin: float = 0.0  # ... plus this; None: no "none" label
    calibrated: bool = True  # False: no cut applies, every hit is "low" (UNCALIBRATED)

    def __post_init__(self) -> None:
        if not 0.0 < self.medium_quantile <= self.high_quantile <= 1.0:
            raise ValueError(f"need 0 < medium_quantile <= high_quantile <= 1, got {self}")
        if not self.medium_margin <= self.high_margin:
            raise ValueError(f"need medium_margin <= high_margin, got {self}")
        if self.none_quantile is not None and not 0.0 <= self.none_quantile <= self.medium_quantile:
            raise ValueError(f"need 0 <= none_quantile <= medium_quantile, got {self}")


UNCALIBRATED = ConfidenceConfig(calibrated=False)  # a model nobody calibrated: never strong, never none


@dataclass(frozen=True)
class VideoNull:
    """A video's score cuts from the reference bank at some weights: what a query must beat."""

    medium: float
    high: float
    none: float | None = None  # a score at most this is "none" (None: no such cut)


def cuts(ref_clip: np.ndarray, ref_frame: np.ndarray, weights: Sequence[float],
         cfg: ConfidenceConfig = ConfidenceConfig()) -> VideoNull | None:
    """A video's cuts at ``weights`` = (clip_w, frame_w) from its stored reference scores (R,) each;
    None when it stores none."""
    return cuts_of([ref_clip], [ref_frame], weights, cfg)[0]


def cuts_of(ref_clip: Sequence[np.ndarray], ref_frame: Sequence[np.ndarray], weights: Sequence[float],
            cfg: ConfidenceConfig = ConfidenceConfig()) -> list[VideoNull | None]:
    """``cuts`` of several videos, the quantiles of those with equally many reference scores at once."""
    out: list[VideoNull | None] = [None] * len(ref_clip)
    sizes = [len(c) for c in ref_clip]
    for size in set(sizes) - {0}:
        which = [i for i, n in enumerate(sizes) if n == size]
        clip = np.stack([ref_clip[i] for i in which]).astype(np.float64)
        frame = np.stack([ref_frame[i] for i in which]).astype(np.float64)
        totals = weights[0] * clip + weights[1] * frame  # (V, R)
        medium, high = np.quantile(totals, (cfg.medium_quantile, cfg.high_quantile), axis=1, method="higher")
        low = (np.quantile(totals, cfg.none_quantile, axis=1, method="lower") + cfg.none_margin
               if cfg.none_quantile is not None else [None] * len(which))
        for j, i in enumerate(which):
            out[i] = VideoNull(float(medium[j]) + cfg.medium_margin, float(high[j]) + cfg.high_margin,
                               None if low[j] is None else float(low[j]))
    return out


def _cached_tokens(text_encoder, captions: list[str], cache_dir: Path | None) -> list[np.ndarray]:
    """Token features of the reference captions, cached per text model identity and caption list."""
    backbone = getattr(text_encoder, "backbone", None)
    identity = getattr(getattr(backbone, "weights", None), "identity", None)
    if cache_dir is None or identity is None:
        return text_encoder.encode(captions)
    # the profile says how text is read (its cut, e.g. the clip profile's context length), the weights by whom
    profile = getattr(getattr(text_encoder, "profile", None), "identity", lambda: None)()
    key = hashlib.sha256(json.dumps([backbone.name, identity, profile, captions]).encode()).hexdigest()[:16]
    path = Path(cache_dir) / f"reference-tokens-{key}.npz"
    if path.exists():
        with np.load(path) as z:
            rows, lengths = z["rows"], z["lengths"]
        return np.split(rows, np.cumsum(lengths)[:-1])
    log.info("encoding %d reference captions for confidence (once; cached in %s)", len(captions), path)
    tokens = text_encoder.encode(captions)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.npz")
    np.savez(tmp, rows=np.concatenate(tokens), lengths=np.array([len(t) for t in tokens]))
    os.replace(tmp, path)
    return tokens


class Calibrator:
    """Labels (query, video) scores high / medium / low against a fixed reference caption bank."""

    def __init__(self, model, reference_tokens: Sequence[np.ndarray],
                 cfg: ConfidenceConfig = ConfidenceConfig(), reference_id: str = "",
                 calibration: Calibration | None = None) -> None:
        self.model, self.cfg, self.calibration = model, cfg, calibration
        self.references = model.encode_queries(list(reference_tokens))  # what model.score takes
        self.reference_id = reference_id

    @classmethod
    def for_model(cls, model, text_encoder, cache_dir: str | Path | None = None,
                  cfg: ConfidenceConfig | None = None,
                  captions_path: Path = REFERENCE_CAPTIONS) -> Calibrator:
        """Build once per model: encode the reference captions (cached) with the model's text encoder.

        ``cfg``: the cuts to use; None: the model's calibration (``find_calibration`` in ``cache_dir``, then
        the shipped ones), else ``UNCALIBRATED``."""
        captions = load_reference_captions(captions_path)
        tokens = _cached_tokens(text_encoder, captions, Path(cache_dir) if cache_dir else None)
        digest = hashlib.sha256("\n".join(captions).encode()).hexdigest()[:16]
        calibration = None
        if cfg is None:
            calibration = find_calibration(model, [cache_dir] if cache_dir else [])
            if calibration is not None and calibration.source.get("reference_captions", digest) != digest:
                log.warning("confidence: %s was calibrated with other reference captions; not used",
                            calibration.path)
                calibration = None
            cfg = calibration.cfg if calibration is not None else UNCALIBRATED
            if calibration is None:
                log.info("confidence: %s", uncalibrated_reason(model))
        return cls(model, tokens, cfg, reference_id=digest, calibration=calibration)

    def describe(self) -> dict:
        """``/info``'s "confidence" entry (``describe_calibration``); cuts given in code are calibrated."""
        if self.calibration is None and self.cfg.calibrated:
            return describe_calibration(Calibration(self.cfg, model_identity(self.model),
                                                    {"given": "in code"}), self.model)
        return describe_calibration(self.calibration, self.model)

    def fingerprint(self) -> str:
        """Identifies model, reference bank and cuts."""
        model = self.model.fingerprint() if hasattr(self.model, "fingerprint") else type(self.model).__name__
        key = json.dumps([model, self.reference_id, asdict(self.cfg)])
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    @property
    def reference_queries(self) -> ReferenceQueries:
        """The encoded reference bank, for an index to store each video's scores on (its id names the
        captions; the index checks the model and profile itself)."""
        return ReferenceQueries(self.references, self.reference_id)

    def confidence(self) -> CalibratedConfidence:
        """The search-time rule with this calibrator's cuts."""
        return CalibratedConfidence(self.cfg)

    @staticmethod
    def label(score: float, null: VideoNull | None) -> str:
        """high / medium / low / none for one (query, video) score given that video's cuts (None: unknown,
        low)."""
        if null is None:
            return "low"  # never claim a strong match, or none, without the video's cuts
        if score > null.high:
            return "high"
        if score > null.medium:
            return "medium"
        return "none" if null.none is not None and score <= null.none else "low"

    @staticmethod
    def no_strong_match(labels: Sequence[str]) -> bool:
        """The response abstains ("no strong match") when no hit is labelled high."""
        return "high" not in labels


def words_label(hit: VideoEvidence) -> str | None:
    """What a hit's matched words say: "high" for a line exactly in the video covering the query
    (``STRONG_WORDS``), "medium" for any other matched line, None when no line matched."""
    if not hit.words:
        return None
    exact = any(m.source in EXACT_SOURCES and m.coverage >= STRONG_WORDS for m in hit.words)
    return "high" if exact else "medium"


def with_words(label: str, hit: VideoEvidence) -> str:
    """The better of a hit's label from its pictures and from its words (``words_label``)."""
    said = words_label(hit)
    return label if said is None or LABELS.index(label) <= LABELS.index(said) else said


def labels(scores: Sequence[float], nulls: Sequence[VideoNull | None]) -> list[str]:
    """One label per hit: ``scores[i]`` is the query's total on the video with cuts ``nulls[i]``."""
    if len(scores) != len(nulls):
        raise ValueError(f"{len(scores)} scores but {len(nulls)} video nulls")
    return [Calibrator.label(float(s), n) for s, n in zip(scores, nulls, strict=True)]


@dataclass(frozen=True)
class CalibratedConfidence:
    """The ``prvr.results.response.Confidence`` of this module: each hit's total against its video's cuts at
    the response's weights (from the reference scores in its evidence), raised by its matched words
    (``with_words``, also for a model without calibration: the words rule needs none); strong when some hit
    is high."""

    cfg: ConfidenceConfig = ConfidenceConfig()

    def assess(self, q: object, evidence: Evidence) -> Assessment:
        """Labels of every hit of one response (q is unused: the totals are in the evidence)."""
        hits = evidence.hits
        if not self.cfg.calibrated:
            got = tuple(with_words("low", h) for h in hits)
            return Assessment(got, not Calibrator.no_strong_match(got), calibrated=False)
        nulls = cuts_of([h.ref_clip for h in hits], [h.ref_frame for h in hits], evidence.weights, self.cfg)
        got = tuple(with_words(label, h) for label, h in zip(labels([h.total for h in hits], nulls), hits,
                                                              strict=True))
        return Assessment(got, not Calibrator.no_strong_match(got))


# ------------------------------------------------------------------------------------ per-model calibrations


def model_identity(model) -> dict:
    """What a calibration is valid for: the feature profile (name, version, widths, weights identity), the
    model's kind and settings; a trained model also by its weights (``fingerprint``). Training-free models are
    known by their recipe, not by the bytes of their derived tables, so one calibration serves every host."""
    from prvr.models.training_free import TrainingFreeModel

    cfg = getattr(model, "cfg", None)
    identity = {"profile": getattr(model, "profile", None),
                "model": model.describe()["name"] if hasattr(model, "describe") else type(model).__name__,
                "settings": cfg.to_dict() if hasattr(cfg, "to_dict") else None}
    if not isinstance(model, TrainingFreeModel):
        identity["weights"] = model.fingerprint()
    return identity


def calibration_key(identity: dict) -> str:
    """File-name key of a model identity."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Calibration:
    """One model's label cuts with what they were calibrated on (``source``) and what they measured."""

    cfg: ConfidenceConfig
    model: dict  # model_identity
    source: dict  # e.g. {"command", "data", "tuning", "checking", "off_topic", "date", "commit"}
    measured: dict = field(default_factory=dict)  # precision / recall / rates with intervals, per half
    path: str = ""  # where it was read from ("" for one made in memory)

    @property
    def key(self) -> str:
        """The file-name key of the model it is for."""
        return calibration_key(self.model)

    def to_dict(self) -> dict:
        """The JSON stored in a calibration file."""
        return {"format": CALIBRATION_FORMAT, "version": 1, "model": self.model, "key": self.key,
                "cuts": asdict(self.cfg), "source": self.source, "measured": self.measured}

    @classmethod
    def from_dict(cls, data: dict, path: str = "") -> Calibration:
        """Read ``to_dict``'s JSON; a malformed file raises ValueError naming it."""
        if not isinstance(data, dict) or data.get("format") != CALIBRATION_FORMAT:
            raise ValueError(f"{path or 'calibration'}: not a {CALIBRATION_FORMAT} file")
        try:
            cfg = ConfidenceConfig(**data["cuts"])
            return cls(cfg, data["model"], data["source"], data.get("measured", {}), path)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path or 'calibration'}: malformed calibration ({e})") from None

    def write(self, directory: str | Path) -> Path:
        """Write it as ``<directory>/<profile>-<key>.json`` atomically; returns the path."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        name = str((self.model.get("profile") or {}).get("name", "model"))
        path = directory / f"{name}-{self.key}.json"
        with tempfile.NamedTemporaryFile("w", dir=directory, suffix=".tmp", delete=False) as tmp:
            json.dump(self.to_dict(), tmp, indent=1)
            tmp.write("\n")
        os.replace(tmp.name, path)
        return path


def find_calibration(model, directories: Sequence[str | Path] = ()) -> Calibration | None:
    """The calibration of ``model`` in the first of ``directories`` that holds one, then among the shipped
    ones; None when there is none. Unreadable files are skipped with a warning."""
    identity = model_identity(model)
    key = calibration_key(identity)
    for directory in [*map(Path, directories), SHIPPED_CALIBRATIONS]:
        for path in sorted(directory.glob(f"*-{key}.json")) if directory.is_dir() else []:
            try:
                found = Calibration.from_dict(json.loads(path.read_text()), str(path))
            except (OSError, ValueError) as e:
                log.warning("confidence: skipping %s (%s)", path, e)
                continue
            if found.model == json.loads(json.dumps(identity)):
                return found
    return None


def uncalibrated_reason(model) -> str:
    """Why a model's labels are not calibrated, and how to calibrate it, in words."""
    profile = getattr(model, "profile", None) or {}
    weights = ", ".join(f"{k}={v}" for k, v in (profile.get("weights") or {}).items()) or "its weights"
    name = profile.get("name", "?")
    spec = " --weights clip=DIR_OR_HUB_ID" if name.startswith("clip") else ""
    return (f"no label calibration for this model (profile {name}, {weights}): its scores were never "
            "measured against right and wrong answers, so no result is called a strong match or no match; "
            "every result is unconfirmed. Calibrate it on the dev set: python -m benchmarks.calibrate "
            f"--profile {name}{spec}")


def describe_calibration(calibration: Calibration | None, model) -> dict:
    """``/info``'s "confidence": whether the labels are calibrated for the model in use, and on what."""
    if calibration is None:
        return {"calibrated": False, "reason": uncalibrated_reason(model)}
    where = Path(calibration.path).name if calibration.path else "given in code"
    return {"calibrated": True, "source": calibration.source, "file": where, "cuts": asdict(calibration.cfg),
            "measured": calibration.measured}


def summary_words(labels: Sequence[str], calibrated: bool) -> tuple[str, str]:
    """(kind, sentence) of the line above the results: kind "strong", "none" (every hit "no match"),
    "unconfirmed" (no strong match) or "uncalibrated"; the app renders them."""
    if not calibrated and "high" not in labels:  # (a strong match by words needs no calibration)
        return ("uncalibrated", "these are the closest videos, best first. The model in use has no label "
                "calibration, so nothing is called a strong match or no match; play their key moments to "
                "check.")
    if labels and all(label == "none" for label in labels):
        return ("none", "nothing like this seems to be here: every result scores no better on its video than "
                "everyday descriptions of other things do. Try other words, or add videos that show it.")
    if "high" not in labels:
        return ("unconfirmed", "these are the closest videos, best first, but the model cannot confirm the "
                "moment is in any of them. Play their key moments to check, or describe what is visible "
                "(objects, place, action) in other words.")
    counts = {c: sum(label == c for label in labels) for c in ("high", "medium")}
    found = [f"{n} {LABEL_WORDS[c]}{'es' if n > 1 else ''}" for c, n in counts.items() if n]
    return ("strong", " and ".join(found))
