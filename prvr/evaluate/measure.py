"""``python -m prvr.evaluate.measure [--root DIR]``: measure the offline default (the ``lite`` profile) on the
whole demo gallery and store the result in the recipe, so that the app needs no evaluation at start:

- ``examples``: the captions whose first-ranked video is one that plays their clip, one clip after another
  (``prvr.demo.gallery.example_captions`` reads them);
- ``measured``: the demo's retrieval and moment metrics over ALL its captions, as
  ``python -m prvr.evaluate --gallery demo --json`` reports them (two-branch row).

Run it again whenever the clips, captions, videos or the default model change.
"""

from __future__ import annotations

import argparse
import json
import logging

from prvr.demo.gallery import SPEC_PATH, build_demo_gallery, interleaved
from prvr.evaluate.demo import evaluate_demo, top_videos

COMMAND = "python -m prvr.evaluate --gallery demo --json"


def measure(root=None) -> tuple[list[str], dict]:
    """(examples, measured) of the whole gallery."""
    gallery = build_demo_gallery(root)
    report = evaluate_demo(gallery.root)
    top = top_videos(gallery)
    right = [c for c in gallery.captions if top[c.text] in c.relevant]
    row, local = report["metrics"]["two_branch"], report["localisation"]["key_moment"]
    measured = {"R@1": round(row["R@1"], 1), "R@5": round(row["R@5"], 1), "R@10": round(row["R@10"], 1),
                "key_moment_IoU>=0.5": round(local["iou>=0.5"], 1),
                "key_moment_mean_IoU": round(local["mean_iou"], 3),
                "random_R@1": round(report["metrics"]["random"]["R@1"], 1),
                "captions": report["gallery"]["captions"], "videos": report["gallery"]["videos"],
                "examples_rank1": len(right), "profile": report["model"].get("profile"),
                "model_fingerprint": report["model"].get("fingerprint"), "command": COMMAND}
    if abs(100 * len(right) / len(gallery.captions) - row["R@1"]) > 1e-6:
        raise AssertionError("examples disagree with R@1: the model changed during the measurement?")
    return interleaved(right), measured


def store(examples: list[str], measured: dict, path=SPEC_PATH) -> None:
    """Write ``examples`` and ``measured`` as the recipe's last keys, the rest of the file left as it is."""
    text = path.read_text()
    cut = text.find(',\n  "examples":')
    if cut < 0:
        cut = text.rstrip().rstrip("}").rstrip().__len__()
    body = text[:cut]
    lines = ",\n".join(f"    {json.dumps(e)}" for e in examples)
    text = (body + ',\n  "examples": [\n' + lines + '\n  ],\n  "measured": '
            + json.dumps(measured, sort_keys=False) + "\n}\n")
    json.loads(text)  # still valid
    path.write_text(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m prvr.evaluate.measure", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=None, help="the gallery's data directory (default: the app's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    examples, measured = measure(args.root)
    store(examples, measured)
    print(json.dumps({"examples": examples, "measured": measured}, indent=1))


if __name__ == "__main__":
    main()
