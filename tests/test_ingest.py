"""The ingest service (prvr.serve.ingest): every way in, and whether it ends in --persist's folder.

Each way in keeps its own promise: a shared upload (the page, the API, MCP's add_video of a server path) and
a --gallery folder video are written to the bucket, and a folder video's removal too; a session's upload and
the demo gallery never are; a restore writes nothing; and a start with --persist on a data dir that holds
shared videos from before writes those to the bucket (issue #38 item 4).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from prvr.serve.folder import sync_folder
from prvr.serve.persist import PersistentStore
from tests.clips import write_clip


def files(root: Path) -> dict[str, str]:
    """Every file under ``root``: relative name -> sha256 of its bytes."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def kept(bucket: Path, predictor) -> set[str]:
    """The video ids a start would restore from ``bucket`` (read as a new process would)."""
    return {v.id for v in PersistentStore(bucket, predictor.ingest.extractor.profile.identity()).restore()}


def test_every_way_in_persists_as_its_policy_says(tmp_path: Path, make_predictor) -> None:
    bucket, folder, inbox = tmp_path / "bucket", tmp_path / "folder", tmp_path / "inbox"
    first = make_predictor(tmp_path / "data1", uploads="shared", persist=bucket)
    # an upload to the shared gallery: the page and the API with shared uploads, and MCP's add_video of a
    # server path (app.install_mcp hands it to the same call)
    upload = first.add_video(write_clip(inbox / "holiday.mp4", 36), name="holiday.mp4")
    first.settings.uploads = "session"  # a visitor's private upload
    session = first.ensure_session(None)
    private = first.add_video(write_clip(inbox / "private.mp4", 30, size=(48, 48)), session)
    first.settings.uploads = "shared"
    demo = first.ingest.add_demo([SimpleNamespace(id="demo09", title="a demo video",
                                                  path=write_clip(tmp_path / "demo" / "one.mp4", 40))])
    write_clip(folder / "kept.mp4", 48, size=(72, 56))
    write_clip(folder / "gone.mp4", 60, size=(56, 40))
    synced = sync_folder(first.ingest, folder)
    assert [o["status"] for o in (upload, private)] + [o.status for o in demo + synced] == ["added"] * 5
    assert set(first.index.ids) == {upload["video_id"], "demo09", "folder:gone.mp4", "folder:kept.mp4"}
    assert kept(bucket, first) == {upload["video_id"], "folder:gone.mp4", "folder:kept.mp4"}
    (folder / "gone.mp4").unlink()
    assert sync_folder(first.ingest, folder) == []  # a removal: its tombstone
    assert kept(bucket, first) == {upload["video_id"], "folder:kept.mp4"}
    first.close()

    before = files(bucket)
    second = make_predictor(tmp_path / "data2", uploads="shared", persist=bucket)  # an empty data dir
    with second.ingest.starting():
        assert second.ingest.restore() == 2
        assert second.ingest.save_unsaved() == 0  # everything shared is in the bucket already
    assert files(bucket) == before  # a restore writes nothing
    assert set(second.index.ids) == {upload["video_id"], "folder:kept.mp4"}
    (folder / "kept.mp4").unlink()
    sync_folder(second.ingest, folder)  # a restored video's removal is recorded as well
    second.close()
    assert kept(bucket, second) == {upload["video_id"]}


def test_a_start_with_persist_saves_the_shared_videos_the_bucket_lacks(
        tmp_path: Path, make_predictor, data_dir_with_demo, caplog: pytest.LogCaptureFixture) -> None:
    """Issue #38 item 4: uploads and folder videos indexed before --persist was given are written to the
    bucket at the next start with --persist (one log line says how many), so a restart on an empty data
    dir still has them; the demo gallery is not written."""
    from prvr.serve.bootstrap import start
    from prvr.serve.settings import AppSettings

    data, folder, bucket = data_dir_with_demo(tmp_path / "data"), tmp_path / "folder", tmp_path / "bucket"
    earlier = make_predictor(data, uploads="shared")  # no --persist yet
    uploads = [earlier.add_video(write_clip(tmp_path / f"clip {n}.mp4", 30 + 6 * n, size=(64 + 16 * n, 48)))
               for n in range(3)]
    write_clip(folder / "mine.mp4", 42, size=(80, 64))
    sync_folder(earlier.ingest, folder)
    earlier.close()
    shared = {u["video_id"] for u in uploads} | {"folder:mine.mp4"}
    settings = AppSettings(data_dir=data, persist=bucket, gallery=folder, uploads="shared",
                           demo_videos="demo01")
    with caplog.at_level(logging.INFO, logger="prvr.serve.ingest"):
        started = start(settings)  # the start saves what the bucket lacks
    query = "a gradient moving to the right"
    scores = {r["video_id"]: r["score"] for r in started.search(query, k=10).results}
    assert kept(bucket, started) == shared
    started.close()
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("4 shared videos are not in the persistent folder") for line in lines), lines
    assert "saved 4 of the 4 shared videos to the persistent folder" in lines

    again = make_predictor(tmp_path / "fresh", uploads="shared", persist=bucket)  # an empty data dir
    try:
        assert again.ingest.restore() == 4  # what a start does first: the bucket restores them
        restored = {r["video_id"]: r["score"] for r in again.search(query, k=10).results}
        assert restored.keys() == scores.keys() - {"demo01"}
        assert restored == pytest.approx({i: scores[i] for i in restored}, abs=1e-4)  # the same rows
    finally:
        again.close()


def test_max_duration_still_bounds_what_an_upload_may_be(tmp_path: Path, make_predictor) -> None:
    """Any length fits the GPU slots now; --max-duration-s is what refuses a video, before any copy."""
    from prvr.serve.settings import AppSettings

    assert AppSettings().max_duration_s >= 30 * 60  # a half-hour upload is accepted by default
    predictor = make_predictor(tmp_path / "data", max_duration_s=60.0)
    long = write_clip(tmp_path / "in" / "x.mp4", 900, 10, size=(32, 24))  # 90 s
    out = predictor.add_video(long, name="lecture.mp4")
    assert out == {"status": "rejected", "video_id": None,
                   "message": "lecture.mp4: 1.5 minutes is longer than the limit of 1.0 minutes. Cut the "
                              "video into shorter parts."}
    assert len(predictor.index) == 0 and not any(p.is_file() for p in predictor.media.dir.rglob("*"))
