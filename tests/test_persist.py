"""The --persist folder (prvr.serve.persist): files written once, crashes skipped, restored without
extraction."""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import io
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from extract.profiles import get_profile
from prvr.index import GalleryVideo
from prvr.serve.folder import sync_folder
from prvr.serve.persist import PersistentStore, video_key
from tests.clips import write_clip

REPO = Path(__file__).resolve().parents[1]
LITE = get_profile("lite").identity()


def synthetic(video_id: str, rows: int, seed: int, title: str = "", dim: int = 1280) -> GalleryVideo:
    """A video of ``rows`` random 1 s feature rows (the lite profile's width)."""
    rng = np.random.default_rng(seed)
    start = np.arange(rows, dtype=np.float32)
    return GalleryVideo(video_id, rng.random((rows, dim), dtype=np.float32), start, start + 1, float(rows),
                        title or video_id, "", hashlib.sha256(f"source {seed}".encode()).hexdigest())


def media_file(path: Path, size: int, seed: int) -> Path:
    """A file of ``size`` random bytes (stands in for a playable mp4)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(np.random.default_rng(seed).bytes(size))
    return path


def snapshot(root: Path) -> dict[str, tuple]:
    """Every file under ``root``: relative name -> (inode, size, mtime_ns, sha256 of its bytes)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[p.relative_to(root).as_posix()] = (st.st_ino, st.st_size, st.st_mtime_ns,
                                                   hashlib.sha256(p.read_bytes()).hexdigest())
    return out


@contextlib.contextmanager
def audit(root: Path, monkeypatch: pytest.MonkeyPatch):
    """Record every call that could change, rename, delete or lock a file under ``root``, and every
    file created there (which must be opened with O_CREAT | O_EXCL or mode "x", and a descriptor so
    created must be fsynced before it is closed: a bucket uploads a file on close, and a file closed
    unsynced can be lost or cut short by a crash of the machine)."""
    root = str(root.resolve())
    seen: dict[str, list] = {"violations": [], "exclusive": []}
    unsynced: dict[int, str] = {}  # descriptors created here and not fsynced yet

    def inside(path: object) -> bool:
        try:
            return os.path.abspath(os.fspath(path)).startswith(root)
        except TypeError:  # a file descriptor
            return False

    def wrap(module: object, name: str, check) -> None:
        original = getattr(module, name)

        def spy(*args, **kwargs):
            check(args, kwargs)
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)

    def os_open(args, kwargs) -> None:
        path, flags = args[0], args[1] if len(args) > 1 else kwargs.get("flags", 0)
        if inside(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC):
            if flags & os.O_CREAT and flags & os.O_EXCL and not flags & (os.O_APPEND | os.O_TRUNC):
                seen["exclusive"].append(os.path.basename(path))
            else:
                seen["violations"].append(("os.open", path, flags))

    def py_open(args, kwargs) -> None:
        path, mode = args[0], args[1] if len(args) > 1 else kwargs.get("mode", "r")
        if inside(path) and set(mode) & set("wa+"):
            seen["violations"].append(("open", path, mode))
        elif inside(path) and "x" in mode:
            seen["exclusive"].append(os.path.basename(path))

    def forbidden(what: str):
        def check(args, kwargs) -> None:
            if any(inside(a) for a in args[:2]):
                seen["violations"].append((what, *args[:2]))
        return check

    def lock(what: str):
        def check(args, kwargs) -> None:
            seen["violations"].append((what, *args[:2]))  # no lock of any kind during the store's work
        return check

    real_open, real_fsync, real_close = os.open, os.fsync, os.close

    def spy_open(*args, **kwargs):
        os_open(args, kwargs)
        fd = real_open(*args, **kwargs)
        flags = args[1] if len(args) > 1 else kwargs.get("flags", 0)
        if inside(args[0]) and flags & os.O_CREAT and flags & os.O_EXCL:
            unsynced[fd] = os.path.basename(args[0])
        return fd

    def spy_fsync(fd):
        real_fsync(fd)
        unsynced.pop(fd if isinstance(fd, int) else fd.fileno(), None)

    def spy_close(fd):
        if fd in unsynced:
            seen["violations"].append(("closed without fsync", unsynced.pop(fd)))
        real_close(fd)

    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "close", spy_close)
    wrap(builtins, "open", py_open)
    wrap(io, "open", py_open)
    for name in ("replace", "rename", "renames", "unlink", "remove", "rmdir", "truncate", "link", "symlink"):
        wrap(os, name, forbidden(f"os.{name}"))
    wrap(shutil, "move", forbidden("shutil.move"))
    wrap(shutil, "rmtree", forbidden("shutil.rmtree"))
    wrap(os, "ftruncate", lock("os.ftruncate"))
    for name in ("flock", "lockf"):
        wrap(fcntl, name, lock(f"fcntl.{name}"))
    commands = ("F_SETLK", "F_SETLKW", "F_OFD_SETLK", "F_OFD_SETLKW")
    locks = {getattr(fcntl, c) for c in commands if hasattr(fcntl, c)}

    def fcntl_lock(args, kwargs) -> None:
        if len(args) > 1 and args[1] in locks:
            seen["violations"].append(("fcntl.fcntl", *args[:2]))

    wrap(fcntl, "fcntl", fcntl_lock)
    try:
        yield seen
    finally:
        monkeypatch.undo()


def unchanged(before: dict, after: dict) -> list[str]:
    """Files of ``before`` that are gone or differ in ``after`` (inode, size, mtime or bytes)."""
    return [name for name, facts in before.items() if after.get(name) != facts]


# ------------------------------------------------------------------------------------------ (a) write once
def test_every_file_is_written_once_over_add_remove_and_restart(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "bucket"
    m1 = media_file(tmp_path / "local" / "one.mp4", 300_000, 1)
    m2 = media_file(tmp_path / "local" / "two.mp4", 200_000, 2)
    v1, v2, v3 = synthetic("upload:1", 90, 1), synthetic("upload:2", 60, 2), synthetic("upload:3", 120, 3)
    store = PersistentStore(root, LITE)
    steps = []

    def step(what: str, fn):
        before = snapshot(root)
        with audit(root, monkeypatch) as seen:
            out = fn()
        after = snapshot(root)
        new = sorted(set(after) - set(before))
        steps.append(what)
        assert not seen["violations"], (what, seen["violations"])
        assert not unchanged(before, after), (what, unchanged(before, after))
        assert sorted(os.path.basename(n) for n in new) == sorted(seen["exclusive"]), (what, new, seen)
        return out, new

    _, new = step("add v1", lambda: store.record_add(v1, m1))
    assert sorted(n.split("/")[0] for n in new) == ["entries", "media"]
    step("add v2", lambda: store.record_add(v2, m2))
    same_bytes = tmp_path / "local" / "one.mp4"
    _, new = step("add v3 with v1's media bytes", lambda: store.record_add(v3, same_bytes))
    assert [n.split("/")[0] for n in new] == ["entries"]  # the media is there already: not written again
    tomb, new = step("remove v2", lambda: store.record_remove("upload:2", v2.sha256))
    assert tomb is not None and tomb.name.startswith(f"del-{video_key('upload:2')}-") and len(new) == 1
    none, new = step("remove an id the folder never held", lambda: store.record_remove("demo:x", ""))
    assert none is None and new == []

    restarted = PersistentStore(root, LITE)  # a restart: a new process's store over the same folder
    videos, new = step("restore", restarted.restore)
    assert new == [] and [v.id for v in videos] == ["upload:1", "upload:3"]
    step("add v2 again after its removal", lambda: restarted.record_add(v2, m2))
    replica = PersistentStore(root, LITE)  # a second replica adds the same video with the same bytes
    step("a replica adds v1 again", lambda: replica.record_add(v1, m1))
    again, _ = step("restore", PersistentStore(root, LITE).restore)
    assert [v.id for v in again] == ["upload:1", "upload:3", "upload:2"]  # v1 once: the first entry wins
    for got, want in zip(again, [v1, v3, v2], strict=True):
        np.testing.assert_array_equal(got.features, want.features)
        np.testing.assert_array_equal(got.start, want.start)
        assert (got.title, got.duration, got.sha256) == (want.title, want.duration, want.sha256)
        assert Path(got.path).parent == root / "media"
    assert Path(again[0].path).read_bytes() == m1.read_bytes()
    assert Path(again[2].path).read_bytes() == m2.read_bytes()
    assert len(list((root / "media").iterdir())) == 2  # content-addressed: equal bytes, one file
    assert len(steps) == 9


def test_another_profile_is_skipped_with_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "bucket"
    store = PersistentStore(root, LITE)
    for n in range(3):
        store.record_add(synthetic(f"upload:{n}", 60, n), media_file(tmp_path / f"{n}.mp4", 1000, n))
    clip = dict(LITE, name="clip", visual_dim=512)
    with caplog.at_level(logging.INFO, logger="prvr.serve.persist"):
        assert PersistentStore(root, clip).restore() == []
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["skipping 3 persisted videos of feature profile 'lite' v1 (this app runs 'clip' v1): "
                     "start with that profile to see them"]


# ---------------------------------------------------------------------------------------------- (b) crashes
CHILD = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from prvr.serve import persist
    from prvr.index import GalleryVideo
    from extract.profiles import get_profile

    root, what, media = sys.argv[1], sys.argv[2], sys.argv[3]
    real_write = os.write

    def slow_write(fd, data):  # a slow disk: the parent kills us between two chunks
        n = real_write(fd, data)
        print("wrote", n, flush=True)
        time.sleep(0.3)
        return n

    os.write = slow_write
    rows = 2000 if what == "entry" else 10
    x = np.random.default_rng(7).random((rows, 1280), dtype=np.float32)
    t = np.arange(rows, dtype=np.float32)
    video = GalleryVideo("upload:big", x, t, t + 1, float(rows), "big", "", "ab" * 32)
    store = persist.PersistentStore(root, get_profile("lite").identity())
    if what == "entry":  # the media is small (written whole); the entry is cut by the kill
        os.write = real_write
        store.store_media(__import__("pathlib").Path(media))
        os.write = slow_write
    store.record_add(video, __import__("pathlib").Path(media))
    print("finished", flush=True)
""")


def kill_mid_write(root: Path, what: str, media: Path) -> None:
    """Run CHILD writing ``what`` ("entry" or "media") and SIGKILL it after its first chunk is written."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(root), what, str(media)], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()  # the first chunk is on disk
        assert line.startswith("wrote"), (line, child.stderr.read() if child.poll() is not None else "")
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()


def test_sigkill_mid_write_leaves_a_file_that_is_skipped_and_never_served(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "bucket"
    whole = synthetic("upload:whole", 90, 1)
    PersistentStore(root, LITE).record_add(whole, media_file(tmp_path / "whole.mp4", 50_000, 1))

    # killed while writing an entry of 2,000 rows (10 MB): a truncated entry, its media whole
    kill_mid_write(root, "entry", media_file(tmp_path / "small.mp4", 20_000, 2))
    cut = [p for p in (root / "entries").iterdir()
           if hashlib.sha256(p.read_bytes()).hexdigest() != p.stem.rsplit("-", 1)[-1]]
    assert len(cut) == 1 and 0 < cut[0].stat().st_size < 2000 * 1280 * 4
    with caplog.at_level(logging.WARNING, logger="prvr.serve.persist"):
        store = PersistentStore(root, LITE)
        videos = store.restore()
    assert [v.id for v in videos] == ["upload:whole"]
    assert any(cut[0].name in r.getMessage() and "cut short" in r.getMessage() for r in caplog.records)
    assert store.report.damaged == [cut[0].name]

    # killed while copying a 6 MB video: a truncated media file and no entry naming it
    big = media_file(tmp_path / "big.mp4", 6 << 20, 3)
    entries = set((root / "entries").iterdir())
    kill_mid_write(root, "media", big)
    assert set((root / "entries").iterdir()) == entries
    sha = hashlib.sha256(big.read_bytes()).hexdigest()
    bad = root / "media" / f"{sha}.mp4"
    assert 0 < bad.stat().st_size < big.stat().st_size
    # adding those bytes again never reuses (or replaces) the cut file: a whole copy goes beside it
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="prvr.serve.persist"):
        PersistentStore(root, LITE).record_add(synthetic("upload:big", 30, 4), big)
    assert any(bad.name in r.getMessage() for r in caplog.records)
    videos = PersistentStore(root, LITE).restore()
    served = {v.id: Path(v.path) for v in videos}
    assert served["upload:big"].name == f"{sha}.r1.mp4"
    assert served["upload:big"].read_bytes() == big.read_bytes()
    assert bad not in served.values()


def test_an_entry_whose_media_is_cut_short_is_skipped(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    whole = tmp_path / "whole"
    entry = PersistentStore(whole, LITE).record_add(synthetic("upload:a", 60, 1),
                                                    media_file(tmp_path / "a.mp4", 40_000, 1))
    (media,) = (whole / "media").iterdir()
    # what a second replica sees when the uploader crashed mid-copy: the entry, and half the media
    seen = tmp_path / "seen"
    store = PersistentStore(seen, LITE)
    (seen / "entries" / entry.name).write_bytes(entry.read_bytes())
    (seen / "media" / media.name).write_bytes(media.read_bytes()[:10_000])
    with caplog.at_level(logging.WARNING, logger="prvr.serve.persist"):
        assert store.restore() == []
    assert any(media.name in r.getMessage() and "cut short" in r.getMessage() for r in caplog.records)
    # the size check alone catches it as well (verify_media=False: no hashing of every video at start)
    assert PersistentStore(seen, LITE, verify_media=False).restore() == []
    # damaged in place (the same size, other bytes): the hash catches it, where media are verified
    flipped = bytearray(media.read_bytes())
    flipped[5_000] ^= 0xFF
    (seen / "media" / media.name).write_bytes(bytes(flipped))
    assert store.restore() == []
    assert len(PersistentStore(seen, LITE, verify_media=False).restore()) == 1  # (the size alone: kept)


# ---------------------------------------------------------------------------------------------- (c) restore
def test_restore_into_an_empty_data_dir_answers_the_same_without_extracting(
        tmp_path: Path, make_predictor, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the app's wiring (settings.persist, the ingest service): shared uploads and folder videos
    (and a folder video's removal) reach the folder; a start on an empty data dir restores them."""
    persist = tmp_path / "bucket"
    first = make_predictor(tmp_path / "data1", uploads="shared", persist=persist)
    for n, size in enumerate([(64, 48), (80, 48), (96, 64)]):
        clip = write_clip(tmp_path / "uploads" / f"clip {n}.mp4", frames=36 + 12 * n, size=size)
        assert first.add_video(clip)["status"] == "added"
    folder = tmp_path / "folder"
    write_clip(folder / "kept.mp4", frames=48, size=(72, 56))
    write_clip(folder / "gone.mp4", frames=60, size=(56, 40))
    sync_folder(first.ingest, folder)
    (folder / "gone.mp4").unlink()
    sync_folder(first.ingest, folder)  # folder:gone.mp4 leaves the shared gallery: a tombstone
    queries = ["a gradient moving to the right", "a colourful pattern", "a dog on a beach"]
    before = [first.search(q, k=10).results for q in queries]
    ids = first.index.ids
    assert len(ids) == 4 and "folder:gone.mp4" not in ids
    first.close()

    def no_extraction(*args, **kwargs):
        raise AssertionError("a persisted video was extracted again")

    from extract.pipeline import VideoExtractor
    monkeypatch.setattr(VideoExtractor, "extract", no_extraction)
    second = make_predictor(tmp_path / "data2", uploads="shared", persist=persist)
    assert not len(second.index)
    t0 = time.perf_counter()
    assert second.ingest.restore() == 4  # the wiring: restore before the demo gallery
    restore_s = time.perf_counter() - t0
    # the folder's kept video is known by its sha256: not extracted again (nothing to add)
    assert sync_folder(second.ingest, folder) == []
    assert second.index.ids == ids
    after = [second.search(q, k=10).results for q in queries]
    for b, a in zip(before, after, strict=True):
        assert [r["video_id"] for r in a] == [r["video_id"] for r in b]
        for rb, ra in zip(b, a, strict=True):
            assert {**ra, "path": ""} == {**rb, "path": ""}
            assert Path(ra["path"]).read_bytes() == Path(rb["path"]).read_bytes()
            if ra["video_id"].startswith("upload:"):
                assert Path(ra["path"]).parent == persist / "media"
    print(f"restored {len(ids)} videos in {restore_s:.2f} s")

    # session uploads never reach the folder
    monkeypatch.undo()
    second.settings.uploads = "session"
    files = snapshot(persist)
    session = second.ensure_session(None)
    clip = write_clip(tmp_path / "uploads" / "private.mp4", frames=30, size=(48, 48))
    assert second.add_video(clip, session)["status"] == "added"
    assert len(session.index) == 1 and snapshot(persist) == files
    second.close()


def wired() -> bool:
    """True once the app has the --persist wiring (an ``AppSettings.persist`` field)."""
    from prvr.serve.settings import AppSettings

    return "persist" in AppSettings.__dataclass_fields__


@pytest.mark.skipif(not wired(), reason="the --persist wiring is not applied (no AppSettings.persist)")
def test_wired_predictor_persists_shared_uploads_only(tmp_path: Path, make_predictor,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The same through the app's own wiring (settings.persist, the ingest service's upload and restore)."""
    from extract.pipeline import VideoExtractor

    persist = tmp_path / "bucket"
    first = make_predictor(tmp_path / "data1", uploads="shared", persist=persist)
    first.ingest.restore()
    assert first.add_video(write_clip(tmp_path / "up" / "shared.mp4", frames=48))["status"] == "added"
    before, ids = first.search("a gradient moving to the right", k=5).results, first.index.ids
    first.close()
    files = snapshot(persist)
    assert sorted(n.split("/")[0] for n in files) == ["entries", "media"]

    original = VideoExtractor.extract
    monkeypatch.setattr(VideoExtractor, "extract", lambda *a, **k: pytest.fail("extracted again"))
    second = make_predictor(tmp_path / "data2", uploads="session", persist=persist)
    second.ingest.restore()
    assert second.index.ids == ids
    after = second.search("a gradient moving to the right", k=5).results
    assert [{**r, "path": ""} for r in after] == [{**r, "path": ""} for r in before]
    assert Path(after[0]["path"]).parent == persist / "media"
    monkeypatch.setattr(VideoExtractor, "extract", original)
    session = second.ensure_session(None)
    private = write_clip(tmp_path / "up" / "private.mp4", frames=30, size=(48, 48))
    assert second.add_video(private, session)["status"] == "added"
    assert snapshot(persist) == files  # a session's upload never reaches the folder
    second.close()
