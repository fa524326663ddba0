"""The upload path a user waits on, through the Predictor's public API: a real clip in, searchable out.

    python -m benchmarks.upload_path [--seconds 30 120] [--data-dir DIR] [--repeats 2] [--words off all]
                                     [--talk-seconds 60] [--clips FILE ...]

For each length a clip of real footage is made (``benchmarks.long_clip``: the shipped demo clips and, where
present, ``../shared/videos``, looped; 640x360, 25 fps H.264, playable as it is) and uploaded with
``Predictor.add_video`` into the shared gallery of a predictor started with ``prvr.serve.bootstrap.start`` on
one demo video; the time runs from the call until a search (``Predictor.search``) lists the upload. Each
repeat uploads other bytes (the clip starts at another source), so none is a duplicate.

Words (issue #43): each clip is uploaded once per ``--words`` mode, in turn, in the same run (the same bytes:
the upload is removed before the next mode adds it again), so ``all`` against ``off`` is what reading the
words adds to the wait. Besides the footage (no audio), real recorded speech: ``--clips`` files as they are
(default: ``../shared``'s NASA narration with its subtitle track, where present) and a ``--talk-seconds``
long copy of the first of them (its video, audio and subtitle packets looped, not re-encoded). Prints JSON:
per upload the seconds waited until it was searchable (``searchable_s``: by its pictures, its words
following where they take longer) and until its words joined (``words_joined_s``, polled as the page does:
``Predictor.upload_outcome``), the video's seconds and their ratio, the words read (segments, sources,
skipped, seconds) and the machine's load (the numbers move with it); ``words_added_s`` per clip: what the
words added to the wait until searchable and until they joined, against the video's own duration.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import torch

import extract  # noqa: F401  - the torchvision fix, before any backbone
from benchmarks.long_clip import REPO, make_long_clip, real_clips

SPEECH_CLIPS = (REPO.parent / "shared" / "videos_dev" / "torchcodec__nasa_13013.mp4",)  # narration + mov_text


def looped_copy(source: Path, out: Path, seconds: float) -> Path:
    """At least ``seconds`` of ``source``, played whole again and again: its first video, audio and subtitle
    streams' packets copied with their times shifted (no re-encoding: the same speech and lines, repeated)."""
    import av

    with av.open(str(source)) as src, av.open(str(out), "w") as dst:
        kinds = src.streams.video[:1] + src.streams.audio[:1] + src.streams.subtitles[:1]
        pairs = {s.index: dst.add_stream_from_template(s) for s in kinds}
        length = max(float(s.duration * s.time_base) for s in kinds[:2])  # the picture's and sound's
        last: dict[int, int] = {}
        for n in range(max(1, int(-(-seconds // length)))):
            src.seek(0)
            for packet in src.demux(kinds):
                index = packet.stream.index
                if packet.dts is None:
                    continue
                shift = int(round(n * length / packet.time_base))
                if packet.dts + shift <= last.get(index, -1 << 62):
                    continue  # an audio priming packet (negative time) overlapping the previous loop's end
                packet.pts, packet.dts = packet.pts + shift, packet.dts + shift
                last[index] = packet.dts
                packet.stream = pairs[index]
                dst.mux(packet)
    return out


def main() -> None:
    """Start a predictor, upload each clip, print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, nargs="+", default=[30.0, 120.0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--data-dir", type=Path, help="default: a new temporary folder")
    parser.add_argument("--words", nargs="+", default=["off", "all"],
                        help="the --words modes each clip is uploaded with, in turn (default: off all)")
    parser.add_argument("--clips", type=Path, nargs="*", default=[p for p in SPEECH_CLIPS if p.is_file()],
                        help="real files uploaded as they are (default: ../shared's NASA narration)")
    parser.add_argument("--talk-seconds", type=float, default=60.0,
                        help="a looped copy of the first --clips file this long (0: none)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from prvr.serve.bootstrap import start, words_reader
    from prvr.serve.settings import AppSettings

    work = Path(tempfile.mkdtemp(prefix="upload_path_"))
    sources = real_clips()
    clips = []
    for seconds in args.seconds:
        for r in range(args.repeats):
            order = sources[r:] + sources[:r]  # another first clip: other bytes
            clips.append(make_long_clip(work / f"upload {seconds:g}s {r}.mp4", seconds, order))
    clips += list(args.clips)
    if args.clips and args.talk_seconds > 0:
        clips.append(looped_copy(args.clips[0], work / f"talk {args.talk_seconds:g}s.mp4", args.talk_seconds))
    settings = AppSettings(data_dir=args.data_dir or work / "data", demo_videos="demo01", uploads="shared")
    t0 = time.perf_counter()
    predictor = start(settings)
    started = time.perf_counter() - t0
    readers = {mode: words_reader(dataclasses.replace(settings, words=mode)) for mode in args.words}
    rows, profile = [], predictor.describe()["profile"]["name"]
    try:
        for clip in clips:
            for mode, reader in readers.items():
                predictor.ingest.words = reader
                load = os.getloadavg()[0]
                t0 = time.perf_counter()
                outcome = predictor.add_video(clip, name=clip.name)
                added = time.perf_counter() - t0
                hits = predictor.search("a video", k=len(predictor.index)).results
                waited = time.perf_counter() - t0
                assert outcome["status"] == "added", outcome
                assert outcome["video_id"] in [h["video_id"] for h in hits]
                while ((outcome.get("words") or {}).get("state")) == "following":
                    time.sleep(0.1)
                    outcome = predictor.upload_outcome(outcome["video_id"]) or outcome
                joined = time.perf_counter() - t0
                seconds = predictor.index.record(outcome["video_id"])["duration"]
                predictor.ingest.remove([outcome["video_id"]])  # the next mode adds the same bytes again
                rows.append({"clip": clip.name, "words": mode, "video_s": round(seconds, 2),
                             "added_s": round(added, 2), "searchable_s": round(waited, 2),
                             "words_joined_s": round(joined, 2),
                             "video_s_per_s": round(seconds / waited, 2), "read": outcome.get("words"),
                             "load_avg_1min": round(load, 2)})
    finally:
        predictor.close()
    added = {}  # per clip: what reading the words added to the wait, against the video's own duration
    if "off" in args.words:
        off = {r["clip"]: r["searchable_s"] for r in rows if r["words"] == "off"}
        added = {r["clip"]: {"words": r["words"], "added_s": round(r["searchable_s"] - off[r["clip"]], 2),
                             "joined_added_s": round(r["words_joined_s"] - off[r["clip"]], 2),
                             "video_s": r["video_s"]} for r in rows if r["words"] != "off"}
    print(json.dumps({"cpu_cores": len(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads(),
                      "profile": profile, "start_s": round(started, 1),
                      "uploads": rows, "words_added_s": added}, indent=2))


if __name__ == "__main__":
    main()
