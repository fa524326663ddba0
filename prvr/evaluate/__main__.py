"""``python -m prvr.evaluate``: the official retrieval protocol on a checkpoint, or the app's search path on
an annotated set (prints a table, or JSON with ``--json``)::

    python -m prvr.evaluate --checkpoint CKPT --data ROOT --collection NAME --feature FEATURE --split test
    python -m prvr.evaluate --checkpoint CKPT --features V.h5 --captions C.h5 [--splits test=test.txt]
    python -m prvr.evaluate --gallery demo [--root DIR] [--json]     # the default model on the demo gallery
    python -m prvr.evaluate --gallery words [--root DIR] [--weights speech=DIR_OR_HUB_ID] [--json]
    (prvr.evaluate.words: the words dev set, with and without words, both halves)
    python -m prvr.evaluate --videos DIR --moments FILE.json [--words off|subtitles|all] [--json]
    (any annotated folder; --words: also the same videos with their words, a ``words`` row)
    python -m prvr.evaluate --videos DIR --moments FILE.json --profile clip --weights clip=DIR_OR_HUB_ID
    (prvr.evaluate.annotated)

The last ones evaluate the model ``prvr.models.factory.create_model`` makes: ``--checkpoint``'s, or a
training-free model (``--profile``: ``lite``, ``clip`` or ``clip_whole`` with ``--weights clip=...``: any
CLIP-family model from a folder or the hub; none: the app's automatic choice, clip where its weights load,
else lite), with
``prvr.evaluate.annotated``: first-relevant-video R@1/5/10, SumR, and the localisation of the key moment,
MS-SL's raw key clip and a random window on that video (IoU >= 0.3/0.5/0.7, mean IoU, centre inside).
``--videos/--moments`` reports every number with a 95 % bootstrap interval (seeded; per clip when the moments
file names each query's ``clip``, else per query): printed under it in the table, and in the JSON as ``ci``
(``{value, low, high}`` under the same keys as ``metrics`` and ``localisation``, which are unchanged).
Paired differences between two runs' per-query arrays: ``python -m prvr.evaluate.bootstrap A.json B.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from extract.pipeline import parse_weights
from prvr.data.official import add_source_args, check_compatible, prepare_split, source_from_args
from prvr.evaluate.annotated import evaluate_set, format_report, load_moments_file
from prvr.evaluate.demo import evaluate_demo
from prvr.evaluate.retrieval import evaluate_split, format_table
from prvr.models.checkpoint import load_checkpoint
from prvr.models.factory import create_model
from prvr.plural import counted


def evaluate_folder(videos: Path, moments: Path, checkpoint: str | None, device: str, as_json: bool,
                    profile: str | None = None, weights: dict[str, str] | None = None,
                    words: str = "off") -> dict:
    """``--videos DIR --moments FILE``: the annotated folder's report (printed as JSON or a table), of the
    model factory's model for the choice (no profile and no checkpoint: the app's automatic choice);
    ``words`` other than "off": each video's words read as an upload's are (``extract.words.reader``, the
    ``--gallery words`` cache), and a ``words`` row beside the pictures-only rows."""
    t0 = time.perf_counter()
    loaded = create_model(profile, weights, checkpoint, device)
    model = loaded.model
    aset = load_moments_file(videos, moments, profile=loaded.profile)  # features of that very profile
    read, timings = None, {}
    if words != "off":
        from extract.words.reader import WordsConfig, WordsReader
        from prvr.evaluate.words import read_words, words_cache_name  # the words readers load only here

        reader = WordsReader(WordsConfig(mode=words, device=device))
        reader.prepare()  # its models loaded: describe() names them (the words cache's key)
        t1 = time.perf_counter()
        entries = read_words(aset.videos, reader, Path(videos) / words_cache_name(reader))
        timings = {"words_s": time.perf_counter() - t1,
                   "words_read_s": sum(e["seconds"] for e in entries.values())}  # cached or not
        read = {vid: e["segments"] for vid, e in entries.items()}
    got = evaluate_set(aset, model, words=read, text_encoder=loaded.text_encoder().encode if read else None)
    if read is not None:
        got["words"] = {"mode": words, "reader": reader.describe(), **got["words"],
                        "timings": {**timings, "total_s": time.perf_counter() - t0}}
    report = {"videos_dir": str(videos), "moments": str(moments), "profile": loaded.profile.name,
              "model": model.describe() if hasattr(model, "describe") else {"checkpoint": str(checkpoint)},
              **got}
    print(json.dumps(report, indent=1) if as_json else format_report(report))
    return report


def evaluate_words_cli(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """``--gallery words``: the words dev set's report (printed as JSON or a table)."""
    from prvr.evaluate.words import evaluate_words, format_words_report  # the words readers load only here

    speech = [w.partition("=")[2] for w in args.weights if w.startswith("speech=")]
    if len(speech) > 1 or (speech and not speech[0]):
        parser.error("--weights speech=DIR_OR_HUB_ID: give one Whisper model (or speech=pocketsphinx)")
    try:
        weights = parse_weights([w for w in args.weights if not w.startswith("speech=")]) or {}
    except ValueError as e:
        parser.error(str(e))
    if isinstance(weights, str):
        parser.error(f"--weights {weights}: write it as NAME=SPEC, e.g. speech={weights} or clip={weights}")
    weights = {**weights, **({"speech": speech[0]} if speech else {})}
    try:
        report = evaluate_words(args.root, args.shared, weights, args.words, args.device, args.profile)
    except FileNotFoundError as e:
        parser.exit(1, f"{e}\n")
    print(json.dumps(report, indent=1) if args.json else format_words_report(report))
    return report


def main(argv: list[str] | None = None) -> dict:
    """CLI entry point; returns the results dict."""
    parser = argparse.ArgumentParser(description="Evaluate an MS-SL checkpoint (official protocol).")
    parser.add_argument("--checkpoint", help="our checkpoint dir or an official model.ckpt")
    parser.add_argument("--gallery", choices=("demo", "words"), help="instead: evaluate the embedded default "
                        "model on the demo gallery, or the words dev set (prvr.evaluate.words_set) with and "
                        "without its words")
    parser.add_argument("--root", type=Path, default=None,
                        help="with --gallery demo or words: its data directory")
    parser.add_argument("--shared", type=Path, default=None, help="with --gallery words: the shared clips "
                        "it is built from (default ../shared next to the repository)")
    parser.add_argument("--words", choices=("all", "subtitles", "off"), default=None,
                        help="the words sources read: with --gallery words (default all), with --videos "
                        "(default off: the pictures evaluation; all or subtitles adds a words row)")
    parser.add_argument("--demo-videos", nargs="+", default=None, help="with --gallery demo: only these ids")
    parser.add_argument("--videos", type=Path, help="instead: a folder of videos annotated by --moments")
    parser.add_argument("--moments", type=Path,
                        help="the moments file of --videos (format: prvr.evaluate.annotated)")
    parser.add_argument("--profile", help="with --videos: the training-free model's feature profile (lite, "
                        "clip or clip_whole with --weights clip=...; default: the app's choice, clip where "
                        "its weights load, else lite)")
    parser.add_argument("--weights", action="append", default=[], metavar="BACKBONE=SPEC",
                        help="with --videos: weights of the profile's backbones, e.g. clip=/models/clip-b32 "
                        "or clip=hf-hub:laion/CLIP-ViT-B-32-laion2B-s34B-b79K (repeatable); with --gallery "
                        "words also speech=DIR_OR_HUB_ID (a Whisper model) or speech=pocketsphinx")
    add_source_args(parser)
    parser.add_argument("--split", default=None, help="split to evaluate (default: test; 'all' for "
                        "--features/--captions without --splits)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if args.gallery == "words":
        args.words = args.words or "all"
        return evaluate_words_cli(parser, args)
    if args.gallery == "demo":
        report = evaluate_demo(args.root, video_ids=args.demo_videos)
        gallery = report["gallery"]
        print(json.dumps(report, indent=1) if args.json else
              report["protocol"] + "\n" + format_report({"videos": gallery["videos"],
                                                         "queries": gallery["captions"], **report}))
        return report
    if args.videos or args.moments:
        if not (args.videos and args.moments):
            parser.error("--videos and --moments go together")
        try:
            weights = parse_weights(args.weights)
        except ValueError as e:
            parser.error(str(e))
        if isinstance(weights, str):
            parser.error(f"--weights {weights}: write it as BACKBONE=SPEC, e.g. clip={weights}")
        return evaluate_folder(args.videos, args.moments, args.checkpoint, args.device, args.json,
                               args.profile, weights, args.words or "off")
    if not args.checkpoint:
        parser.error("--checkpoint is required (or --gallery demo, or --videos DIR --moments FILE)")
    source = source_from_args(parser, args)
    split_name = args.split or ("all" if args.features and not args.splits else "test")
    model = load_checkpoint(args.checkpoint, map_location=args.device)
    check_compatible(model.cfg.visual_dim, model.cfg.query_dim, model.profile, source,
                     f"checkpoint {args.checkpoint}")
    split = prepare_split(source, split_name, model.cfg.map_size, model.cfg.max_ctx_l, model.cfg.max_desc_l)
    results = evaluate_split(model, split)
    if args.json:
        print(json.dumps({"split": split_name, "videos": len(split.video_ids), "queries": len(split.captions),
                          "checkpoint": str(args.checkpoint), "metrics": results}, indent=1))
    else:
        print(f"{split_name}: {counted(len(split.captions), 'query', 'queries')}, "
              f"{counted(len(split.video_ids), 'video')}")
        print(format_table(results))
    return results


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    main()
