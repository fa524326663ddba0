"""The app end to end on Qdrant (embedded, ``--index qdrant+local://DIR``), with ``--gallery DIR`` beside it.

Through the Predictor (what app.py runs): start, search (text in, results out), an upload, a restart on the
same store (the upload and the folder video still there, nothing extracted again); then one real
``python app.py`` server on that store, whose ``/prvr/video/<id>`` route serves the files and whose
``/search`` answers. The tests share one store and run in order; the data dir starts with the test
session's rendered demo videos (conftest.py).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import quote

import pytest

import extract  # noqa: F401  - the torchvision fix, before any backbone
from tests.clips import write_clip
from tests.servers import running_app

DEMO = "demo01"  # one demo video: a quick first start


def settings(world: SimpleNamespace):
    """The app's settings for this store: ``--index qdrant+local://DIR --gallery DIR``."""
    from prvr.serve.settings import AppSettings

    return AppSettings.from_args(["--data-dir", str(world.data), "--index", world.url, "--gallery",
                                  str(world.folder), "--demo-videos", DEMO, "--uploads", "shared"])


def indexed(predictor, within_s: float = 120.0):
    """``predictor`` once its folder's first pass has ended (the folder is indexed in the background)."""
    deadline = time.monotonic() + within_s
    while predictor.folder.status()["state"] not in ("watching", "unreadable"):
        assert time.monotonic() < deadline, predictor.folder.status()
        time.sleep(0.05)
    return predictor


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, data_dir_with_demo):
    """A started Predictor on an embedded Qdrant store, with a folder gallery of one clip."""
    from prvr.serve.bootstrap import start

    work = tmp_path_factory.mktemp("qdrant-app")
    data = data_dir_with_demo(work / "data")
    folder = work / "folder"
    write_clip(folder / "gradient.mp4", 24, size=(64, 48))
    world = SimpleNamespace(work=work, data=data, folder=folder, url=f"qdrant+local://{work / 'qdrant'}")
    world.predictor = indexed(start(settings(world)))
    yield world
    if world.predictor is not None:
        world.predictor.close()


def test_it_starts_on_qdrant_with_the_demo_and_the_folder(world) -> None:
    p = world.predictor
    assert p.index.describe()["backend"] == "qdrant" and p.index.describe()["where"] == "embedded"
    assert p.index.ids == [DEMO, "folder:gradient.mp4"]
    assert "Qdrant collection" in p.describe()["index"] and p.describe()["shared_videos"] == 2
    assert str(world.work) not in str(p.describe())  # no server path in /info


def test_search_text_in_results_out(world) -> None:
    query = (world.predictor.example_queries() or ["a person walking"])[0]  # a caption of the demo
    results = world.predictor.search(query, k=5).results
    assert sorted(r["video_id"] for r in results) == sorted(world.predictor.index.ids)  # k > 2 videos
    assert [r["rank"] for r in results] == [1, 2]
    assert results[0]["score"] >= results[1]["score"]
    for r in results:
        assert r["score"] == pytest.approx(r["clip_score"] * 0.7 + r["frame_score"] * 0.3, abs=1e-4)
        assert 0 <= r["key_moment"]["start"] < r["key_moment"]["end"] <= r["duration"] + 1
        assert len(r["heatmap"]["score"]) >= 1 and r["confidence"] in ("high", "medium", "low")
        assert Path(r["path"]).is_file()  # the predictor locates the stored file


def test_an_upload_joins_the_shared_gallery(world, tmp_path: Path) -> None:
    p = world.predictor
    video = write_clip(tmp_path / "My holiday.mp4", 36, size=(96, 64))
    added = p.add_video(video, name="My holiday.mp4")
    assert added["status"] == "added", added
    world.upload = added["video_id"]
    assert p.index.ids[-1] == world.upload and len(p.index) == 3
    hits = p.search("a colourful gradient moving across the screen", k=10).results
    assert world.upload in [r["video_id"] for r in hits]
    stored = p.video_file(world.upload)
    assert stored is not None and stored.is_file() and stored.is_relative_to(world.data)
    assert p.add_video(video, name="again.mp4")["status"] == "duplicate"  # found by sha256 in Qdrant
    world.before_restart = [(r["video_id"], r["score"]) for r in p.search("a person walking", k=10).results]


def test_a_restart_keeps_the_store_and_extracts_nothing(world, monkeypatch: pytest.MonkeyPatch) -> None:
    from extract.pipeline import VideoExtractor
    from prvr.serve.bootstrap import start

    ids = world.predictor.index.ids
    world.predictor.close()  # releases the embedded store (one process, one client at a time)
    world.predictor = None
    extracted: list[str] = []
    original = VideoExtractor.extract

    def counting(self, path, *args, **kw):
        extracted.append(str(path))
        return original(self, path, *args, **kw)

    monkeypatch.setattr(VideoExtractor, "extract", counting)
    world.predictor = indexed(start(settings(world)))
    assert world.predictor.index.ids == ids and world.upload in ids
    assert extracted == []  # the demo video, the folder clip and the upload were all found in the store
    after = [(r["video_id"], r["score"]) for r in world.predictor.search("a person walking", k=10).results]
    assert after == world.before_restart
    assert world.predictor.video_file(world.upload).is_file()


def test_the_server_on_the_same_store_serves_videos_by_id(world) -> None:
    import httpx
    from gradio_client import Client

    upload_file = world.predictor.video_file(world.upload)
    folder_file = world.predictor.video_file("folder:gradient.mp4")
    world.predictor.close()  # the server process takes the store
    world.predictor = None
    log = world.work / "server.log"
    with running_app(world.data, log, "--index", world.url, "--gallery", str(world.folder),
                     "--demo-videos", DEMO, "--uploads", "shared") as url:
        base = url.rstrip("/")
        for video_id, path in ((world.upload, upload_file), ("folder:gradient.mp4", folder_file),
                               (DEMO, None)):
            got = httpx.get(f"{base}/prvr/video/{video_id}", timeout=30)
            assert got.status_code == 200 and got.content[4:8] == b"ftyp", (video_id, got.status_code)
            assert path is None or got.content == path.read_bytes()
        part = httpx.get(f"{base}/prvr/video/{world.upload}", headers={"Range": "bytes=0-99"}, timeout=30)
        assert part.status_code == 206 and len(part.content) == 100
        assert httpx.get(f"{base}/prvr/video/no-such-video", timeout=30).status_code == 404
        client = Client(url, verbose=False)
        info = client.predict(api_name="/info")
        assert info["shared_videos"] == 3 and "Qdrant" in info["index"]
        response = client.predict("a person walking", 5, 0.7, api_name="/search")
        ids = [r["video_id"] for r in response["results"]]
        assert set(ids) == {DEMO, "folder:gradient.mp4", world.upload}
        assert all(r["video_url"] == f"/prvr/video/{quote(r['video_id'])}" for r in response["results"])
    # nothing extracted or indexed again at start (the predictor's and the Qdrant gallery's log lines; the
    # search kernels' warm-up indexes two synthetic videos in a temporary built-in index)
    assert not re.search(r"indexed \d+ videos (of the|in qdrant)", log.read_text())
