"""Uploads through the Predictor (in process): messages name the user's file; nothing is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import extract  # noqa: F401  - the torchvision fix, before any backbone
from extract.decode import CorruptVideo
from prvr.serve.bootstrap import sweep_media
from tests.clips import write_clip
from tests.test_words_serve import joined

REPO = Path(__file__).resolve().parents[1]


def test_messages_name_the_uploaded_file_not_the_stored_copy(tmp_path: Path, make_predictor,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    predictor = make_predictor(tmp_path / "data")
    clip = write_clip(tmp_path / "gradio" / "Birthday party.mp4")
    models = predictor.ingest.extractor.models  # the in-process extractor's VideoExtractor
    original = models.extract

    def damaged(path, **kw):  # the stored copy fails to decode half way
        raise CorruptVideo(path, "the video is damaged: only 3 of 24 frames decode.", "Re-encode it.")

    monkeypatch.setattr(models, "extract", damaged)
    out = predictor.add_video(clip, name="Birthday party.mp4")
    assert out["status"] == "rejected", out
    expected = "Birthday party.mp4: the video is damaged: only 3 of 24 frames decode. Re-encode it."
    assert out["message"] == expected
    assert not any(p.is_file() for p in predictor.media.dir.rglob("*"))  # no stored copy left
    monkeypatch.setattr(models, "extract", original)
    image = tmp_path / "6071e39394409f3b.mp4"  # a server-side name; the user called it cat.mp4
    from PIL import Image

    Image.new("RGB", (64, 48), "red").save(image, "PNG")
    out = predictor.add_video(image, name="cat.mp4")
    assert out["status"] == "rejected"
    assert out["message"].startswith("cat.mp4: this is a PNG image, not a video")
    assert "6071e39394409f3b" not in out["message"]
    added = predictor.add_video(clip, name="/some/client/dir/Birthday party.mp4")
    assert added["status"] == "added", added
    assert added["message"].startswith("Birthday party.mp4: added") and "“Birthday party”" in added["message"]


def test_session_limit_message_suits_browser_and_api(tmp_path: Path, make_predictor) -> None:
    predictor = make_predictor(tmp_path / "data", uploads="session", max_uploads_per_session=1)
    session = predictor.ensure_session(None)
    session.uploads = 1
    out = predictor.add_video(write_clip(tmp_path / "a.mp4"), session)
    assert out["status"] == "rejected" and "maximum per session" in out["message"]
    assert "new client" in out["message"] and "reload the page" in out["message"]


def test_start_sweeps_what_an_interrupted_upload_left(tmp_path: Path, make_predictor) -> None:
    data = tmp_path / "data"
    predictor = make_predictor(data)
    kept = predictor.add_video(write_clip(tmp_path / "kept.mp4"))
    assert kept["status"] == "added"
    joined(predictor, kept)  # its words follow it: the files kept for their reading go once they joined
    stored = {p for p in predictor.media.dir.rglob("*") if p.is_file()}
    assert len(stored) == 1
    # what a kill leaves: a work dir with a half-written transcode, a stored copy never indexed,
    # a half-written folder-video transcode
    (predictor.media.dir / "upload-x1y2").mkdir()
    (predictor.media.dir / "upload-x1y2" / "clip.mp4").write_bytes(b"\0" * 100)
    (predictor.media.dir / "0123456789abcdef.mp4").write_bytes(b"\0" * 100)
    (predictor.media.dir / "fedcba9876543210").mkdir()
    (predictor.media.dir / "fedcba9876543210" / ".clip.k3j2.mp4").write_bytes(b"\0" * 100)
    # a video another model's index names stays (indexes of several models share the media dir)
    other = data / "indexes" / "lite-othermodel-v5" / "seg-1"
    other.mkdir(parents=True)
    (predictor.media.dir / "aaaaaaaaaaaaaaaa.mp4").write_bytes(b"\0" * 10)
    (other / "videos.json").write_text('[{"id": "upload:a", "path": "media/aaaaaaaaaaaaaaaa.mp4"}]')
    sweep_media(predictor)
    left = {p for p in predictor.media.dir.rglob("*")}
    assert left == stored | {predictor.media.dir / "aaaaaaaaaaaaaaaa.mp4"}
    # an index in a layout this code cannot read: nothing is deleted
    (data / "indexes" / "future-v9").mkdir()
    (data / "indexes" / "future-v9" / "records.bin").write_bytes(b"?")
    (predictor.media.dir / "bbbbbbbbbbbbbbbb.mp4").write_bytes(b"\0" * 10)
    sweep_media(predictor)
    assert (predictor.media.dir / "bbbbbbbbbbbbbbbb.mp4").exists()


def test_a_killed_upload_leaves_nothing_after_the_next_start(tmp_path: Path, make_predictor) -> None:
    """SIGKILL while an upload's copy is being stored; the next start removes every trace of it."""
    data, clip = tmp_path / "data", write_clip(tmp_path / "slow.mp4", frames=48)
    script = f"""
import sys, time, shutil
sys.path.insert(0, {str(REPO)!r})
import extract
from prvr.models.factory import create_model
from prvr.serve.bootstrap import assemble
from prvr.serve.settings import AppSettings
p = assemble(AppSettings(data_dir={str(data)!r}), create_model("lite"))
real_copy = shutil.copyfile
def slow_copy(src, dst, **kw):
    out = real_copy(src, dst, **kw)
    print("COPIED", flush=True)
    time.sleep(60)
    return out
shutil.copyfile = slow_copy
p.add_video({str(clip)!r})
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        deadline = time.monotonic() + 600  # the child loads the model first: slow on a busy machine
        while time.monotonic() < deadline and proc.stdout.readline().strip() != "COPIED":
            assert proc.poll() is None, "the upload process exited early"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert any(p.is_file() for p in (data / "media").rglob("*"))  # the kill left a partial upload
    predictor = make_predictor(data)
    sweep_media(predictor)
    assert not any(p.is_file() for p in predictor.media.dir.rglob("*"))
    assert len(predictor.index) == 0


def test_search_kernels_warm_in_the_background(lite_model, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from prvr.serve.model_choice import warm_search_kernels

    with caplog.at_level(logging.INFO, logger="prvr.serve.model_choice"):
        thread = warm_search_kernels(lite_model)
        thread.join(timeout=300)
    assert not thread.is_alive()
    messages = [r.getMessage() for r in caplog.records if r.name == "prvr.serve.model_choice"]
    assert messages[0].startswith("preparing the search kernels in the background")
    assert messages[-1].startswith("search kernels ready in"), messages  # a failure logs an exception


def test_an_old_schema_index_is_left_alone_and_a_new_one_built_beside_it(tmp_path: Path, lite_model,
                                                                            make_predictor) -> None:
    """The shared index lives in a directory named by the index schema: a data dir written by a release
    before schema 6 (no fine rows, segments or reference scores) keeps its old index untouched, the app
    builds a new one, and opening the old one directly is refused with a message to rebuild it."""
    import json

    from prvr.index import VideoIndex, store

    old = tmp_path / "indexes" / f"lite-{lite_model.fingerprint()[:12]}-v{store.SCHEMA_VERSION - 1}"
    old.mkdir(parents=True)
    manifest = {"format": store.FORMAT, "schema_version": store.SCHEMA_VERSION - 1, "generation": 3,
                "segments": []}
    (old / store.MANIFEST).write_text(json.dumps(manifest))
    before = (old / store.MANIFEST).read_bytes()
    predictor = make_predictor(tmp_path)
    assert predictor.index.root.name.endswith(f"-v{store.SCHEMA_VERSION}") and predictor.index.root != old
    assert len(predictor.index) == 0 and (old / store.MANIFEST).read_bytes() == before
    with pytest.raises(store.IndexStoreError, match="rebuild the index"):
        VideoIndex.open(old, lite_model)
    bank = predictor.index.manifest["references"]
    assert bank == {"id": predictor.calibrator.reference_id, "count": 261}  # the app's bank, stored


def test_titles_of_different_files_never_collide(tmp_path: Path, make_predictor) -> None:
    from prvr.serve.ingest import unique_title

    predictor = make_predictor(tmp_path / "data")
    first = write_clip(tmp_path / "a" / "unsupported.mp4", frames=24)
    second = write_clip(tmp_path / "b" / "unsupported.mov", frames=30)  # other bytes, same stem
    third = write_clip(tmp_path / "c" / "unsupported.mov", frames=36)
    added = [predictor.add_video(p, name=p.name) for p in (first, second, third)]
    assert [a["status"] for a in added] == ["added"] * 3, added
    titles = [predictor.index.record(a["video_id"])["title"] for a in added]
    assert titles == ["unsupported", "unsupported.mov", "unsupported.mov (2)"]
    assert "“unsupported.mov (2)”" in added[2]["message"]
    hits = predictor.search("a colourful gradient", k=10).results
    assert len({h["title"] for h in hits}) == len(hits) == 3
    assert unique_title("clip.flv", {"clip"}) == "clip.flv" and unique_title("clip.mpg", set()) == "clip"
