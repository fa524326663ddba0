"""``python -m prvr.index move SOURCE TARGET``: a gallery to a Qdrant server (``prvr.index.move``)."""

from __future__ import annotations

import argparse
import logging
import sys

from prvr.index.move import move
from prvr.index.store import IndexStoreError


def main(argv: list[str] | None = None) -> int:
    """Run the command; 0 when done, 1 with one line saying why not."""
    parser = argparse.ArgumentParser(prog="python -m prvr.index", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    moving = commands.add_parser("move", help="copy a gallery into a new Qdrant collection",
                                 description=sys.modules["prvr.index.move"].__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    moving.add_argument("source", help="a built-in index directory, or qdrant+local://DIR")
    moving.add_argument("target", help="qdrant://HOST:PORT/COLLECTION (or qdrant+local://DIR)")
    moving.add_argument("--batch", type=int, default=256, help="videos per request")
    moving.add_argument("--shards", type=int, default=1, help="a server's shards per collection")
    moving.add_argument("--replicas", type=int, default=1, help="a server's copies of each shard")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        move(args.source, args.target, args.batch, report=print, shards=args.shards, replicas=args.replicas)
    except (IndexStoreError, ValueError, OSError) as err:
        print(f"move: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
