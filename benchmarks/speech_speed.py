"""Speech recognition on real recorded speech: compute per second of audio and word error rate against the
clip's own subtitle track.

    python -m benchmarks.speech_speed [FILE ...] [--weights pocketsphinx|DIR|HUB_ID] [--device cpu]

FILE (default: ../shared/videos_dev/torchcodec__nasa_13013.mp4, a narration with an English mov_text track of
the same words) must carry a text subtitle track; its cues that end within the audio are the reference.
Prints one JSON line per file: CPU seconds and wall seconds per second of audio (CPU time of this process,
all threads), word error rate, the reference and what was heard (lower case, punctuation dropped).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

from extract.words.audio import RATE, decode_audio
from extract.words.speech import load_speech
from extract.words.subtitles import subtitle_tracks

NASA = Path(__file__).resolve().parents[2] / "shared" / "videos_dev" / "torchcodec__nasa_13013.mp4"


def words_of(text: str) -> list[str]:
    """Lower-case words of ``text`` for comparison (a speaker tag such as "NAR:" and punctuation dropped)."""
    text = re.sub(r"^\s*[A-Z]{2,}:\s*", "", text).lower().replace("’", "'")
    return re.sub(r"[^a-z0-9' ]", " ", text).split()


def word_error_rate(reference: list[str], heard: list[str]) -> float:
    """(substitutions + deletions + insertions) / reference words: Levenshtein distance over words."""
    row = list(range(len(heard) + 1))
    for i, ref in enumerate(reference, 1):
        diagonal, row[0] = row[0], i
        for j, word in enumerate(heard, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (ref != word))
    return row[-1] / max(len(reference), 1)


def measure(path: Path, weights: str | None, device: str | None) -> dict:
    """One file: the recogniser's cost and word error rate against its subtitle cues."""
    audio = decode_audio(path)
    seconds = len(audio) / RATE
    cues = [c for c in subtitle_tracks(path) if c.end <= seconds + 0.5]  # cues the audio holds whole
    end = cues[-1].end
    recognizer = load_speech(weights, device)
    cpu, wall = time.process_time(), time.perf_counter()
    lines = recognizer.transcribe(audio)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    reference = [w for c in cues for w in words_of(c.text)]
    heard = [w for s in lines if s.start < end for w in words_of(s.text)]
    return {"file": path.name, "model": recognizer.model, "audio_s": round(seconds, 2),
            "cpu_s_per_audio_s": round(cpu / seconds, 3), "wall_s_per_audio_s": round(wall / seconds, 3),
            "wer": round(word_error_rate(reference, heard), 3), "reference_words": len(reference),
            "reference": " ".join(reference), "heard": " ".join(heard),
            "lines": [[s.start, s.end, round(s.score, 2), s.text] for s in lines]}


def main(argv: list[str] | None = None) -> None:
    """Measure each file and print its JSON line."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.speech_speed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path, default=[NASA])
    parser.add_argument("--weights", default="pocketsphinx")
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    for path in args.files:
        print(json.dumps(measure(path, args.weights, args.device)))


if __name__ == "__main__":
    main()
