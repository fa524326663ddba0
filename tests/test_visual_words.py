"""``python -m prvr.evaluate --videos DIR --moments FILE --words ...``: an annotated folder evaluated with the
words each video carries (read as an upload's are) beside its pictures, in one run."""

import json
from pathlib import Path

import pytest

from tests.test_words_evaluate import _clip

LINES = ["Councillor Mara Lindqvist opens the budget meeting in room 12",
         "Chef Ines Moreau bakes pancakes at oven 19",
         "Goalkeeper Tomas Rehak saves the penalty in minute 26"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Three noise clips, each with a sidecar line; a moments file asking for each line."""
    root = tmp_path_factory.mktemp("visual_words")
    entries = []
    for k, line in enumerate(LINES):
        _clip(root / f"v{k}.mp4", 4.0, k)
        (root / f"v{k}.srt").write_text(f"1\n00:00:01,000 --> 00:00:03,000\n{line}.\n")
        entries.append({"file": f"v{k}.mp4", "queries": [{"text": line, "start": 1.0, "end": 3.0,
                                                          "clip": f"v{k}"}]})
    (root / "moments.json").write_text(json.dumps({"videos": entries}))
    return root


def test_words_add_a_row_beside_the_pictures_and_name_what_moved(folder: Path, capsys) -> None:
    from prvr.evaluate.__main__ import main
    from prvr.evaluate.annotated import format_report

    args = ["--videos", str(folder), "--moments", str(folder / "moments.json"), "--profile", "lite"]
    off = main([*args, "--json"])
    capsys.readouterr()
    assert "words" not in off and "words" not in off["metrics"]  # default off: the pictures evaluation
    report = main([*args, "--words", "subtitles", "--json"])
    assert json.loads(capsys.readouterr().out)["metrics"] == report["metrics"]
    assert report["metrics"]["two_branch"] == off["metrics"]["two_branch"]  # the pictures rows unchanged
    words = report["words"]
    assert report["metrics"]["words"]["R@1"] == 100.0
    assert report["ci"]["metrics"]["words"]["R@1"]["low"] == 100.0
    assert words["segments"]["subtitles"] == 3 and words["videos_with_words"] == 3
    assert words["mode"] == "subtitles" and words["timings"]["total_s"] > 0
    moved = {m["query"]: m for m in words["moved"]}
    pictures_wrong = 100.0 - off["metrics"]["two_branch"]["R@1"]
    assert len(moved) >= round(pictures_wrong * 3 / 100)  # every query the pictures missed moved to rank 1
    for m in moved.values():
        assert m["rank_words"] == 1 and m["first_words"][0]["source"] == "subtitles"
        assert m["first_words"][0]["text"].rstrip(".") == m["query"]
    paired = words["paired_words_minus_pictures"]["R@1"]
    assert paired["value"] == pytest.approx(100.0 - off["metrics"]["two_branch"]["R@1"])
    table = format_report(report)
    assert "words - pictures: R@1" in table and "\nwords " in table
