"""Command line: extract video and caption features, export them to the official layout.

    python -m extract videos PATHS... --profile lite --out feats.h5 [--weights [NAME=]SPEC] [--device cuda]
    python -m extract captions CAPTIONS.txt --profile lite --out feats.h5
    python -m extract export feats.h5 --captions train=train.txt --captions test=test.txt \\
        --out data/ --collection mine --feature-name lite

``videos`` is resumable: videos whose bytes (sha256) are already in the file are skipped; a file written
with another profile is refused. Unusable media are listed at the end and make the exit status 1.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import extract  # noqa: F401  - applies the torchvision fix before any backbone import
from extract.decode import DecodeLimits, MediaError, find_videos, sha256_file
from extract.features import FeatureWriter, export_official
from extract.official import read_captions
from extract.profiles import ProfileMismatch, get_profile, list_profiles
from extract.weights import WeightsUnavailable

log = logging.getLogger("extract")


def weights_arg(args: argparse.Namespace) -> str | dict[str, str] | None:
    """The --weights flags parsed (``extract.pipeline.parse_weights``); bad ones exit with the reason."""
    from extract.pipeline import parse_weights

    try:
        return parse_weights(args.weights)
    except ValueError as e:
        raise SystemExit(str(e)) from None


def video_ids(paths: list[Path]) -> dict[Path, str]:
    """Video id = file name without extension; two files with one id are refused, naming both."""
    ids: dict[str, Path] = {}
    for p in paths:
        if p.stem in ids:
            raise SystemExit(f"two videos would get the id {p.stem!r}: {ids[p.stem]} and {p}; rename one")
        ids[p.stem] = p
    return {p: i for i, p in ids.items()}


def cmd_videos(args: argparse.Namespace) -> int:
    """Extract the videos found in PATHS into --out."""
    from tqdm import tqdm

    from extract.pipeline import VideoExtractor, resolve_profile, weights_for

    paths = find_videos(args.paths)
    if not paths:
        raise SystemExit(f"no video files in {' '.join(map(str, args.paths))}")
    ids = video_ids(paths)
    limits = DecodeLimits(max_duration_s=args.max_minutes * 60)
    profile, weights = get_profile(args.profile), weights_arg(args)
    failed: list[tuple[Path, str]] = []
    done = skipped = 0
    expected = resolve_profile(profile, weights_for(profile, weights, profile.visual))
    with FeatureWriter(args.out, expected) as writer:  # checked before any model loads: mismatches fail fast
        extractor = VideoExtractor(profile, weights, args.device, args.batch_frames, limits)
        for path in (bar := tqdm(paths, unit="video", dynamic_ncols=True)):
            bar.set_postfix_str(path.name[-40:])
            try:
                sha = sha256_file(path) if path.is_file() else ""
                if sha and writer.has_sha256(sha):
                    skipped += 1
                    continue
                writer.add_video(ids[path], extractor.extract(path, sha256=sha or None))
                done += 1
            except MediaError as e:
                failed.append((path, e.reason))
                log.debug("failed: %s", e)
    print(f"{done} extracted, {skipped} already in {args.out}, {len(failed)} failed")
    for path, message in failed:
        print(f"  FAILED {path}: {message}")
    return 1 if failed else 0


def cmd_captions(args: argparse.Namespace) -> int:
    """Encode an official caption file (``<cap_id> <text>`` lines) into --out."""
    from extract.pipeline import TextEncoder, resolve_profile, weights_for

    captions = read_captions(args.captions)
    profile, weights = get_profile(args.profile), weights_arg(args)
    expected = resolve_profile(profile, weights_for(profile, weights, (profile.text,)))
    with FeatureWriter(args.out, expected) as writer:
        encoder = TextEncoder(profile, weights, args.device)
        done = set(writer.caption_ids())
        todo = [c for c in captions if c.cap_id not in done]
        for lo in range(0, len(todo), 256):
            chunk = todo[lo : lo + 256]
            for c, tokens in zip(chunk, encoder.encode([c.text for c in chunk]), strict=True):
                writer.add_caption(c.cap_id, c.text, tokens, c.video_id)
    print(f"{len(todo)} captions encoded, {len(captions) - len(todo)} already in {args.out}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Write the official BigFile/HDF5/caption layout from a feature file."""
    splits = dict(item.partition("=")[::2] if "=" in item else ("train", item) for item in args.captions)
    root = export_official(args.features, splits, args.out, args.collection, args.feature_name)
    print(f"wrote {root}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser with the three subcommands."""
    parser = argparse.ArgumentParser(prog="python -m extract", description=__doc__.split("\n\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, helptext in (("videos", "video files or folders"), ("captions", "captions file")):
        p = sub.add_parser(name, help=f"extract features of {helptext}")
        if name == "videos":
            p.add_argument("paths", nargs="+", type=Path, help="video files and/or folders (recursive)")
            p.add_argument("--max-minutes", type=float, default=240.0, help="refuse longer videos")
            p.add_argument("--batch-frames", type=int, default=32, help="frames per inference batch")
        else:
            p.add_argument("captions", type=Path, help="official caption file: '<cap_id> <text>' per line")
        p.add_argument("--profile", default="lite", help=f"feature profile: {', '.join(list_profiles())} "
                                                         "or a profile .json file")
        p.add_argument("--out", type=Path, required=True, help="feature file (.h5), created or appended to")
        p.add_argument("--weights", action="append", default=[],
                       help="weights: a file, local-dir:PATH, hf-hub:NAME...; BACKBONE=SPEC for one backbone "
                            "(clip=DIR: a CLIP/SigLIP model folder holding both towers)")
        p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda when available)")
        p.set_defaults(run=cmd_videos if name == "videos" else cmd_captions)
    p = sub.add_parser("export", help="write the official MS-SL layout (BigFile + HDF5 + captions)")
    p.add_argument("features", type=Path, help="feature file written by `videos` and `captions`")
    p.add_argument("--captions", action="append", required=True, help="[SPLIT=]caption file (split: train)")
    p.add_argument("--out", type=Path, required=True, help="root folder; writes OUT/COLLECTION/...")
    p.add_argument("--collection", required=True)
    p.add_argument("--feature-name", required=True, help="FeatureData/<name> (the official --visual_feature)")
    p.set_defaults(run=cmd_export)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        if getattr(args, "profile", None):
            get_profile(args.profile)  # unknown names fail here, before any model loads
        return args.run(args)
    except (KeyError, ProfileMismatch, WeightsUnavailable, FileNotFoundError) as e:
        print(f"error: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
