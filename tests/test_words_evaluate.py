"""``python -m prvr.evaluate --gallery words`` (prvr.evaluate.words) end to end on a tiny words set made on
the spot: sidecar subtitles through the app's words reader and gallery, with and without words, by half."""

import json
from pathlib import Path

import numpy as np
import pytest

from prvr.demo.compose import RenderConfig, encode_mp4


def _clip(path: Path, seconds: float, seed: int) -> None:
    """A 10 fps clip of slowly drifting noise (pictures that say nothing about the queries)."""
    import av

    cfg, rng = RenderConfig(fps=10), np.random.default_rng(seed)
    base = rng.integers(60, 200, (cfg.height // 30, cfg.width // 30, 3)).astype(np.uint8)
    pictures = []
    for n in range(round(seconds * cfg.fps)):
        rgb = np.kron(np.roll(base, n // 10, axis=1), np.ones((30, 30, 1), np.uint8))
        pictures.append(av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
                        .reformat(format="yuv420p").to_ndarray())
    encode_mp4(path, iter(pictures), cfg)


def _composite(n: int, text: str, number: int) -> dict:
    """Composite ``n``: two clips, one line of subtitles with a name and a number in the second."""
    return {"id": f"w{n}", "sidecar": "srt" if n % 2 else "vtt", "items": [
        {"clip": f"videos/c{n % 3}.mp4", "from": 0, "to": 3},
        {"clip": f"videos/c{(n + 1) % 3}.mp4", "from": 0, "to": 3,
         "says": [{"key": "line", "from": 0.5, "to": 2.5, "text": f"{text} {number}."}]}],
        "queries": [{"text": f"{text} {number}", "kind": "exact", "source": "subtitles", "targets": ["line"]},
                    {"text": f"{text} {number + 1}", "kind": "near_miss", "source": "subtitles",
                     "targets": ["line"]}]}


LINES = ["Councillor Mara Lindqvist opens the budget meeting in room",
         "Chef Ines Moreau bakes pancakes at oven",
         "Goalkeeper Tomas Rehak saves the penalty in minute",
         "Astronomer Yusuf Demir shows the rings on slide",
         "Vet Chiara Bellini releases the duckling at pond",
         "Mayor Lucia Ferreira opens the skate park on ramp"]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    """The tiny set's report, words read from sidecars only (fast)."""
    from prvr.evaluate.words import evaluate_words

    tmp = tmp_path_factory.mktemp("words")
    shared = tmp / "shared"
    (shared / "videos").mkdir(parents=True)
    for k in range(3):
        _clip(shared / "videos" / f"c{k}.mp4", 3.0, k)
    recipe = {"real": [], "composites": [_composite(n, line, 10 + 7 * n) for n, line in enumerate(LINES)]}
    (tmp / "recipe.json").write_text(json.dumps(recipe))
    off = tmp / "off.txt"
    off.write_text("# off-topic\na surgeon stitches a wound\na volcano erupts at night\n")
    return evaluate_words(tmp / "set", shared, words="subtitles", profile="lite",
                          off_topic={"tune": off, "check": off}, recipe=tmp / "recipe.json")


def test_words_find_the_video_and_the_moment_the_pictures_cannot(report) -> None:
    assert report["videos"] == 6 and report["queries"] == {"tune": 3, "check": 3}
    assert report["segments"]["subtitles"] == 6 and not report["skipped"]
    for half in ("tune", "check"):
        words, pictures = report["words"][half], report["pictures"][half]
        assert words["R@1"]["value"] == 100.0 and words["R@1_exact"]["value"] == 100.0
        assert words["key_moment_from_words"]["value"] == 100.0
        assert words["key_moment_mean_iou"]["value"] > 0.6  # the line's 2 s, not the video's 6
        assert pictures["key_moment_from_words"]["value"] == 0.0
        assert pictures["R@1"]["value"] < 100.0  # noise pictures cannot tell six videos apart


def test_exact_lines_are_strong_and_near_misses_and_off_topic_queries_are_not(report) -> None:
    for half in ("tune", "check"):
        words = report["words"][half]
        assert words["strong_precision"]["value"] == 1.0 and words["strong_recall"]["value"] == 1.0
        assert words["near_miss"] == 3 and words["near_miss_strong"]["value"] == 0.0  # a wrong number
        assert words["off_topic"] == 2 and words["off_topic_strong"]["value"] == 0.0
        assert report["pictures"][half]["strong_precision"]["den"] == 0  # lite is never strong on noise


def test_the_table_and_the_cli(report, tmp_path, capsys) -> None:
    from prvr.evaluate.__main__ import main
    from prvr.evaluate.words import format_words_report

    table = format_words_report(report)
    assert "words / tune" in table and "pictures / check" in table and "100.0 [100.0, 100.0]" in table
    with pytest.raises(SystemExit):
        main(["--gallery", "words", "--weights", "speech=", "--root", str(tmp_path)])
    assert "speech=DIR_OR_HUB_ID" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["--gallery", "words", "--shared", str(tmp_path / "nowhere"), "--root", str(tmp_path / "set")])
    assert stop.value.code == 1 and "clips not found" in capsys.readouterr().err


def test_the_speech_weights_reach_the_reader_and_the_backbones_keep_theirs(monkeypatch, capsys) -> None:
    import prvr.evaluate.words as words
    from prvr.evaluate.__main__ import main

    seen = {}

    def fake(root, shared, weights, mode, device, profile):
        seen.update(weights=weights, mode=mode, profile=profile)
        return {"fake": True}

    monkeypatch.setattr(words, "evaluate_words", fake)
    main(["--gallery", "words", "--weights", "speech=/models/whisper-small", "--weights", "clip=/models/clip",
          "--profile", "clip", "--words", "subtitles", "--json"])
    assert seen == {"weights": {"clip": "/models/clip", "speech": "/models/whisper-small"},
                    "mode": "subtitles", "profile": "clip"}
    assert json.loads(capsys.readouterr().out) == {"fake": True}
    with pytest.raises(SystemExit):
        main(["--gallery", "words", "--weights", "speech=a", "--weights", "speech=b"])
    assert "give one Whisper model" in capsys.readouterr().err
