"""One video's words from every source: subtitle tracks and a sidecar file, speech, text on screen.

``WordsReader(config).read(video)`` runs the sources side by side in threads, one each: subtitles (cheap:
demuxing text packets), speech (pocketsphinx is sequential, one core; Whisper runs on the GPU or torch's
threads) and on-screen text (OCR with one onnxruntime thread). On 2 cores the two heavy ones then take a core
each; more threads would not help, each source being sequential inside. Every failure of one source (a
corrupt subtitle file, a video without audio, a model that does not load, a bug) becomes one ``skipped`` line
of the report and the other sources still count: ``read`` never raises for bad words input.

The speech recogniser and the OCR engine are loaded once per reader, at the first video that needs them
(or by ``prepare()``), and shared by later reads; each serves one video at a time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from extract.words.screen import OCR_MODEL, Ocr, ScreenSettings, package_version, screen_text
from extract.words.segment import SOURCES, WordSegment, WordsUnavailable
from extract.words.subtitles import by_time, find_sidecar, read_sidecar, subtitle_tracks

log = logging.getLogger(__name__)

MODES = ("off", "subtitles", "all")  # --words: none; subtitle tracks and sidecars only; every source
_SOURCES_BY_MODE = {"off": (), "subtitles": ("subtitles",), "all": SOURCES}
# a share of the progress bar per source, by what each costs: subtitles are read in a moment, speech in about
# the video's duration on one core, on-screen text in about half of it (ScreenSettings.share) plus decoding
_WEIGHTS = {"subtitles": 0.05, "speech": 1.0, "screen": 0.7}
# what describe() says reads subtitles
SUBTITLES_READER = f"PyAV {package_version('av')} (tracks), pysubs2 {package_version('pysubs2')} (sidecars)"


@dataclass
class WordsConfig:
    """Which words are read and with what: ``mode`` "off" | "subtitles" | "all"; ``speech``: the speech
    weights (``extract.words.speech.load_speech``'s: None = its default, "pocketsphinx", a directory or hub
    id); ``device``: where speech runs (None: its choice); ``screen``: how on-screen text is read;
    ``load_speech``: what loads the recogniser from (speech, device) (None: ``load_speech``; the app's
    ZeroGPU loader, ``prvr.serve.zerogpu_speech.load_in_slots``, runs Whisper in GPU slots)."""

    mode: str = "all"
    speech: str | None = None
    device: str | None = None
    screen: ScreenSettings = field(default_factory=ScreenSettings)
    load_speech: Callable[[str | None, str | None], object] | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"words mode {self.mode!r}: expected one of {', '.join(MODES)}")

    @property
    def sources(self) -> tuple[str, ...]:
        """The sources this mode reads, in SOURCES order."""
        return _SOURCES_BY_MODE[self.mode]


@dataclass(frozen=True)
class WordsReport:
    """What reading one video's words gave: its segments (by time), one line per thing skipped and why,
    the sources that were read (a source can be read and give no words), and one line per thing spent
    beyond this process's CPU (``notes``: "its speech asked ZeroGPU for 14 GPU seconds (1 slot ...)")."""

    segments: tuple[WordSegment, ...] = ()
    skipped: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        """JSON-able: segments as dicts, skipped, sources and notes as lists."""
        return {"segments": [s.to_dict() for s in self.segments], "skipped": list(self.skipped),
                "sources": list(self.sources), "notes": list(self.notes)}


_Outcome = tuple[list[WordSegment], list[str], bool]  # a source's segments, skipped lines, whether read


class _Cancelled(Exception):
    """The caller's progress callback raised: the sources stop at their next progress step."""


class WordsReader:
    """Reads the words of videos with one configuration; models loaded once, at first use."""

    def __init__(self, config: WordsConfig | None = None) -> None:
        self.config = config or WordsConfig()
        self._lock = threading.Lock()  # guards loading
        self._speech_lock = threading.Lock()  # one transcription at a time
        self._recognizer = None  # extract.words.speech.SpeechRecognizer, once loaded
        self._speech_failure = ""  # why the recogniser did not load (said for every video, loaded once)
        self._ocr: Ocr | None = None
        self._ocr_failure = ""

    def describe(self) -> dict:
        """For /info: the mode, the sources it reads and the models that read them."""
        models = {}
        sources = self.config.sources
        if "subtitles" in sources:
            models["subtitles"] = SUBTITLES_READER
        if "speech" in sources:
            if self._recognizer is not None:
                models["speech"] = f"{self._recognizer.name}: {self._recognizer.model}"
            elif self._speech_failure:
                models["speech"] = f"unavailable: {self._speech_failure}"
            else:
                models["speech"] = f"{self.config.speech or 'default'} (loaded with the first video)"
        if "screen" in sources:
            models["screen"] = OCR_MODEL if not self._ocr_failure else f"unavailable: {self._ocr_failure}"
        return {"mode": self.config.mode, "sources": list(sources), "models": models}

    def recognizer(self) -> object | None:
        """The speech recogniser once loaded (``extract.words.speech.SpeechRecognizer``), else None."""
        return self._recognizer

    def prepare(self) -> None:
        """Load the models the mode needs now rather than with the first video (failures are remembered and
        reported with each video, as when loaded there)."""
        if "speech" in self.config.sources:
            try:
                self._speech()
            except WordsUnavailable:
                pass
        if "screen" in self.config.sources:
            try:
                self._screen_ocr()
            except WordsUnavailable:
                pass

    def read(self, video_path: str | Path, sidecar: str | Path | None = None,
             progress: Callable[[float], None] | None = None) -> WordsReport:
        """The words of one video from every source of the mode, in parallel; ``sidecar``: a subtitle file
        given with the video (else one beside it with its stem is used). Never raises for bad words input."""
        sources = self.config.sources
        if not sources:
            return WordsReport()
        path = Path(video_path)
        fractions = {source: 0.0 for source in sources}
        cancelled = threading.Event()

        def step(source: str) -> Callable[[float], None]:
            """The progress hook handed to one source."""
            def hook(fraction: float) -> None:
                if cancelled.is_set():
                    raise _Cancelled
                fractions[source] = min(1.0, max(fractions[source], float(fraction)))
            return hook

        notes: list[str] = []  # what the sources spent beyond this process (the speech recogniser's)
        work = {"subtitles": lambda: self._subtitles(path, sidecar),
                "speech": lambda: self._read_speech(path, step("speech"), notes),
                "screen": lambda: self._read_screen(path, step("screen"))}
        results: dict[str, _Outcome] = {}
        pool = ThreadPoolExecutor(max_workers=len(sources), thread_name_prefix="words")
        try:
            futures = {pool.submit(self._guarded, source, work[source], path.name): source
                       for source in sources}
            shown, pending = -1.0, set(futures)
            while pending:
                done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
                for future in done:
                    results[futures[future]] = future.result()
                    fractions[futures[future]] = 1.0
                total = sum(_WEIGHTS[s] * fractions[s] for s in sources) / sum(_WEIGHTS[s] for s in sources)
                if progress is not None and total > shown:
                    shown = total
                    try:
                        progress(total)
                    except BaseException:
                        cancelled.set()
                        raise
        finally:
            pool.shutdown(wait=not cancelled.is_set(), cancel_futures=True)
        segments = [seg for source in sources for seg in results[source][0]]
        skipped = [line for source in sources for line in results[source][1]]
        read = tuple(source for source in sources if results[source][2])
        in_order = sorted(_within(segments, path),
                          key=lambda s: (s.start, s.end, SOURCES.index(s.source), s.text))
        return WordsReport(tuple(in_order), tuple(skipped), read, tuple(notes))

    def _guarded(self, source: str, run: Callable[[], _Outcome], name: str) -> _Outcome:
        """Run one source; its failure becomes a skipped line (a bug's traceback goes to the log)."""
        from extract.decode import MediaError

        started = time.perf_counter()
        try:
            segments, skipped, read = run()
        except _Cancelled:
            return [], [], False
        except WordsUnavailable as e:
            segments, skipped, read = [], [f"{source}: {_one_line(e)}"], False
        except MediaError as e:
            segments, skipped, read = [], [f"{source}: {_one_line(e.reason)}"], False
        except Exception as e:  # a bug or an environment fault: the video is still indexed by its pictures
            log.warning("words: %s failed", source, exc_info=True)
            segments, skipped, read = [], [f"{source}: failed ({type(e).__name__}: {_one_line(e)})"], False
        log.info("words: %s of %s: %d segments in %.1f s%s", source, name, len(segments),
                 time.perf_counter() - started, f" ({'; '.join(skipped)})" if skipped else "")
        return segments, skipped, read

    def _subtitles(self, path: Path, sidecar: str | Path | None) -> _Outcome:
        """Subtitle tracks and the sidecar file: read when either could be read."""
        segments: list[WordSegment] = []
        skipped: list[str] = []
        read = False
        try:
            segments += subtitle_tracks(path, on_skip=lambda line: skipped.append(f"subtitles: {line}"))
            read = True
        except WordsUnavailable as e:
            skipped.append(f"subtitles: {_one_line(e)}")
        side = Path(sidecar) if sidecar is not None else find_sidecar(path)
        if side is not None:
            try:
                segments += read_sidecar(side)
                read = True
            except WordsUnavailable as e:
                skipped.append(f"subtitles: {_one_line(e)}")
        return by_time(segments), skipped, read

    def _speech(self):  # -> extract.words.speech.SpeechRecognizer
        """The speech recogniser, loaded at the first call; WordsUnavailable when it cannot be."""
        with self._lock:
            if self._recognizer is None and not self._speech_failure:
                try:
                    from extract.words.speech import load_speech  # lazily: torch / pocketsphinx are heavy

                    load = self.config.load_speech or load_speech
                    self._recognizer = load(self.config.speech, self.config.device)
                except ImportError as e:
                    self._speech_failure = f"speech recognition is not installed ({_one_line(e)})"
                except Exception as e:  # weights that do not load: said with every video, tried once
                    self._speech_failure = f"the speech model cannot be loaded ({_one_line(e)})"
                    log.warning("words: speech model %s not loaded", self.config.speech or "default",
                                exc_info=True)
            if self._speech_failure:
                raise WordsUnavailable(self._speech_failure)
            return self._recognizer

    def _read_speech(self, path: Path, hook: Callable[[float], None], notes: list[str]) -> _Outcome:
        """Speech: the audio decoded on the CPU, then transcribed (one video at a time per reader); the model
        is loaded only once there is audio to hear. What the transcription spent beyond this process (GPU
        seconds) goes to ``notes``."""
        try:
            from extract.words.speech import decode_audio
        except ImportError:
            self._speech()  # says why, once
            raise
        audio = decode_audio(path, 16000)
        hook(0.05)
        if audio is None:
            return [], ["speech: the file has no audio"], False
        recognizer = self._speech()
        with self._speech_lock:
            try:
                segments = recognizer.transcribe(audio, 16000, lambda f: hook(0.05 + 0.95 * f))
            finally:  # (a slot that ran and then failed spent its seconds too)
                if spent := recognizer.spent():
                    notes.append(spent)
        return list(segments), [], True

    def _screen_ocr(self) -> Ocr:
        """The OCR engine, loaded at the first call; WordsUnavailable when it cannot be."""
        with self._lock:
            if self._ocr is None and not self._ocr_failure:
                try:
                    self._ocr = Ocr(self.config.screen.threads)
                except WordsUnavailable as e:
                    self._ocr_failure = _one_line(e)
                except Exception as e:
                    self._ocr_failure = f"the OCR model cannot be loaded ({_one_line(e)})"
                    log.warning("words: OCR not loaded", exc_info=True)
            if self._ocr_failure:
                raise WordsUnavailable(self._ocr_failure)
            return self._ocr

    def _read_screen(self, path: Path, hook: Callable[[float], None]) -> _Outcome:
        """On-screen text with the shared OCR engine."""
        return screen_text(path, self.config.screen, self._screen_ocr(), hook), [], True


def _within(segments: list[WordSegment], path: Path) -> list[WordSegment]:
    """Segments cut to the video's duration: a subtitle line may outlast the pictures; one that starts after
    them is dropped (no moment to show)."""
    from extract.decode import MediaError, probe

    try:
        duration = probe(path).duration
    except MediaError:
        return segments  # the pictures' own reading reports this file
    kept = []
    for seg in segments:
        if seg.start < duration:
            kept.append(seg if seg.end <= duration else
                        WordSegment(seg.source, seg.start, round(duration, 3), seg.text, seg.score))
    return kept


def _one_line(error: Exception | str) -> str:
    """An error as one line of a report."""
    text = str(error).strip() or type(error).__name__
    return " ".join(text.split())[:300]
