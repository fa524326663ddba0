"""``python -m prvr.demo [--root DIR] [--videos ID ...]``: build (or reuse) the demo gallery and list it."""

import argparse
import logging
from pathlib import Path

from prvr.demo.gallery import build_demo_gallery
from prvr.paths import cache_dir


def main(argv: list[str] | None = None) -> None:
    """Build the gallery and print its videos and caption count."""
    parser = argparse.ArgumentParser(prog="python -m prvr.demo", description=__doc__)
    parser.add_argument("--root", type=Path, default=None,
                        help=f"data directory (default {cache_dir('demo')})")
    parser.add_argument("--videos", nargs="+", default=None, help="only these video ids (default: all)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    gallery = build_demo_gallery(args.root, args.videos)
    for video in gallery.videos:
        print(f"{video.id}  {video.duration:5.1f} s  {video.title:24s} {video.path}")
    print(f"{len(gallery.captions)} captions")


if __name__ == "__main__":
    main()
