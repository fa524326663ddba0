"""The Gradio app: type a sentence, get the videos that contain a matching moment, ranked.

Every result card shows the MS-SL evidence: the total score and its clip/frame branches, a heatmap of the
query's similarity over the video's timeline (cells at their true extent: one per second of a short video,
at most 128) with the key moment and the other moments marked at their true extent,
and a player that plays the video from the app's own ``/prvr/video/<id>`` route (the API's
``video_url``: no server path reaches the page), starts at the key moment (never on a blank card) and jumps
to any marked moment on click. All model, index and upload work happens in ``prvr.serve.predictor.Predictor``;
this file makes the widgets and wires their events (and the named API endpoints) to it. What the widgets show
is ``prvr.serve.page`` (HTML, CSS, script), the app's own HTTP routes and the API's shapes are
``prvr.serve.routes``, what a browser visit leaves behind is ``prvr.serve.visits``, the MCP tools are
``prvr.serve.mcp_tools``; ``main`` and ``serve`` start and stop it.

    python app.py                       # embedded default model and demo gallery, http://127.0.0.1:7860
    python app.py --checkpoint runs/x   # a trained MS-SL checkpoint instead
    python app.py --profile clip --weights clip=/models/siglip   # the CLIP-family zero-shot model
    python app.py --help
"""

from __future__ import annotations

import html
import importlib.util
import logging
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

if __name__ == "__main__":  # before gradio and torch load (seconds): a busy port exits here with one line,
    # then every step is logged with its time. prvr/__init__ imports torch: the stdlib-only start-up module
    # is loaded by its path (and registered, so later imports of it get this very module).
    _spec = importlib.util.spec_from_file_location(
        "prvr.serve.startup", Path(__file__).resolve().parent / "prvr" / "serve" / "startup.py")
    _startup = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_startup)
    _startup.early_start()

import extract  # noqa: F401  - before gradio/torch: applies the torchvision CPU fix

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# Gradio redoes a pandas summary of its last 10,000 events after every event, for /monitoring, which this app
# turns off (launch below): 1.4 ms of CPU a search after 100 searches, 11 ms after 10,000 (issue #45)
os.environ.setdefault("GRADIO_ANALYTICS_CACHE_FREQUENCY", str(2**62))
if importlib.util.find_spec("matplotlib") is None:
    # Gradio tries ``import matplotlib`` twice an event, on its event loop; uninstalled, each try searches
    # sys.path again (Python does not remember a failed import). None in sys.modules fails it at once.
    sys.modules["matplotlib"] = None

import gradio as gr
from gradio import route_utils

from extract.decode import MediaError
from prvr.results.query import QueryError
from prvr.results.response import SearchResponse
from prvr.serve import clips, lifecycle
from prvr.serve.bootstrap import start
from prvr.serve.ingest import pair_sidecars
from prvr.serve.mcp_tools import install as install_mcp
from prvr.serve.owner import DataDirBusy
from prvr.serve.page import (
    CSS,
    HEADER,
    LIVE_WORDS,
    MORE_STEP,
    SEEK_JS,
    SUBTITLES_LABEL,
    TITLE_LABEL,
    card_html,
    folder_line,
    info_markdown,
    more_cards_html,
    refusal_html,
    score_range,
    summary_html,
    upload_intro,
    upload_table,
    words_following,
)
from prvr.serve.predictor import Predictor
from prvr.serve.routes import MAX_TOP_K, api_response, offset_value, routes, top_k_value
from prvr.serve.sessions import SessionGallery
from prvr.serve.settings import AppSettings
from prvr.serve.startup import LOG_FORMAT, PortBusy, stop_heartbeat
from prvr.serve.visits import ClosedSessions, discard_upload_copy

log = logging.getLogger(__name__)

MAX_CARDS = 10  # card slots created at build time; results past them go to the further-results block


def checked_by_the_handler(slider: gr.Slider) -> gr.Slider:
    """``slider``, its value handed over as typed, for the handler to check (a value out of range: a
    one-line message on the page); Gradio's own check raises before the handler, with a traceback in the
    server's log. (Set on the instance: a subclass of a component makes Gradio write a .pyi beside app.py.)"""
    slider.preprocess = lambda payload: payload
    return slider


@dataclass
class CardSlot:
    """The components of one result card, created once and reused for every search."""

    group: gr.Group
    info: gr.HTML  # the card: text, heatmap, moments and the player


def card_updates(results: list[dict], clip_weight: float, root: str,
                 span: tuple[float, float] | None = None) -> list:
    """Updates for every card slot: shown and filled for a result, hidden otherwise (``span``: the colour
    scale, default the results'). Each search's cards carry a fresh id, so a card is drawn again, its player
    back at the key moment, even when a search repeats the last one's results."""
    updates: list = []
    span, search_id = span or score_range(results), uuid.uuid4().hex[:12]
    for i in range(MAX_CARDS):
        if i >= len(results):
            updates += [gr.update(visible=False), gr.update()]
            continue
        updates += [gr.update(visible=True), card_html(results[i], clip_weight, span, root, search_id)]
    return updates


def search_updates(text: str, response: SearchResponse, clip_weight: float, root: str) -> list:
    """The page after a search: the summary, the card slots and the further-results blocks. Top-k is the
    server's (up to ``MAX_TOP_K``): the first ``MAX_CARDS`` results fill the slots, the rest the first block
    under them (as "more" adds them), all on one colour scale."""
    span = score_range(response.results)
    rest = more_cards_html(response.results[MAX_CARDS:], clip_weight, span, root, uuid.uuid4().hex[:12])
    cards = card_updates(response.results[:MAX_CARDS], clip_weight, root, span)
    blocks, filled = search_blocks(rest)
    return [summary_html(text, response)] + cards + more_after(response, text, clip_weight, root, list(span),
                                                                blocks, filled)


def page_root(request: gr.Request) -> str:
    """This app's URL as the browser reaches it (a proxy's forwarded host and scheme included), computed as
    Gradio computes the root of its own file URLs."""
    raw = request.request
    try:
        route = route_utils.get_api_call_path(raw)
    except ValueError:  # an event outside the queue (POST .../run/<name>): Gradio strips the whole path
        route = raw.url.path
    return route_utils.get_root_url(request=raw, route_path=route, root_path=raw.app.root_path)


# ---------------------------------------------------------------------------------------------- UI


def build_ui(predictor: Predictor, sessions: ClosedSessions | None = None) -> gr.Blocks:
    """All widgets and events; per-user data lives only in the session state (``sessions`` only maps a
    browser session to its private gallery, to delete it when the tab closes and to serve its videos)."""
    sessions = sessions if sessions is not None else ClosedSessions()
    settings = predictor.settings
    with gr.Blocks(title="PRVR video search", delete_cache=(3600, 6 * 3600)) as demo:
        # Session-private uploads (public host): a small index in a temp dir, deleted with the session.
        session = gr.State(None, time_to_live=settings.session_ttl_s,
                           delete_callback=SessionGallery.close_if_any)
        gr.HTML(HEADER)
        folder_status(demo, predictor)
        examples = predictor.example_queries()  # demo captions the gallery really shows
        with gr.Tab("Search"):
            with gr.Row(equal_height=True):
                query = gr.Textbox(label="What happens in the moment you are looking for?", scale=5,
                                   max_lines=2, placeholder=f"e.g. {examples[0]}" if examples else
                                   "describe what happens in the moment, in a few words")
                search_btn = gr.Button("Search", variant="primary", scale=1, min_width=120)
            with gr.Row():
                # what the server takes (1-MAX_TOP_K), checked by it: a value out of range is a message
                top_k = gr.Number(value=MAX_CARDS, step=1, label=f"Videos to show (top-k, 1-{MAX_TOP_K})",
                                  elem_id="top-k")
                clip_weight = checked_by_the_handler(gr.Slider(
                    0.0, 1.0, value=predictor.default_clip_weight, step=0.05,
                    label="Clip-scale weight (the frame-scale branch gets the rest)"))
            examples = gr.Examples(examples, inputs=[query], label="Try a demo caption", examples_per_page=8)
            summary = gr.HTML()
            slots = [result_card() for _ in range(MAX_CARDS)]
            more = more_slot()
        with gr.Tab("Add videos"):
            added = add_videos_tab(predictor, session, sessions)
        with gr.Tab("About this model"):
            info = gr.Markdown(info_markdown(predictor.describe()))

        def run_search(text: str, k: float, w: float, state: SessionGallery | None,
                       request: gr.Request) -> list:
            """Search and fill the cards; a bad query becomes a message, not an error dialog."""
            try:
                response = predictor.search(text, top_k_value(k), w, state)
            except QueryError as problem:
                log.warning("search refused: %s", problem)
                return [refusal_html(problem)] + card_updates([], w, "") + more_after(None)
            return search_updates(text, response, w, page_root(request))

        outputs = [summary] + [c for s in slots for c in (s.group, s.info)] + more.outputs
        inputs = [query, top_k, clip_weight, session]
        # outside the queue: one POST a search, no event stream (the page's answer ~100-200 ms sooner on two
        # busy cores: issue #45); a search is milliseconds, run in Gradio's thread pool
        search_events = dict(fn=run_search, inputs=inputs, outputs=outputs, api_visibility="private",
                             queue=False)
        # one event for a search and the live re-rank (a search is milliseconds): the page runs one at a time
        # and then the last asked for, so an answer never lands after a later one (two events' answers did
        # on a busy machine: a top-k change's search of the old text after the new text's)
        gr.on([query.submit, search_btn.click, top_k.change, clip_weight.change], **search_events,
              trigger_mode="always_last")
        examples.load_input_event.then(**search_events)

        def refresh_info(state: SessionGallery | None) -> str:
            """The info panel for this session (its video count changes with uploads)."""
            return info_markdown(predictor.describe(state))

        demo.load(refresh_info, [session], [info], api_visibility="private")
        added.then(refresh_info, [session], [info], api_visibility="private")
        api_endpoints(predictor, session, sessions)
        clip_endpoint(predictor, session)
        more.button.click(lambda *args: show_more(predictor, *args), [more.state, session],
                          more.outputs, api_visibility="private", concurrency_id="search",
                          concurrency_limit=8)
        demo.unload(sessions.close_later)
    return demo


def folder_status(demo: gr.Blocks, predictor: Predictor) -> None:
    """The line on --gallery's folder (its background indexing, prvr.serve.folder), refreshed every few
    seconds; nothing without a folder."""
    if predictor.folder is None:
        return

    def now() -> str:
        """The line as the folder's indexing stands now."""
        return folder_line(predictor.folder.status())

    line = gr.HTML(now(), elem_id="folder-status", padding=False)
    quiet = dict(fn=now, outputs=line, api_visibility="private", queue=False, show_progress="hidden")
    demo.load(**quiet)  # as it stands when the page opens, then every 5 s
    gr.Timer(5).tick(**quiet)


def result_card() -> CardSlot:
    """One hidden card: text + heatmap on the left, the player on the right; heatmap and chip clicks seek."""
    with gr.Group(visible=False, elem_classes="result-card") as group:
        info = gr.HTML(js_on_load=SEEK_JS, padding=False)
    return CardSlot(group, info)


def add_videos_tab(predictor: Predictor, session: gr.State, sessions: ClosedSessions) -> gr.events.Dependency:
    """Upload one or more videos; each goes validate -> transcode -> extract -> index, with progress."""
    # on ZeroGPU: what an upload asks of the visitor's GPU quota
    gr.Markdown(upload_intro(predictor.settings, predictor.gpu_words()))
    files = gr.File(file_count="multiple", file_types=["video"], label="Videos", elem_id="upload-files")
    subtitles = gr.File(file_count="multiple", file_types=[".srt", ".vtt"], elem_id="upload-subtitles",
                        label=SUBTITLES_LABEL)
    title = gr.Textbox(label=TITLE_LABEL, max_lines=1, elem_id="upload-title")
    add_btn = gr.Button("Add to gallery", variant="primary")
    status = gr.Markdown("One row per file will appear here.", min_height=90,  # room for the progress bar
                         elem_id="upload-status")
    owned = gr.State([])  # [title, video id] of each video this browser session added: what it may remove
    with gr.Row(equal_height=True):
        yours = gr.Dropdown([], label="Your uploads", scale=3, elem_id="your-uploads")
        remove_btn = gr.Button("Remove from the gallery", scale=1, elem_id="remove-upload")
    # the table's rows, told again each second while a video's words follow it (it joined by its pictures)
    shown, follow = gr.State([]), gr.Timer(1.0, active=False)

    def add_files(paths: list[str] | None, subtitle_paths: list[str] | None, wanted: str | None,
                  state: SessionGallery | None, mine: list, request: gr.Request,
                  progress: gr.Progress = gr.Progress()  # noqa: B008
                  ) -> tuple:
        """Add every file (with its subtitle file, matched by name), one after the other, and report per
        file; the file lists are emptied (the server's copies are deleted once handled, so a second click
        could not read them). A title (``wanted``) names one video: it is the name the video is found by."""
        unchanged = (state, gr.update(), subtitle_paths, mine, gr.update(), gr.update(), gr.update(),
                     gr.update())
        if not paths:
            return ("Choose one or more video files first.", *unchanged)
        # a file chosen twice comes as one path twice (Gradio keeps one copy per content): add it once
        paths, subtitle_paths = list(dict.fromkeys(paths)), list(dict.fromkeys(subtitle_paths or []))
        wanted = (wanted or "").strip()
        if wanted and len(paths) > 1:
            return (f"A title names one video, and {len(paths)} files are chosen: add them one at a time to "
                    "title each, or leave the title empty.", state, paths, *unchanged[2:])
        rows: list[tuple[str, dict | None]] = []
        mine = list(mine or [])
        # Gradio keeps the user's file names on its copies
        sidecars, unmatched = pair_sidecars([os.path.basename(p) for p in paths], subtitle_paths or [])
        for i, path in enumerate(paths):
            state = sessions.track(request, predictor.ensure_session(state))
            name = os.path.basename(path)
            report = file_progress(progress, i, len(paths), name)
            # the API's way to name an upload: the name it is known by, its stem the title
            known_as = titled_name(name, wanted) if wanted else name
            outcome = predictor.add_video(path, state, progress=report, name=known_as,
                                          subtitles=sidecars.get(name))
            discard_upload_copy(path)
            rows.append((name, outcome))
            record = predictor.video_record(outcome["video_id"], [state] if state is not None else []) \
                if outcome["status"] == "added" else None
            if record is not None:
                mine.append([record.get("title") or record["id"], record["id"]])
        rows += [(os.path.basename(p), None) for p in unmatched]
        for path in subtitle_paths or []:
            discard_upload_copy(path)
        following = any(words_following(o) for _, o in rows)
        return (upload_table(rows), state, None, None, mine, owned_choices(mine),
                "" if wanted else gr.update(), rows, gr.Timer(active=following))

    def remove(video_id: str | None, state: SessionGallery | None, mine: list) -> tuple:
        """Remove one of this session's own uploads from the gallery it joined (no other video: the id must
        be one this session added)."""
        mine = list(mine or [])
        chosen = next((entry for entry in mine if entry[1] == video_id), None)
        if chosen is None:
            return "Choose one of your uploads to remove first.", mine, owned_choices(mine)
        try:
            predictor.remove_upload(video_id, state)
        except QueryError as problem:
            log.warning("remove refused: %s", problem)
            return html.escape(str(problem)), mine, owned_choices(mine)
        mine.remove(chosen)
        return (f"Removed “{html.escape(chosen[0])}”: it is no longer in the gallery.", mine,
                owned_choices(mine))

    def words_progress(rows: list, state: SessionGallery | None) -> tuple[str, list, gr.Timer]:
        """The upload table with its videos' words as they are now (read, or joined)."""
        rows = [(name, (predictor.upload_outcome(o["video_id"], state) or o) if words_following(o) else o)
                for name, o in rows]
        return upload_table(rows), rows, gr.Timer(active=any(words_following(o) for _, o in rows))

    remove_btn.click(remove, [yours, session, owned], [status, owned, yours], api_visibility="private",
                     concurrency_id="heavy", concurrency_limit=1)
    follow.tick(words_progress, [shown, session], [status, shown, follow], api_visibility="private",
                show_progress="hidden", concurrency_limit=None)
    return add_btn.click(add_files, [files, subtitles, title, session, owned],
                         [status, session, files, subtitles, owned, yours, title, shown, follow],
                         api_visibility="private", concurrency_id="heavy", concurrency_limit=1)


def owned_choices(mine: list) -> dict:
    """The "Your uploads" list: this session's uploads by title (their ids as values), none chosen."""
    return gr.update(choices=[(title, video_id) for title, video_id in mine], value=None)


def titled_name(name: str, title: str) -> str:
    """The name an upload titled ``title`` is known by: the title with the file's extension (its stem is the
    title, whatever dots the title holds; a path separator would cut it, so it becomes a dash)."""
    return title.replace("/", "-").replace("\\", "-") + os.path.splitext(name)[1]


def file_progress(progress: gr.Progress, index: int, total: int, name: str) -> Callable[[float, str], None]:
    """Map one file's stage progress (0..1) onto the overall bar."""
    def report(fraction: float, stage: str) -> None:
        progress((index + fraction) / total, desc=f"{name} ({index + 1}/{total}): {stage}")

    return report


def api_endpoints(predictor: Predictor, session: gr.State, sessions: ClosedSessions) -> None:
    """Named endpoints for programs: /search, /add_video and /info (the session state is implicit).

    The functions' names and docstrings are also the MCP tools' names and descriptions (``--mcp``).
    """
    with gr.Row(visible=False):
        query_in, top_k_in = gr.Textbox(label="query"), gr.Number(value=5, precision=0, label="top_k")
        weight_in = gr.Number(value=predictor.default_clip_weight, label="clip_weight")
        upload_in, name_in = gr.File(label="video"), gr.Textbox(value="", label="name")
        subtitles_in = gr.File(label="subtitles")
        results_out, status_out = gr.JSON(label="results"), gr.JSON(label="status")
        info_out = gr.JSON(label="info")
        offset_in = gr.Number(value=0, precision=0, label="offset")
        search_trigger, add_trigger, info_trigger = gr.Button(), gr.Button(), gr.Button()

    def search(query: str, top_k: float, clip_weight: float, offset: float,
               state: SessionGallery | None) -> dict:
        """Find the videos of the gallery that contain a moment matching a sentence, best first.

        Each result has the video id, title, duration, total score and its clip-scale and frame-scale
        parts, a confidence label (high, medium, low or none) and its words on the page (confidence_label:
        strong match, possible match, unconfirmed, no match), the key moment and up to 3 moments (start/end in
        seconds, made of the video's own segments), MS-SL's raw key clip (key_clip), a similarity heatmap
        over the video's timeline (cells with start/end in seconds), and video_url / moment_url to play it
        from this app.
        "no_strong_match" is true when no result is a high-confidence match, "no_match" when every result is
        "none", "calibrated" false when the model's labels were never calibrated (then all are "low").

        Args:
            query: what happens in the moment, e.g. "a clear glass flower figurine seen up close".
            top_k: how many videos to return (1-100).
            clip_weight: share of the clip-scale branch in the score, 0 to 1 (the model's default: 0.7).
            offset: how many of the best results to skip, for a further page (default 0; offset + top_k is
                at most 100): offset 5, top_k 5 gives results 6-10, ranked 6-10.
        """
        try:
            k = top_k_value(top_k)
            response = predictor.search(query, k, float(clip_weight), state, offset_value(offset, k))
        except QueryError as problem:
            log.warning("search refused: %s", problem)
            raise gr.Error(str(problem), print_exception=False) from None
        return api_response(response)

    # subtitles defaults to None: an API client may leave it out (Gradio reads the default from here)
    def add_video(video: str | None, name: str | None, subtitles: str | None = None,
                  state: SessionGallery | None = None, request: gr.Request = None,
                  progress: gr.Progress = gr.Progress()  # noqa: B008
                  ) -> tuple[dict, SessionGallery | None]:
        """Add a video to the searchable gallery (validated, made playable, indexed).

        Returns {status, video_id, message}: status is "added", "duplicate" (the same file is already
        indexed; video_id is the existing one), "rejected" (the message says what is wrong with the file)
        or "error". With session-private uploads (a public host) the video is searchable only in the
        session that added it; each MCP call is a session of its own. Through MCP the tool's input schema
        says which forms of the file it takes (prvr.serve.mcp_tools.add_video_schema).

        Args:
            video: the video file (MP4, MKV, MOV, WebM or AVI).
            name: the file name the video is known by, which titles it (default: the file's own name).
            subtitles: a subtitle file of the video (.srt or .vtt), optional: its lines are searched with
                their times, beside the video's own subtitle tracks, speech and text on screen.
        """
        if not video:
            raise gr.Error("No file was sent.", print_exception=False)
        state = sessions.track(request, predictor.ensure_session(state))
        # Gradio keeps the client's file name on its copy; a name given beside the file wins
        name = name.strip() if name and name.strip() else os.path.basename(video)
        # the same moving progress as the page's (a gradio_client job's status shows it)
        outcome = predictor.add_video(video, state, progress=file_progress(progress, 0, 1, name), name=name,
                                      subtitles=subtitles or None)
        discard_upload_copy(video)
        if subtitles:
            discard_upload_copy(subtitles)
        return outcome, state

    def info(state: SessionGallery | None) -> dict:
        """Describe the model, its feature profile, the number of videos (shared and yours) and the index."""
        return predictor.describe(state)

    # queue=False: besides gradio_client's way (the queue, its limits), a plain HTTP POST to
    # /gradio_api/run/search answers in one request without the event stream, on Spaces too (Gradio closes
    # that route to queued events there); issue #45
    search_trigger.click(search, [query_in, top_k_in, weight_in, offset_in, session], results_out,
                         api_name="search", concurrency_id="search", concurrency_limit=8, queue=False)
    add_trigger.click(add_video, [upload_in, name_in, subtitles_in, session], [status_out, session],
                      api_name="add_video", concurrency_id="heavy", concurrency_limit=1)
    info_trigger.click(info, [session], info_out, api_name="info", concurrency_limit=None)


def clip_endpoint(predictor: Predictor, session: gr.State) -> None:
    """The named endpoint /clip: an MP4 of one span of a video (prvr.serve.clips; the MCP tool ``clip``
    answers the same request with the clip's URL instead)."""
    with gr.Row(visible=False):
        video_in, start_in = gr.Textbox(label="video_id"), gr.Number(label="start")
        end_in = gr.Number(label="end")
        clip_out, clip_trigger = gr.File(label="clip"), gr.Button()

    def clip(video_id: str, start: float, end: float, state: SessionGallery | None) -> Iterator[str]:
        """An MP4 of one moment of a video, e.g. a search result's key_moment: exactly the span from start to
        end (seconds), its first frame the frame at start, with the video's sound when it has some.

        Through MCP the answer is JSON: video_id, title, start, end, duration and clip_url, a URL that
        downloads the MP4. A session's uploads are clipped only in that session.

        Args:
            video_id: the video's id (a search result's video_id).
            start: where the clip starts, in seconds from the video's start (0 or more).
            end: where it ends, in seconds (after start, within the video; at most 600 s after start).
        """
        try:
            wanted = clips.clip_request(predictor, video_id, start, end, [state] if state is not None else [])
        except clips.ClipRefused as refused:
            log.warning("clip refused: %s", refused)
            raise gr.Error(str(refused), print_exception=False) from None
        with predictor.media.work() as folder:  # removed once Gradio has taken its copy and sent it
            try:
                path = clips.make_clip(wanted, folder)
            except MediaError as problem:
                log.warning("clip failed: %s", problem)
                raise gr.Error(f"The clip could not be made: {problem}", print_exception=False) from None
            yield str(path)

    clip_trigger.click(clip, [video_in, start_in, end_in, session], clip_out, api_name="clip",
                       concurrency_id="clip", concurrency_limit=2)


MORE_BLOCKS = -(-(MAX_TOP_K - 1) // MORE_STEP)  # the further-results blocks: as many as "more" can fill


@dataclass
class MoreSlot:
    """Further results under the first cards: one HTML block per addition (a search's results past the card
    slots, then each "more"), so that adding cards leaves the ones shown as they are (Gradio redraws an HTML
    block whose value changes: a player opened in it would go back to its stand-in); the button that adds
    the next ``MORE_STEP``; and what the search was (``more_after``)."""

    blocks: list[gr.HTML]
    button: gr.Button
    state: gr.State  # {"text", "weight", "shown", "span", "root", "filled"} of the page's search, or None

    @property
    def outputs(self) -> list:
        """What a search and the button update, in ``more_after``'s order."""
        return [*self.blocks, self.state, self.button]


def more_slot() -> MoreSlot:
    """The empty, hidden blocks of further results and their hidden button."""
    blocks = [gr.HTML(js_on_load=SEEK_JS, padding=False, visible="hidden") for _ in range(MORE_BLOCKS)]
    button = gr.Button(f"More results (the next {MORE_STEP})", visible=False, elem_id="more-results")
    return MoreSlot(blocks, button, gr.State(None))


def block_updates(filled: int, cards: str | None) -> list:
    """Updates of the further-results blocks: ``cards`` into block ``filled``, every other block left as it
    is; ``cards`` None: every block emptied and hidden (a new search starts)."""
    if cards is None:
        return [gr.update(value="", visible="hidden") for _ in range(MORE_BLOCKS)]
    return [gr.update(value=cards, visible=True) if i == filled else gr.update() for i in range(MORE_BLOCKS)]


def more_after(response: object, text: str = "", weight: float = 0.0, root: str = "",
               span: list[float] | None = None, blocks: list | None = None, filled: int = 0) -> list:
    """Updates of the further-results blocks (``blocks``, default: all emptied), their state and the button,
    after a search (``response``; None: none was made) or after more results (``filled``: the blocks in use
    now; ``span``: the first cards' colour scale): the button offered while the gallery has videos past
    those shown and fewer than ``MAX_TOP_K`` are."""
    blocks = blocks or block_updates(0, None)
    if response is None:
        return [*blocks, None, gr.update(visible=False)]
    count = response.results[-1]["rank"] if response.results else 0
    state = {"text": text, "weight": weight, "shown": count, "root": root,
             "span": span or list(score_range(response.results)), "filled": filled}
    left = response.stats.get("videos", 0) > count and count < MAX_TOP_K
    return [*blocks, state, gr.update(visible=left)]


def search_blocks(rest: str) -> tuple[list, int]:
    """The further-results blocks after a search, and how many are in use: its results past the card slots
    (``rest``, their cards) in the first, every other one emptied."""
    blocks = block_updates(0, None)
    if rest:
        blocks[0] = gr.update(value=rest, visible=True)
    return blocks, int(bool(rest))


def show_more(predictor: Predictor, state: dict | None, session: SessionGallery | None) -> list:
    """The next ``MORE_STEP`` results (up to ``MAX_TOP_K``) in the next block under those shown: the search
    asks for them after the ones shown (``offset``), whose blocks are not sent again."""
    if not state:
        return more_after(None)
    step, filled = min(MORE_STEP, MAX_TOP_K - state["shown"]), state.get("filled", 0)
    try:
        response = predictor.search(state["text"], step, state["weight"], session, offset=state["shown"])
    except QueryError as problem:  # the search on the page was accepted: only a change of the gallery's
        log.warning("more results refused: %s", problem)
        return [*block_updates(filled, refusal_html(problem)), state, gr.update(visible=False)]
    if not response.results:
        return [*(gr.update() for _ in range(MORE_BLOCKS)), state, gr.update(visible=False)]
    cards = more_cards_html(response.results, state["weight"], tuple(state["span"]), state["root"],
                            uuid.uuid4().hex[:12])
    # one colour scale for every card of the search: the first cards'
    return more_after(response, state["text"], state["weight"], state["root"], state["span"],
                      block_updates(filled, cards), filled + 1)


def main(argv: list[str] | None = None) -> int:
    """Parse settings, claim the data dir, open (or build) the index, serve until Ctrl-C / SIGTERM; the exit
    status (0: stopped while serving, 130: stopped while starting, 2: could not start, with one line saying
    why). A stop signal is acted on at any moment (``prvr.serve.lifecycle``)."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    lifecycle.install()  # done already under ``python app.py`` (before the imports): the same one
    settings = AppSettings.from_args(argv)
    try:
        predictor = start(settings)
    except DataDirBusy as busy:
        print(f"error: {busy}", file=sys.stderr)
        return 2
    try:
        return serve(predictor, settings)
    finally:
        predictor.close()


def launch(demo: gr.Blocks, predictor: Predictor, sessions: ClosedSessions, host: str, port: int,
           quiet: bool = False) -> None:
    """Start the web server of ``demo`` over ``predictor`` in a thread, with the app's routes (and MCP's
    tools where ``--mcp`` asks); returns once it answers."""
    settings = predictor.settings
    demo.launch(server_name=host, server_port=port, css=CSS, theme=gr.themes.Soft(primary_hue="indigo"),
                max_file_size=settings.max_upload_mb * gr.FileSize.MB, footer_links=["api", "gradio"],
                mcp_server=settings.mcp, prevent_thread_lock=True, i18n=gr.I18n(en=LIVE_WORDS), quiet=quiet,
                enable_monitoring=False,  # no /monitoring: its summary is not kept up (above)
                app_kwargs={"routes": routes(predictor, sessions)},
                # Gradio then probes the page with a HEAD that it gives up on after one 3 s timeout, and
                # fails the launch as "localhost is not accessible" (seen on a busy 2-core machine, where the
                # first page can take longer). launch() has fetched its startup events from this very
                # server already, which is what the probe wants to know; the private flag only skips it.
                _frontend=False)
    if settings.mcp:
        install_mcp(demo, predictor)


def serve(predictor: Predictor, settings: AppSettings) -> int:
    """Launch the app over ``predictor`` and block until a stop signal (SIGINT or SIGTERM) or the server's
    end; 0, or 2 if the port was taken meanwhile."""
    sessions = ClosedSessions()
    demo = build_ui(predictor, sessions)
    demo.queue(max_size=64, default_concurrency_limit=2)
    log.info("starting the web server")
    try:
        launch(demo, predictor, sessions, settings.host, settings.port)
    except OSError as err:  # the port was free at start-up, taken since
        print(f"error: {PortBusy(settings.host, settings.port, str(err).split('.')[0]).message}",
              file=sys.stderr)
        return 2
    stop_heartbeat()
    life = lifecycle.install()
    life.serving()  # before the line that says so: a signal after it stops a serving app (exit 0)
    log.info("serving at %s (%s)", demo.local_url, life.how_to_stop())
    life.wait_while(lambda: demo.is_running)
    log.info("stopping: closing the server and waiting for background work")
    demo.close()
    return 0


if __name__ == "__main__":
    lifecycle.finish(main())  # what it opened is closed: exit without torch's seconds of native teardown
