"""The shared gallery kept across restarts in a folder of write-once files (``--persist DIR``, a bucket).

A Space's persistent storage is a mounted bucket that behaves like hf-mount (eventually consistent, writers
uncoordinated, files uploaded on close, no overwrite, rename or unlink-then-create); the working index stays
in ``--data-dir`` and this folder only receives whole files, each created exclusively (``O_CREAT | O_EXCL``)
under its final name, written once and never changed, so replicas cannot clash (equal names, equal bytes):

    DIR/entries/add-<vid>-<sha256>.prvr   a shared video added: feature rows, row times, duration, title,
                                          the media's sha256 and the feature profile
    DIR/entries/del-<vid>-<sha256>.prvr   a tombstone: the add entries (by name) a removal retires
    DIR/entries/wrd-<vid>-<sha256>.prvr   words that joined a video after it was added: the add entries
                                          (by name) they amend and the words (the newest amendment wins)
    DIR/media/<sha256><.ext>              the playable file, named by the sha256 of its bytes
    DIR/media/<sha256>.r<n><.ext>         the same bytes again where an earlier file of that name is cut short

``<vid>``: the first 16 hex digits of sha256(video id); an entry's ``<sha256>``: that of its whole bytes,
which are ``MAGIC``, a JSON header line (kind, video id, title, duration, source sha256, media, profile
identity, written_ns, nonce, array shapes, and ``words``: the video's timed words as a list of
``WordSegment.to_dict()``, absent in entries written before words were read), then ``features`` (n, D),
``start``, ``end`` float32 ``.npy`` (a tombstone has none). Every file is verified before use; one cut
short is skipped with a warning naming it. ``restore()`` answers the live videos, in write order, as
``GalleryVideo``s on their verified media (re-encoded, not re-extracted, their words not read again);
entries of another feature profile are skipped with one log line per profile.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from extract.words.segment import WordSegment
from prvr.index import GalleryVideo
from prvr.plural import counted

log = logging.getLogger(__name__)

MAGIC = b"PRVR-PERSIST 1\n"
FORMAT_VERSION = 1
CHUNK = 1 << 20  # bytes per write and per hashed read
MAX_MEDIA_COPIES = 8  # alternative names tried for media bytes whose first file is cut short
ARRAYS = ("features", "start", "end")


class PersistError(OSError):
    """A file of the persistent folder could not be written whole (the cause is in the message)."""


@dataclass
class Entry:
    """One verified entry file: its name, its header and (adds only) its arrays."""

    name: str
    header: dict
    arrays: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class RestoreReport:
    """What the last ``restore`` found: counts and the names of the files it skipped."""

    restored: int = 0
    removed: int = 0
    damaged: list[str] = field(default_factory=list)  # files cut short or corrupt (entries and media)
    other_profile: int = 0
    seconds: float = 0.0


def video_key(video_id: str) -> str:
    """The 16 hex digits that name a video id in entry file names."""
    return hashlib.sha256(video_id.encode("utf-8")).hexdigest()[:16]


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of some bytes."""
    return hashlib.sha256(data).hexdigest()


def sha256_path(path: Path) -> tuple[str, int]:
    """(hex sha256, size) of a file, read in chunks."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size


def _identity_text(identity: dict | None) -> str:
    """A profile identity as canonical JSON (what two identities are compared by)."""
    return json.dumps(identity, sort_keys=True)


def encode_entry(header: dict, arrays: dict[str, np.ndarray] | None = None) -> bytes:
    """An entry's bytes: MAGIC, the header as one JSON line, then the arrays in ``.npy`` format."""
    out = io.BytesIO()
    out.write(MAGIC)
    out.write(json.dumps(header, sort_keys=True, ensure_ascii=True).encode("ascii") + b"\n")
    for name in header.get("arrays", []):
        np.lib.format.write_array(out, np.ascontiguousarray((arrays or {})[name]), allow_pickle=False)
    return out.getvalue()


def decode_entry(name: str, data: bytes) -> Entry:
    """An entry from its verified bytes (ValueError when they do not parse)."""
    if not data.startswith(MAGIC):
        raise ValueError("not a prvr persistent entry")
    stream = io.BytesIO(data)
    stream.seek(len(MAGIC))
    header = json.loads(stream.readline().decode("ascii"))
    arrays = {k: np.lib.format.read_array(stream, allow_pickle=False) for k in header.get("arrays", [])}
    if stream.read(1):
        raise ValueError("trailing bytes after the arrays")
    return Entry(name, header, arrays)


def write_once(path: Path, chunks) -> int:
    """Create ``path`` exclusively (O_CREAT | O_EXCL) and write ``chunks`` (bytes-likes) into it, then
    close it; FileExistsError when the name exists. Returns the bytes written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    written = 0
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                n = os.write(fd, view[:CHUNK])
                view, written = view[n:], written + n
        os.fsync(fd)
    finally:
        os.close(fd)
    return written


def _file_chunks(path: Path):
    """A file's bytes in chunks."""
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            yield block


class PersistentStore:
    """The ``--persist`` folder: ``record_add`` / ``record_remove`` write files once, ``restore`` reads them
    back (see the module docstring). Thread-safe."""

    def __init__(self, root: Path, profile: dict, verify_media: bool = True) -> None:
        """``profile``: the running feature profile's identity (entries of another are skipped);
        ``verify_media``: hash every media file at restore (False: check its size only)."""
        self.root = Path(root).expanduser()
        self.entries_dir, self.media_dir = self.root / "entries", self.root / "media"
        self.profile, self.verify_media = profile, verify_media
        self.live: dict[str, list[str]] = {}  # video id -> its live add entries' names (this process's view)
        self.report = RestoreReport()
        self._lock = threading.Lock()
        self._last_ns = 0
        for folder in (self.entries_dir, self.media_dir):
            folder.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ writing
    def _written_ns(self) -> int:
        """A wall-clock time in ns, strictly increasing within this process (orders entries)."""
        self._last_ns = max(time.time_ns(), self._last_ns + 1)
        return self._last_ns

    def _write_entry(self, kind: str, video_id: str, header: dict,
                     arrays: dict[str, np.ndarray] | None = None) -> Path:
        """Write one entry under its content-addressed name; a clash (only possible with identical bytes,
        or a file cut short) gets a fresh nonce."""
        for _ in range(3):
            full = dict(header, kind=kind, format_version=FORMAT_VERSION, video_id=video_id,
                        written_ns=self._written_ns(), nonce=secrets.token_hex(8))
            data = encode_entry(full, arrays)
            path = self.entries_dir / f"{kind}-{video_key(video_id)}-{sha256_bytes(data)}.prvr"
            try:
                write_once(path, [data])
                return path
            except FileExistsError:
                continue
        raise PersistError(f"could not write an entry for {video_id!r} in {self.entries_dir}")

    def store_media(self, media: Path) -> dict:
        """Put a playable file into ``media/`` by the sha256 of its bytes, unless a whole copy is there;
        answers {sha256, size, suffix, name}."""
        sha, size = sha256_path(media)
        suffix = media.suffix.lower()
        for n in range(MAX_MEDIA_COPIES):
            name = f"{sha}{suffix}" if n == 0 else f"{sha}.r{n}{suffix}"
            path = self.media_dir / name
            if path.exists():
                if self._media_ok(path, sha, size, full=True):
                    return {"sha256": sha, "size": size, "suffix": suffix, "name": name}
                log.warning("persistent media %s is cut short or damaged; writing the video again beside it",
                            path.name)
                continue
            try:
                written = write_once(path, _file_chunks(media))
            except FileExistsError:  # another writer, just now: verified on the next round
                continue
            if written != size or sha256_path(path)[0] != sha:
                raise PersistError(f"{media} changed while it was copied to {path.name}")
            return {"sha256": sha, "size": size, "suffix": suffix, "name": name}
        raise PersistError(f"{MAX_MEDIA_COPIES} damaged copies of {sha} in {self.media_dir}")

    def record_add(self, video: GalleryVideo, media: Path | None) -> Path:
        """Persist one video added to the shared gallery: its playable ``media`` (None: keep the
        ``video.path`` it has, e.g. a ``--gallery`` file served in place), then its entry; returns the
        entry's path."""
        with self._lock:
            stored = self.store_media(Path(media)) if media is not None else None
            x = np.asarray(video.features, np.float32)
            arrays = {"features": x, "start": np.asarray(video.start, np.float32),
                      "end": np.asarray(video.end, np.float32)}
            header = {"title": video.title, "duration": float(video.duration), "sha256": video.sha256,
                      "media": stored, "path": None if stored else video.path, "profile": self.profile,
                      "rows": int(x.shape[0]), "dim": int(x.shape[1]), "arrays": list(ARRAYS),
                      "words": [w.to_dict() for w in video.words]}
            path = self._write_entry("add", video.id, header, arrays)
            self.live.setdefault(video.id, []).append(path.name)
            return path

    def record_words(self, video_id: str, words: tuple[WordSegment, ...]) -> Path | None:
        """Persist the words that joined a shared video after it was added (``Gallery.set_words``): an entry
        naming the video's add entries it amends, with the words; restore gives those add entries the newest
        such words. None when the folder holds no add entry of the video (nothing to amend)."""
        with self._lock:
            names = sorted(self.live.get(video_id, []))
            if not names:
                return None
            return self._write_entry("wrd", video_id, {"amends": names,
                                                       "words": [w.to_dict() for w in words]})

    def record_remove(self, video_id: str, sha256: str = "") -> Path | None:
        """Persist the removal of a video from the shared gallery: a tombstone naming every add entry of it
        this process knows or can list now. None when the folder holds no entry of it (nothing to retire)."""
        with self._lock:
            listed = {p.name for p in self.entries_dir.glob(f"add-{video_key(video_id)}-*.prvr")}
            names = sorted(listed | set(self.live.pop(video_id, [])))
            if not names:
                return None
            return self._write_entry("del", video_id, {"sha256": sha256, "removes": names})

    # ------------------------------------------------------------------ reading
    def _read_entry(self, path: Path) -> Entry | None:
        """A verified entry, or None with a warning naming the file (cut short, damaged, unreadable)."""
        try:
            data = path.read_bytes()
        except OSError as err:
            log.warning("skipping persistent entry %s: %s", path.name, err)
            return None
        expected = path.stem.rsplit("-", 1)[-1]
        if sha256_bytes(data) != expected:
            log.warning("skipping persistent entry %s: cut short or damaged (%d bytes whose sha256 is not "
                        "the one in its name; a crash before the file was closed)", path.name, len(data))
            self.report.damaged.append(path.name)
            return None
        try:
            return decode_entry(path.name, data)
        except (ValueError, UnicodeDecodeError) as err:
            log.warning("skipping persistent entry %s: %s", path.name, err)
            self.report.damaged.append(path.name)
            return None

    def _media_ok(self, path: Path, sha: str, size: int, full: bool) -> bool:
        """True when ``path`` holds ``size`` bytes (and, with ``full``, their sha256 is ``sha``)."""
        try:
            if path.stat().st_size != size:
                return False
            return not full or sha256_path(path)[0] == sha
        except OSError:
            return False

    def _media_path(self, entry: Entry) -> Path | None:
        """The verified media file of an add entry (its own path when it has no media here), or None with a
        warning naming what is wrong."""
        media = entry.header.get("media")
        if media is None:
            return Path(entry.header["path"]) if entry.header.get("path") else None
        sha, size, suffix = media["sha256"], int(media["size"]), media["suffix"]
        candidates = [self.media_dir / f"{sha}{suffix}"] + [self.media_dir / f"{sha}.r{n}{suffix}"
                                                           for n in range(1, MAX_MEDIA_COPIES)]
        bad = []
        for path in candidates:
            if not path.exists():
                continue
            if self._media_ok(path, sha, size, self.verify_media):
                return path
            bad.append(path.name)
        self.report.damaged.extend(bad)
        log.warning("skipping persisted video %r (entry %s): its media %s", entry.header["video_id"],
                    entry.name, f"{', '.join(bad)} is cut short or damaged" if bad
                    else f"{sha}{suffix} is missing (not uploaded yet?)")
        return None

    def restore(self) -> list[GalleryVideo]:
        """The live persisted videos of this profile, verified, in the order they were written; removals
        applied. Their ``path`` is an absolute path to their verified media."""
        t0 = time.perf_counter()
        with self._lock:
            self.report = RestoreReport()
            entries = [e for p in sorted(self.entries_dir.glob("*.prvr")) if (e := self._read_entry(p))]
            retired = {n for e in entries if e.header.get("kind") == "del"
                       for n in e.header.get("removes", [])}
            adds = sorted((e for e in entries if e.header.get("kind") == "add"),
                          key=lambda e: (e.header["written_ns"], e.name))
            later: dict[str, list] = {}  # add entry -> the newest words that joined it (``record_words``)
            for e in sorted((e for e in entries if e.header.get("kind") == "wrd"),
                            key=lambda e: (e.header["written_ns"], e.name)):
                for name in e.header.get("amends", []):
                    later[name] = e.header.get("words", [])
            others: dict[str, int] = {}
            mine, restored, self.live = _identity_text(self.profile), [], {}
            for entry in adds:
                h = entry.header
                if entry.name in retired:
                    self.report.removed += 1
                    continue
                if _identity_text(h.get("profile")) != mine:
                    other = h.get("profile") or {}
                    key = f"{other.get('name')!r} v{other.get('version')}"
                    others[key] = others.get(key, 0) + 1
                    continue
                if h["video_id"] in self.live:  # the same video added twice (two replicas): first wins
                    self.live[h["video_id"]].append(entry.name)
                    continue
                media = self._media_path(entry)
                if media is None:
                    continue
                self.live[h["video_id"]] = [entry.name]
                a = entry.arrays
                kept = later.get(entry.name, h.get("words", ()))
                words = tuple(WordSegment(**w) for w in kept)  # kept: not read again
                restored.append(GalleryVideo(h["video_id"], a["features"], a["start"], a["end"],
                                             float(h["duration"]), h["title"], str(media), h["sha256"],
                                             words=words))
            for key, n in others.items():
                log.info("skipping %s of feature profile %s (this app runs %r v%s): start with that "
                         "profile to see them", counted(n, "persisted video"), key, self.profile.get("name"),
                         self.profile.get("version"))
            self.report.other_profile = sum(others.values())
            self.report.restored = len(restored)
            self.report.seconds = time.perf_counter() - t0
            return restored

    def describe(self) -> dict:
        """For /info: that the gallery persists, where (the folder's name only), what restore found."""
        r = self.report
        return {"persist": True, "folder": self.root.name, "videos": len(self.live), "restored": r.restored,
                "removed": r.removed, "damaged": len(r.damaged), "other_profile": r.other_profile}

    def words(self, seconds: float | None = None) -> str:
        """One sentence for the log: where the shared gallery persists and what the last restore found
        (``seconds``: the whole restore, adding to the gallery included; default: reading the folder)."""
        r = self.report
        took = r.seconds if seconds is None else seconds
        skipped = f", skipped {counted(len(r.damaged), 'damaged file')} (warnings above)" if r.damaged else ""
        others = f", left {r.other_profile} of another feature profile alone" if r.other_profile else ""
        return (f"persistent gallery in {self.root}: restored {counted(r.restored, 'video')} in {took:.1f} s "
                f"without extracting them{skipped}{others}; new shared videos and removals are saved there")
