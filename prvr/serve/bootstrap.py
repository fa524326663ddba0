"""What the app does once, at start: its parts made and the shared gallery brought up to date.

    start(settings) -> Predictor       # the whole start (app.py, scripts and tests call it)
    assemble(settings, loaded, extractor=None) -> Predictor   # the parts only (scripts, tests)

``start``, in order: claim the data dir (``prvr.serve.owner``: a second app on it is refused before any
loading); on ZeroGPU import ``spaces`` before any model (it patches torch); load the model
(``prvr.serve.model_choice``) and warm the search kernels in the background; ``assemble`` the parts (the
extractor chosen once, ``prvr.serve.model_choice.choose_extractor``; the text encoder on the search device;
the confidence references; the shared gallery; the media store; --persist's folder; the ingest service);
sweep what a crash left in the media dir; then, on the extractor's start-up models (CPU on ZeroGPU,
released afterwards), through the ingest service: restore --persist's videos, index the demo gallery and
save to --persist the shared videos it lacks; delete a previous run's session galleries; wait for the
kernels and run one search, so no visitor's search compiles them; then start indexing --gallery's folder in
the background (``prvr.serve.folder``: the app serves meanwhile).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time

from extract.backbones import loaded_once
from extract.words.reader import WordsConfig, WordsReader
from prvr.demo.gallery import build_demo_gallery, interleaved
from prvr.index import open_gallery
from prvr.models.factory import check_features
from prvr.plural import counted
from prvr.results.confidence import Calibrator
from prvr.serve.extraction import Extractor
from prvr.serve.folder import FolderSync
from prvr.serve.ingest import IngestService
from prvr.serve.media import SHARED_MARKER, MediaStore
from prvr.serve.model_choice import (
    LoadedModel,
    choose_extractor,
    load_model,
    search_device,
    warm_search_kernels,
)
from prvr.serve.owner import DataDirLock
from prvr.serve.persist import PersistentStore
from prvr.serve.predictor import Predictor, Serialised
from prvr.serve.settings import AppSettings, on_zerogpu
from prvr.serve.startup import quiet_libraries

log = logging.getLogger(__name__)


def start(settings: AppSettings) -> Predictor:
    """The app's predictor, started (see the module docstring); the data dir stays locked until its
    ``close``."""
    t0 = time.perf_counter()
    owner = DataDirLock(settings.data_dir).acquire()
    try:
        return _start(settings, owner, t0)
    except BaseException:
        owner.release()
        raise


def _start(settings: AppSettings, owner: DataDirLock, t0: float) -> Predictor:
    """``start`` once the data dir is ours."""
    quiet_libraries()
    if on_zerogpu():
        import prvr.serve.zerogpu  # noqa: F401  - imports spaces, which patches torch: before any model
    # the model, the extractor and the text encoder read the same backbones (the bridge: both of the lite
    # profile's): each is loaded once; the text model's trace is kept for the next start
    with loaded_once(traces=settings.data_dir / "traced"):
        log.info("loading the model and its feature extractors")
        loaded = load_model(settings)
        kernels = warm_search_kernels(loaded.model)  # compiles while the gallery renders and extracts
        log.info("loading the feature extractor and text encoder, and the confidence references")
        predictor = assemble(settings, loaded)
    predictor.owner = owner
    sweep_media(predictor)
    ingest = predictor.ingest
    with ingest.starting():
        ingest.restore()
        if not len(predictor.index):
            log.info("first start with %s: rendering and indexing the demo gallery (about a minute on 2 "
                     "cores; later starts reuse it)", settings.data_dir)
        add_demo_gallery(predictor)
        ingest.save_unsaved()
    shutil.rmtree(predictor.sessions_dir, ignore_errors=True)  # sessions of a previous run are gone
    if kernels.is_alive():
        log.info("waiting for the search kernels (still compiling)")
    kernels.join()
    if len(predictor.index):  # load the search kernels now (compiled above), not in a user's search
        predictor.search(predictor.examples[0] if predictor.examples else "a video", k=1)
    log.info("ready in %.1f s: %s in %s", time.perf_counter() - t0, counted(len(predictor.index), "video"),
             predictor.gallery_words())
    # on a first start, searches run the text model eagerly until its TorchScript trace is ready and checked
    # (seconds; later starts loaded the kept trace, and this returns at once); not a daemon: exit waits for it
    # instead of killing it inside torch
    predictor.tracing = threading.Thread(target=predictor.text.backbone.trace, name="trace-text-model")
    predictor.tracing.start()
    if settings.gallery is not None:  # indexed while the app serves (prvr.serve.folder)
        predictor.folder = FolderSync(ingest, settings.gallery, settings.folder_rescan_s,
                                      settings.folder_batch_s).start()
    return predictor


def assemble(settings: AppSettings, loaded: LoadedModel, extractor: Extractor | None = None) -> Predictor:
    """The predictor's parts over a loaded model (``prvr.models.factory``), without the start-up steps.
    ``extractor``: default ``choose_extractor`` (build it in the main thread, before ``launch()``)."""
    model, info, profile = loaded.model, loaded.info, loaded.profile.name
    extractor = extractor or choose_extractor(loaded.profile)
    # queries are encoded in this process: on the CPU on ZeroGPU (a search spends no quota)
    text = loaded.text_encoder(device=search_device())
    check_features(extractor.profile, model)  # a given extractor too: other weights' features are meaningless
    # HF's fast tokenizers refuse concurrent calls ("Already borrowed"): only the tokenizer is serialised,
    # the text model runs in parallel for concurrent searches
    text.backbone.tokenizer = Serialised(text.backbone.tokenizer)
    # confidence: the reference captions, encoded once per model (token features cached in the data dir);
    # every gallery stores each video's scores on them, every search labels hits from those
    calibrator = Calibrator.for_model(model, text, cache_dir=settings.data_dir / "confidence")
    index = open_gallery(model, calibrator.reference_queries, url=settings.index, data_dir=settings.data_dir,
                         profile=profile)
    media = MediaStore(settings.data_dir)
    # --persist: the shared gallery's write-once copy in a bucket folder (prvr.serve.persist)
    persist = (PersistentStore(settings.persist, extractor.profile.identity())
               if settings.persist is not None else None)
    # every way in reads each video's words beside its pictures; the gallery embeds them with the text encoder
    ingest = IngestService(index, media, extractor, settings, persist, words_reader(settings), text.encode)
    return Predictor(settings, model, info, profile, text, calibrator, index, media, ingest)


def words_reader(settings: AppSettings) -> WordsReader:
    """The reader of each video's words, as ``--words`` and ``--speech-weights`` say; speech runs on the
    search device (CUDA when present); on ZeroGPU Whisper's model call runs in GPU slots, its seconds told
    as the frames' are, and pocketsphinx on the CPU."""
    if not on_zerogpu():
        return WordsReader(WordsConfig(mode=settings.words, speech=settings.speech_weights,
                                       device=search_device()))
    # ZeroGPU: Whisper runs in GPU slots (prvr.serve.zerogpu_speech), loaded now, before launch(), to
    # (emulated) CUDA as the frames' models are; pocketsphinx stays on the CPU
    from prvr.serve.zerogpu_speech import load_in_slots

    reader = WordsReader(WordsConfig(mode=settings.words, speech=settings.speech_weights,
                                     device=search_device(), load_speech=load_in_slots))
    reader.prepare()
    return reader


def sweep_media(predictor: Predictor) -> None:
    """Delete what a crash left in the media dir (``MediaStore.sweep``). A Qdrant gallery leaves a marker
    among the data dir's indexes, so that a later start with the built-in index, which cannot read the
    collection, keeps every file it may name instead of deleting them."""
    index, settings = predictor.index, predictor.settings
    own = index.data_folder(settings.data_dir)
    if not own.listed:  # a store elsewhere: its folder holds the marker
        own.path.mkdir(parents=True, exist_ok=True)
        marker = own.path / SHARED_MARKER
        if not marker.exists():
            marker.write_text(f"{settings.index}\n")
    predictor.media.sweep(predictor.media.referenced([index], own.path))


def add_demo_gallery(predictor: Predictor) -> None:
    """Render the demo videos (first start only), index those not indexed yet, and take its example
    queries."""
    chosen = predictor.settings.demo_videos
    gallery = build_demo_gallery(predictor.settings.data_dir / "demo",
                                 video_ids=[v.strip() for v in chosen.split(",")] if chosen else None)
    # the recipe's measured examples (captions the offline default ranks first), else every caption
    predictor.examples = list(gallery.examples) or interleaved(gallery.captions, limit=24)
    predictor.ingest.add_demo(gallery.videos)
