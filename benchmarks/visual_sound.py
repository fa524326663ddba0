"""The visual dev set (``benchmarks.dev_set``) as if its videos kept their clips' sound: does speech on
ordinary video (no subtitles, nothing said about the query) move the pictures' answers?

The dev set's composites are written without audio (``benchmarks.real_set.write_mp4``), so
``python -m prvr.evaluate --videos DIR --moments DIR/tune.json --words all`` reads only their on-screen text.
31 of its 58 source clips carry sound (music, chatter, narration; one an English subtitle track). Here each
video's words are what the app reads from the video itself (``prvr.evaluate.words.read_words``, the same
cache as ``--words all``) plus its clips' subtitle tracks and speech (``extract.words``: pocketsphinx, or
``--speech``'s Whisper), moved to where each clip plays in it (``split.json``'s spans) and cut at the clip's
end; both halves are then evaluated with and without words in one run (``evaluate_set``'s ``words`` row).

    python -m benchmarks.visual_sound [--videos DIR] [--halves tune check] [--speech WEIGHTS] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.dev_set import DEFAULT_CLIPS, DEFAULT_DEV_CLIPS, DEFAULT_OUT, load_clips
from extract.decode import sha256_file
from extract.words.reader import WordsConfig, WordsReader
from extract.words.segment import WordSegment
from extract.words.speech import decode_audio, load_speech
from extract.words.subtitles import subtitle_tracks
from prvr.evaluate.annotated import evaluate_set, format_report, load_moments_file
from prvr.evaluate.words import read_words, words_cache_name
from prvr.models.factory import create_model

log = logging.getLogger(__name__)


def clip_sound(paths: dict[str, Path], speech: str | None, cache: Path) -> dict[str, list[WordSegment]]:
    """Clip key -> its subtitle tracks' and speech's segments (clip seconds), cached per file content and
    recogniser in ``cache``."""
    recognizer = load_speech(speech)
    stored = json.loads(cache.read_text()) if cache.is_file() else {}
    out = {}
    for key, path in paths.items():
        entry = f"{path.name}:{sha256_file(path)}:{recognizer.name}:{recognizer.model}"
        if entry not in stored:
            t0 = time.perf_counter()
            segments = list(subtitle_tracks(path))
            audio = decode_audio(path)
            if audio is not None:
                segments += recognizer.transcribe(audio)
            stored[entry] = [s.to_dict() for s in segments]
            log.info("sound of %s: %d segments in %.1f s", path.name, len(segments), time.perf_counter() - t0)
            cache.write_text(json.dumps(stored, indent=1))
        out[key] = [WordSegment(**s) for s in stored[entry]]
    return out


def placed(split: dict, sound: dict[str, list[WordSegment]]) -> dict[str, list[WordSegment]]:
    """Video -> its clips' segments at the seconds each clip plays in it (cut at the clip's end)."""
    out: dict[str, list[WordSegment]] = {}
    for name, video in split["videos"].items():
        for key, (start, end) in video["spans"].items():
            for s in sound.get(key, []):
                if start + s.start < end:
                    out.setdefault(name, []).append(replace(s, start=start + s.start,
                                                            end=min(end, start + s.end)))
    return out


def main(argv: list[str] | None = None) -> dict:
    """CLI: both halves' reports, with the words read from the videos plus their clips' sound."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--videos", type=Path, default=DEFAULT_OUT,
                        help=f"the dev set (default {DEFAULT_OUT})")
    parser.add_argument("--halves", nargs="+", default=["tune", "check"], choices=("tune", "check"))
    parser.add_argument("--speech", default="pocketsphinx",
                        help="load_speech's weights (default pocketsphinx)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    split = json.loads((args.videos / "split.json").read_text())
    clips, missing = load_clips(DEFAULT_DEV_CLIPS, DEFAULT_CLIPS)
    if missing:
        parser.exit(0, f"clips not found ({', '.join(missing)}): nothing to measure\n")
    digest = hashlib.sha256(args.speech.encode()).hexdigest()[:8]
    sound = clip_sound({c.key: c.path for c in clips}, args.speech,
                       args.videos / f".prvr-clip-sound-{digest}.json")
    reader = WordsReader(WordsConfig(mode="all"))
    reader.prepare()
    loaded = create_model(None, None, None, "cpu")
    report = {"videos_dir": str(args.videos), "reader": reader.describe(), "speech": args.speech}
    for half in args.halves:
        aset = load_moments_file(args.videos, args.videos / f"{half}.json", profile=loaded.profile)
        own = read_words(aset.videos, reader, args.videos / words_cache_name(reader))
        sounds = placed(split, sound)
        words = {vid: [*own[vid]["segments"], *sounds.get(vid, [])] for vid, _ in aset.videos}
        report[half] = evaluate_set(aset, loaded.model, words=words,
                                    text_encoder=loaded.text_encoder().encode)
        if not args.json:
            print(f"== {half}\n{format_report(report[half])}", flush=True)
    report["seconds"] = time.perf_counter() - t0
    if args.json:
        print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    main()
