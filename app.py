"""The Gradio app: type a sentence, get the videos that contain a matching moment, ranked.

Every result card shows the MS-SL evidence: the total score and its clip/frame branches, a heatmap of the
query's similarity over the video's timeline (cells at their true extent: one per second of a short video,
at most 128) with the key moment and the other moments marked at their true extent,
and a player that plays the video from the app's own ``/prvr/video/<id>`` route (the API's
``video_url``: no server path reaches the page), starts at the key moment (never on a blank card) and jumps
to any marked moment on click. All model, index and upload work happens in ``prvr.serve.predictor.Predictor``;
this file only turns its results into widgets.

    python app.py                       # embedded default model and demo gallery, http://127.0.0.1:7860
    python app.py --checkpoint runs/x   # a trained MS-SL checkpoint instead
    python app.py --profile clip --weights clip=/models/siglip   # the CLIP-family zero-shot model
    python app.py --help
"""

from __future__ import annotations

import contextlib
import html
import logging
import os
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

if __name__ == "__main__":  # before gradio and torch load (seconds): a busy port exits here with one line,
    # then every step is logged with its time. prvr/__init__ imports torch: the stdlib-only start-up module
    # is loaded by its path (and registered, so later imports of it get this very module).
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "prvr.serve.startup", Path(__file__).resolve().parent / "prvr" / "serve" / "startup.py")
    _startup = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_startup)
    _startup.early_start()

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

import extract  # noqa: F401  - before gradio/torch: applies the torchvision CPU fix

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr
from gradio import route_utils

from prvr.index import check_k
from prvr.results.confidence import summary_words
from prvr.results.moments import play_from
from prvr.results.query import QueryError
from prvr.results.response import SearchResponse
from prvr.serve import lifecycle, mcp_tools
from prvr.serve.owner import DataDirBusy
from prvr.serve.predictor import Predictor
from prvr.serve.sessions import SessionGallery
from prvr.serve.settings import AppSettings
from prvr.serve.startup import LOG_FORMAT, PortBusy, stop_heartbeat
from prvr.words import counted

log = logging.getLogger(__name__)

MAX_CARDS = 10  # card slots created at build time; the top-k slider cannot go beyond
CLEARLY_T = 3.0  # "stands out" this much is "clearly better": the three-sigma level moments refine at
# (prvr.results.moments.MomentConfig.descend_t)
MAX_TOP_K = 100  # the API's top_k range is 1-100 (the UI shows at most MAX_CARDS)
CLOSED_SESSION_GRACE_S = 120.0  # a closed browser tab's private uploads are deleted this long after
HEAT_STOPS = ((238, 242, 255), (129, 140, 248), (190, 18, 60))  # pale -> indigo -> crimson

# In the browser, per card (no round trip): clicking a heatmap bin, a moment's outline or a moment chip seeks
# the card's player; a new search (its id on the card) puts the player back at its start. Gradio redraws an
# HTML value by patching the old DOM, so a player showing the same video again is the same element, at the
# position it was left at; a new element starts at its src's media fragment (#t=) by itself.
SEEK_JS = """
element.addEventListener('click', (event) => {
  const target = event.target.closest('[data-t]');
  const player = element.querySelector('video.player');
  if (target && player) player.currentTime = parseFloat(target.dataset.t);
});
new MutationObserver(() => element.querySelectorAll('video.player').forEach((player) => {
  const start = () => { player.currentTime = parseFloat(player.dataset.start); };
  if (player.readyState >= 1) start(); else player.addEventListener('loadedmetadata', start, {once: true});
})).observe(element, {subtree: true, attributes: true, attributeFilter: ['data-search']});
"""

CSS = """
.prvr-header h1 {margin-bottom: 0.2em}
.prvr-header p {margin-top: 0; opacity: 0.8}
.result-card {padding: 10px 12px !important; border-radius: 12px !important}
.card-head {display: flex; align-items: baseline; gap: 10px; flex-wrap: wrap}
.card-head .rank {font-weight: 700; font-size: 1.25em; color: var(--color-accent)}
.card-head .title {font-weight: 600; font-size: 1.1em}
.card-head .vid {opacity: 0.6; font-size: 0.85em}
.badge {border-radius: 999px; padding: 1px 10px; font-size: 0.82em; font-weight: 600}
.badge-high {background: #dcfce7; color: #166534}
.badge-medium {background: #fef9c3; color: #854d0e}
.badge-low {background: #f1f5f9; color: #475569}
.badge-none {background: #fee2e2; color: #991b1b}
.badge-mine {background: #e0e7ff; color: #3730a3}
.scores {margin: 4px 0 8px; font-size: 0.9em; opacity: 0.85; font-variant-numeric: tabular-nums}
.heat-wrap {position: relative; margin-top: 4px}
.heat {width: 100%; height: 64px; display: block; border-radius: 6px; cursor: pointer}
.heat rect.bin:hover {stroke: #111827; stroke-width: 2}
.mlabel {position: absolute; top: -9px; transform: translateX(-50%); font-size: 11px; font-weight: 700;
  background: #111827; color: white; border-radius: 999px; padding: 0 6px; cursor: pointer}
.mlabel.key {background: #be123c}
.axis {display: flex; justify-content: space-between; font-size: 0.78em; opacity: 0.65}
.chips {display: flex; flex-wrap: wrap; gap: 6px; margin-top: 8px}
.chip {border: 1px solid var(--border-color-primary); border-radius: 999px; padding: 3px 11px;
  background: var(--background-fill-secondary); cursor: pointer; font-size: 0.86em}
.chip.key {border-color: #be123c; color: #be123c; font-weight: 600}
.chip:hover {filter: brightness(0.95)}
.hint {font-size: 0.8em; opacity: 0.65; margin-top: 6px}
.card-body {display: grid; grid-template-columns: minmax(0, 3fr) minmax(0, 2fr); gap: 14px;
  align-items: start}
.card-body .player {width: 100%; max-height: 260px; background: #000; border-radius: 8px}
@media (max-width: 760px) {.card-body {grid-template-columns: 1fr}}
.summary {padding: 8px 12px; border-radius: 10px; background: var(--background-fill-secondary)}
.summary.abstain {background: #fff7ed; color: #9a3412}
/* the upload table: words stay whole (Gradio's prose tables wrap "anywhere", which squeezed the result column
   to "rejecte/d"); a long file name still breaks where it must */
#upload-status td, #upload-status th {overflow-wrap: break-word; word-break: normal}
#upload-status td:nth-child(2) {white-space: nowrap}
"""


@dataclass
class CardSlot:
    """The components of one result card, created once and reused for every search."""

    group: gr.Group
    info: gr.HTML  # the card: text, heatmap, moments and the player


# ------------------------------------------------------------------------------------------ rendering


def clock(seconds: float) -> str:
    """Seconds as m:ss (h:mm:ss past an hour)."""
    s = max(0, int(round(seconds)))
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


def heat_colour(x: float) -> str:
    """CSS colour for a normalised score in [0, 1] on the pale -> indigo -> crimson scale."""
    x = min(max(x, 0.0), 1.0) * (len(HEAT_STOPS) - 1)
    i = min(int(x), len(HEAT_STOPS) - 2)
    a, b, f = HEAT_STOPS[i], HEAT_STOPS[i + 1], x - i
    return "rgb({},{},{})".format(*(round(p + (q - p) * f) for p, q in zip(a, b, strict=True)))


def heatmap_svg(result: dict, score_range: tuple[float, float]) -> str:
    """The similarity strip (each heatmap cell and each moment drawn over its own seconds) with the
    moments outlined (the key moment in red) and the key clip's frame attention."""
    duration = max(result["duration"], 1e-6)
    lo, hi = score_range
    heat = result["heatmap"]
    parts = []
    for start, end, score in zip(heat["start"], heat["end"], heat["score"], strict=True):
        x, w = 1000 * start / duration, max(1000 * (end - start) / duration, 1.0)
        parts.append(f'<rect class="bin" data-t="{start:.2f}" x="{x:.1f}" y="0" width="{w:.1f}" height="44" '
                     f'fill="{heat_colour((score - lo) / (hi - lo))}"><title>{clock(start)}-{clock(end)}: '
                     f'{score:.3f}</title></rect>')
    for i, moment in enumerate(moments_of(result)):
        x, w = 1000 * moment["start"] / duration, 1000 * (moment["end"] - moment["start"]) / duration
        style = 'stroke="#be123c" stroke-width="5"' if i == 0 else 'stroke="#111827" stroke-width="3" ' \
                                                                  'stroke-dasharray="10 6"'
        parts.append(f'<rect data-t="{play_from(moment):.2f}" x="{x:.1f}" y="2" width="{max(w, 4):.1f}" '
                     f'height="40" fill="none" {style}/>')
    attention = result.get("attention") or {}
    if attention.get("time"):
        top = max(max(attention["weight"]), 1e-9)
        points = " ".join(f"{1000 * t / duration:.1f},{62 - 14 * w / top:.1f}"
                          for t, w in zip(attention["time"], attention["weight"], strict=True))
        parts.append(f'<polyline points="{points}" fill="none" stroke="#f59e0b" stroke-width="2">'
                     "<title>frame-scale attention of the key moment</title></polyline>")
    labels = "".join(
        f'<span class="mlabel{" key" if i == 0 else ""}" data-t="{play_from(m):.2f}" '
        f'style="left:{100 * (m["start"] + m["end"]) / 2 / duration:.2f}%">{"★" if i == 0 else i + 1}</span>'
        for i, m in enumerate(moments_of(result)))
    axis = "".join(f"<span>{clock(t)}</span>" for t in (0, duration / 2, duration))
    return (f'<div class="heat-wrap">{labels}<svg class="heat" viewBox="0 0 1000 64" '
            f'preserveAspectRatio="none" role="img" aria-label="similarity over time">{"".join(parts)}</svg>'
            f'</div><div class="axis">{axis}</div>')


def moments_of(result: dict) -> list[dict]:
    """The key moment, then the other moments (Contract 4: ``moments`` starts with the key moment)."""
    return [result["key_moment"], *result["moments"][1:]]


def card_html(result: dict, clip_weight: float, score_range: tuple[float, float], root: str = "",
              search_id: str = "") -> str:
    """A result card: its text, heatmap and moment chips, and its player (``player_html``) beside them."""
    confidence = result["confidence"]
    chips = "".join(
        f'<button class="chip{" key" if i == 0 else ""}" data-t="{play_from(m):.2f}" '
        f'title="{html.escape(stands_out_words(m))}">'
        f'{"★ key moment" if i == 0 else f"moment {i + 1}"} · {clock(m["start"])}-{clock(m["end"])} '
        f'· stands out {m["contrast"]:.1f}</button>'
        for i, m in enumerate(moments_of(result)))
    hint = ("The player starts at the key moment. Click the strip or a moment to jump. “Stands out” says how "
            "much better the query matches inside a moment than in the rest of the video, in standard "
            f"errors (a t statistic): 0 is no better, {CLEARLY_T:g} or more is clearly better; moments are "
            "ordered by it. Strip: similarity of each second of the video (longer videos: of each stretch; "
            "darker is closer); ★ key moment; orange line: where the frame branch looked.")
    mine = '<span class="badge badge-mine">your upload</span>' if result.get("source") == "session" else ""
    head = (f'<div class="card-head"><span class="rank">#{result["rank"]}</span>'
            f'<span class="title">{html.escape(result["title"])}</span>'
            f'<span class="badge badge-{confidence}">{html.escape(result["confidence_label"])}</span>{mine}'
            f'<span class="vid">{html.escape(result["video_id"])} · {clock(result["duration"])}</span></div>')
    scores = (f'<div class="scores">score <b>{result["score"]:.3f}</b> = {clip_weight:.2f} × clip '
              f'{result["clip_score"]:.3f} + {1 - clip_weight:.2f} × frame {result["frame_score"]:.3f}</div>')
    text = (f'{head}{scores}{heatmap_svg(result, score_range)}<div class="chips">{chips}</div>'
            f'<div class="hint">{hint}</div>')
    return (f'<div class="card-body" data-search="{search_id}"><div class="card-text">{text}</div>'
            f'{player_html(result, root)}</div>')


def player_html(result: dict, root: str) -> str:
    """The result's player: its video from this app's video route under ``root`` (the page's URL), as API
    clients fetch it (no server path), starting at ``start_position`` (a media fragment)."""
    start = f"{start_position(result):.2f}"
    src = f"{root}{video_url(result['video_id'])}#t={start}"
    return (f'<video class="player" controls preload="auto" playsinline src="{html.escape(src)}" '
            f'data-start="{start}" aria-label="{html.escape(result["title"])}"></video>')


def stands_out_words(moment: dict) -> str:
    """A moment chip's tooltip: what its "stands out" number means, on what scale."""
    t = moment["contrast"]
    how = (f"clearly better than in the rest of the video, by {t:.1f} standard errors" if t >= CLEARLY_T else
           f"better than in the rest of the video, by {t:.1f} standard errors" if t > 0 else
           "no better than in the rest of the video")
    return (f"Stands out {t:.1f}: the query matches here {how} (a t statistic: 0 is no better, "
            f"{CLEARLY_T:g} or more is clearly better). Click to play from {clock(play_from(moment))}.")


def searched_note(query: dict) -> str:
    """What cleaning and the text model did to the query, in words ("" when it was read as typed)."""
    notes = []
    if query.get("tokens_read") is not None and query.get("tokens", 0) > query["tokens_read"]:
        words = query.get("words_read")
        read = f"about its first {words:,} words" if words else "its beginning"
        tail = query.get("read_until")
        notes.append(f"the text model reads at most {query['tokens_read']} tokens: of your "
                     f"{query['original_chars']:,}-character query it read {read}"
                     + (f", up to “{html.escape(tail)}”" if tail else ""))
    elif query.get("truncated"):
        notes.append(f"your {query['original_chars']:,}-character query was shortened to its first "
                     f"{len(query['text']):,} characters (the limit is {query['max_chars']:,})")
    if query.get("replaced_controls"):
        n = query["replaced_controls"]
        notes.append(f"{n} control character{'s' if n > 1 else ''} became space{'s' if n > 1 else ''}")
    return f'<div class="hint">Note: {"; ".join(notes)}.</div>' if notes else ""


def summary_html(query: str, response: SearchResponse) -> str:
    """One line above the cards: what was searched (as cleaned) and plainly when nothing matches well."""
    if not response.results:
        return '<div class="summary">The gallery is empty: add videos in the "Add videos" tab.</div>'
    searched = response.query.get("text", query)  # the cleaned, possibly shortened text
    q, note = html.escape(searched), searched_note(response.query)
    kind, words = summary_words([r["confidence"] for r in response.results], response.calibrated)
    if kind != "strong":  # the words come from prvr.results.confidence, one vocabulary with the labels
        title = {"none": "No match", "uncalibrated": "Unconfirmed"}.get(kind, "No confident match")
        return f'<div class="summary abstain"><b>{title}</b> for “{q}”: {words}{note}</div>'
    return f'<div class="summary">{words} for “{q}”.{note}</div>'


def score_range(results: list[dict]) -> tuple[float, float]:
    """Common colour scale for all cards of one query, so heatmaps compare across videos."""
    scores = [s for r in results for s in r["heatmap"]["score"]]
    lo, hi = (min(scores), max(scores)) if scores else (0.0, 1.0)
    return lo, max(hi, lo + 1e-6)


def top_k_value(top_k: object, limit: int = MAX_TOP_K) -> int:
    """``top_k`` as a whole number from 1 to ``limit``, else a QueryError saying the range."""
    try:
        value = float(top_k)
    except (TypeError, ValueError):
        value = None
    k = int(value) if value is not None and value.is_integer() else top_k
    try:
        return check_k(k, limit)
    except QueryError:
        raise QueryError(f"top_k must be a whole number from 1 to {limit}, got {top_k!r}") from None


def start_position(result: dict) -> float:
    """Where a result's player starts: its key moment's ``play_from`` (its first row's frame, never a blank
    card, where the moment's first second may still show one)."""
    return play_from(result["key_moment"])


def card_updates(results: list[dict], clip_weight: float, root: str) -> list:
    """Updates for every card slot: shown and filled for a result, hidden otherwise. Each search's cards
    carry a fresh id, so a card is drawn again, its player back at the key moment, even when a search
    repeats the last one's results."""
    updates: list = []
    span, search_id = score_range(results), uuid.uuid4().hex[:12]
    for i in range(MAX_CARDS):
        if i >= len(results):
            updates += [gr.update(visible=False), gr.update()]
            continue
        updates += [gr.update(visible=True), card_html(results[i], clip_weight, span, root, search_id)]
    return updates


def page_root(request: gr.Request) -> str:
    """This app's URL as the browser reaches it (a proxy's forwarded host and scheme included), computed as
    Gradio computes the root of its own file URLs."""
    raw = request.request
    return route_utils.get_root_url(request=raw, route_path=route_utils.get_api_call_path(raw),
                                    root_path=raw.app.root_path)


def info_markdown(info: dict) -> str:
    """The info panel: which model, which features, how many videos, which index."""
    model = info["model"]
    lines = [f"**Model:** {model['name']}", f"{model['description']}"]
    if model.get("why"):
        lines.append(f"**Why this model:** {model['why']}")
    if model.get("metrics"):
        metrics = (f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                   for k, v in model["metrics"].items())
        lines.append("**Validation metrics:** " + ", ".join(metrics))
    lines += [f"**Features:** {info['profile']['name']} profile: {info['profile']['description']}",
              f"**Gallery:** {counted(info['videos'], 'video')} ({info['shared_videos']} shared"
              + (f", {info['session_videos']} only in your session)" if info.get("session_videos") else ")"),
              f"**Index:** {info['index']}", f"**Uploads:** {info['uploads']}"]
    if "confidence" in info:  # prvr.results.confidence.describe_calibration
        about = info["confidence"]
        lines.append("**Confidence labels:** " + (f"calibrated ({about['source'].get('data', about['file'])})"
                                                   if about["calibrated"] else about["reason"]))
    return "\n\n".join(lines)


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
        gr.HTML('<div class="prvr-header"><h1>Find the moment in long videos</h1><p>Partially Relevant Video '
                "Retrieval with MS-SL: type what happens; every video that contains it is ranked, with where "
                "it happens and how sure the model is.</p></div>")
        examples = predictor.example_queries()  # demo captions the gallery really shows
        with gr.Tab("Search"):
            with gr.Row(equal_height=True):
                query = gr.Textbox(label="What happens in the moment you are looking for?", scale=5,
                                   max_lines=2, placeholder=f"e.g. {examples[0]}" if examples else
                                   "describe what happens in the moment, in a few words")
                search_btn = gr.Button("Search", variant="primary", scale=1, min_width=120)
            with gr.Row():
                top_k = gr.Slider(1, MAX_CARDS, value=5, step=1, label="Videos to show (top-k)")
                clip_weight = gr.Slider(0.0, 1.0, value=predictor.default_clip_weight, step=0.05,
                                        label="Clip-scale weight (the frame-scale branch gets the rest)")
            examples = gr.Examples(examples, inputs=[query], label="Try a demo caption", examples_per_page=8)
            summary = gr.HTML()
            slots = [result_card() for _ in range(MAX_CARDS)]
        with gr.Tab("Add videos"):
            added = add_videos_tab(predictor, session, sessions)
        with gr.Tab("About this model"):
            info = gr.Markdown(info_markdown(predictor.describe()))

        def run_search(text: str, k: float, w: float, state: SessionGallery | None,
                       request: gr.Request) -> list:
            """Search and fill the cards; a bad query becomes a message, not an error dialog."""
            try:
                response = predictor.search(text, top_k_value(k, MAX_CARDS), w, state)
            except QueryError as problem:
                log.warning("search refused: %s", problem)
                message = f'<div class="summary">{html.escape(str(problem))}</div>'
                return [message] + card_updates([], w, "")
            return [summary_html(text, response)] + card_updates(response.results, w, page_root(request))

        outputs = [summary] + [c for s in slots for c in (s.group, s.info)]
        inputs = [query, top_k, clip_weight, session]
        search_events = dict(fn=run_search, inputs=inputs, outputs=outputs, api_visibility="private",
                             concurrency_id="search", concurrency_limit=8)
        query.submit(**search_events)
        search_btn.click(**search_events)
        examples.load_input_event.then(**search_events)
        # live re-rank: a search is milliseconds
        top_k.change(**search_events, trigger_mode="always_last")
        clip_weight.change(**search_events, trigger_mode="always_last")

        def refresh_info(state: SessionGallery | None) -> str:
            """The info panel for this session (its video count changes with uploads)."""
            return info_markdown(predictor.describe(state))

        demo.load(refresh_info, [session], [info], api_visibility="private")
        added.then(refresh_info, [session], [info], api_visibility="private")
        api_endpoints(predictor, session, sessions)
        demo.unload(sessions.close_later)
    return demo


def result_card() -> CardSlot:
    """One hidden card: text + heatmap on the left, the player on the right; heatmap and chip clicks seek."""
    with gr.Group(visible=False, elem_classes="result-card") as group:
        info = gr.HTML(js_on_load=SEEK_JS, padding=False)
    return CardSlot(group, info)


def add_videos_tab(predictor: Predictor, session: gr.State, sessions: ClosedSessions) -> gr.events.Dependency:
    """Upload one or more videos; each goes validate -> transcode -> extract -> index, with progress."""
    settings = predictor.settings
    limits = f"Up to {settings.max_upload_mb} MB and {settings.max_duration_s / 60:.0f} minutes each"
    gpu = predictor.gpu_words()  # on ZeroGPU: what an upload asks of the visitor's GPU quota
    if settings.uploads == "session":
        gr.Markdown(f"Videos you add are private to your browser session and deleted when it ends. {limits}, "
                    f"{settings.max_uploads_per_session} per session.{gpu}")
    else:
        gr.Markdown(f"Videos you add join the shared gallery and stay after a restart. {limits}.{gpu}")
    files = gr.File(file_count="multiple", file_types=["video"], label="Videos", elem_id="upload-files")
    add_btn = gr.Button("Add to gallery", variant="primary")
    status = gr.Markdown("One row per file will appear here.", min_height=90,  # room for the progress bar
                         elem_id="upload-status")

    def add_files(paths: list[str] | None, state: SessionGallery | None, request: gr.Request,
                  progress: gr.Progress = gr.Progress()) -> tuple[str, SessionGallery | None, None]:  # noqa: B008
        """Add every file, one after the other, and report per file; the file list is emptied (the
        server's copies are deleted once handled, so a second click could not read them)."""
        if not paths:
            return "Choose one or more video files first.", state, None
        rows = ["| file | result | details |", "|---|---|---|"]
        for i, path in enumerate(paths):
            state = sessions.track(request, predictor.ensure_session(state))
            name = os.path.basename(path)  # Gradio keeps the user's file name on its copy
            report = file_progress(progress, i, len(paths), name)
            outcome = predictor.add_video(path, state, progress=report, name=name)
            discard_upload_copy(path)
            rows.append(f"| {md_cell(name)} | {outcome['status']} | {md_cell(outcome['message'])} |")
        return "\n".join(rows), state, None

    return add_btn.click(add_files, [files, session], [status, session, files], api_visibility="private",
                         concurrency_id="heavy", concurrency_limit=1)


def file_progress(progress: gr.Progress, index: int, total: int, name: str) -> Callable[[float, str], None]:
    """Map one file's stage progress (0..1) onto the overall bar."""
    def report(fraction: float, stage: str) -> None:
        progress((index + fraction) / total, desc=f"{name} ({index + 1}/{total}): {stage}")

    return report


def md_cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return html.escape(text).replace("|", "\\|").replace("\n", " ")


def discard_upload_copy(path: str) -> None:
    """Delete Gradio's cached copy of an upload once handled: the index keeps its own playable copy, and
    Gradio's would otherwise stay until its cache sweep (hours), doubling the disk an upload takes."""
    cache = Path(gr.utils.get_upload_folder()).resolve()
    copy = Path(path).resolve()
    if copy.is_relative_to(cache) and copy.parent != cache:
        copy.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            copy.parent.rmdir()  # Gradio's per-upload folder, once empty


class ClosedSessions:
    """Deletes a browser session's private uploads shortly after its tab closes (Gradio itself keeps a
    closed session's state for an hour, and ``time_to_live`` counts from the session's start)."""

    def __init__(self, grace_s: float = CLOSED_SESSION_GRACE_S) -> None:
        self.grace_s, self._lock = grace_s, threading.Lock()
        self._galleries: dict[str, SessionGallery] = {}

    def track(self, request: gr.Request | None, gallery: SessionGallery | None) -> SessionGallery | None:
        """Remember which browser session owns ``gallery`` (None: shared uploads, nothing to track)."""
        if gallery is not None and request is not None and request.session_hash:
            with self._lock:
                self._galleries[request.session_hash] = gallery
        return gallery

    def galleries(self) -> list[SessionGallery]:
        """The live tracked galleries (those deleted by their time-to-live are forgotten here)."""
        with self._lock:
            for key in [k for k, g in self._galleries.items() if not g.root.exists()]:
                del self._galleries[key]
            return list(self._galleries.values())

    def close_later(self, request: gr.Request) -> None:
        """``demo.unload`` handler: delete the closed session's uploads after the grace period."""
        with self._lock:
            gallery = self._galleries.pop(request.session_hash, None) if request.session_hash else None
        if gallery is not None:
            timer = threading.Timer(self.grace_s, gallery.close)
            timer.daemon = True
            timer.start()


VIDEO_ROUTE = "/prvr/video/"  # + a video id: the video file, for API clients (no server paths)
INFO_ROUTE = "/info"  # which model runs and why, the profile, video counts, the index: JSON


def info_route(predictor: Predictor) -> Route:
    """``GET /info``: ``Predictor.describe()`` of the shared gallery as JSON (the /info API endpoint and
    the MCP tool add the caller's session uploads)."""
    async def serve(request: Request) -> Response:
        return JSONResponse(predictor.describe())

    return Route(INFO_ROUTE, serve, methods=["GET"])


def video_route(predictor: Predictor, sessions: ClosedSessions) -> Route:
    """``GET /prvr/video/<video id>``: a gallery video (or a live session upload) by id, with HTTP ranges."""
    async def serve(request: Request) -> Response:
        path = predictor.video_file(request.path_params["video_id"], sessions.galleries())
        if path is None or not path.is_file():
            return PlainTextResponse("no video with this id", status_code=404)
        return FileResponse(path, media_type="video/mp4" if path.suffix == ".mp4" else None)

    return Route(VIDEO_ROUTE + "{video_id:path}", serve, methods=["GET", "HEAD"])


def api_result(result: dict) -> dict:
    """A result for API clients: no server path, but a ``video_url`` to fetch the video from this app
    and a ``moment_url`` that starts playback at the key moment's ``play_from`` (a media fragment,
    ``#t=<seconds>``).

    gradio_client treats any dict with a string "path" as a file to download, which would replace the
    whole result by a downloaded video; the server path is no use to a remote client anyway.
    """
    out = {k: v for k, v in result.items() if k != "path"}
    out["video_url"] = video_url(result["video_id"])
    out["moment_url"] = f"{out['video_url']}#t={play_from(result['key_moment']):.2f}"
    return out


def video_url(video_id: str) -> str:
    """The path of a video on this app's video route (the API's ``video_url``, the page's players)."""
    return VIDEO_ROUTE + quote(video_id)


def api_endpoints(predictor: Predictor, session: gr.State, sessions: ClosedSessions) -> None:
    """Named endpoints for programs: /search, /add_video and /info (the session state is implicit).

    The functions' names and docstrings are also the MCP tools' names and descriptions (``--mcp``).
    """
    with gr.Row(visible=False):
        query_in, top_k_in = gr.Textbox(label="query"), gr.Number(value=5, precision=0, label="top_k")
        weight_in = gr.Number(value=predictor.default_clip_weight, label="clip_weight")
        upload_in, name_in = gr.File(label="video"), gr.Textbox(value="", label="name")
        results_out, status_out = gr.JSON(label="results"), gr.JSON(label="status")
        info_out = gr.JSON(label="info")
        search_trigger, add_trigger, info_trigger = gr.Button(), gr.Button(), gr.Button()

    def search(query: str, top_k: float, clip_weight: float, state: SessionGallery | None) -> dict:
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
        """
        try:
            response = predictor.search(query, top_k_value(top_k), float(clip_weight), state)
        except QueryError as problem:
            log.warning("search refused: %s", problem)
            raise gr.Error(str(problem), print_exception=False) from None
        return dict(response.to_dict(), results=[api_result(r) for r in response.results])

    def add_video(video: str | None, name: str | None, state: SessionGallery | None, request: gr.Request,
                  progress: gr.Progress = gr.Progress()) -> tuple[dict, SessionGallery | None]:  # noqa: B008
        """Add a video to the searchable gallery (validated, made playable, indexed).

        Returns {status, video_id, message}: status is "added", "duplicate" (the same file is already
        indexed; video_id is the existing one), "rejected" (the message says what is wrong with the file)
        or "error". With session-private uploads (a public host) the video is searchable only in the
        session that added it; each MCP call is a session of its own. Through MCP the tool's input schema
        says which forms of the file it takes (prvr.serve.mcp_tools.add_video_schema).

        Args:
            video: the video file (MP4, MKV, MOV, WebM or AVI).
            name: the file name the video is known by, which titles it (default: the file's own name).
        """
        if not video:
            raise gr.Error("No file was sent.", print_exception=False)
        state = sessions.track(request, predictor.ensure_session(state))
        # Gradio keeps the client's file name on its copy; a name given beside the file wins
        name = name.strip() if name and name.strip() else os.path.basename(video)
        # the same moving progress as the page's (a gradio_client job's status shows it)
        outcome = predictor.add_video(video, state, progress=file_progress(progress, 0, 1, name), name=name)
        discard_upload_copy(video)
        return outcome, state

    def info(state: SessionGallery | None) -> dict:
        """Describe the model, its feature profile, the number of videos (shared and yours) and the index."""
        return predictor.describe(state)

    search_trigger.click(search, [query_in, top_k_in, weight_in, session], results_out, api_name="search",
                         concurrency_id="search", concurrency_limit=8)
    add_trigger.click(add_video, [upload_in, name_in, session], [status_out, session], api_name="add_video",
                      concurrency_id="heavy", concurrency_limit=1)
    info_trigger.click(info, [session], info_out, api_name="info", concurrency_limit=None)


def routes(predictor: Predictor, sessions: ClosedSessions) -> list[Route]:
    """The app's own HTTP routes beside Gradio's: the videos by id and ``GET /info``."""
    return [video_route(predictor, sessions), info_route(predictor)]


def install_mcp(demo: gr.Blocks, predictor: Predictor) -> bool:
    """Make a launched app's MCP tools answer JSON and take files (``prvr.serve.mcp_tools``); a server path
    allowed with --mcp-allow-paths joins the shared gallery (it is the operator's file)."""
    return mcp_tools.install(demo, predictor, VIDEO_ROUTE,
                             lambda path, name: predictor.add_video(path, None, name=name or path.name))


def main(argv: list[str] | None = None) -> int:
    """Parse settings, claim the data dir, open (or build) the index, serve until Ctrl-C / SIGTERM; the exit
    status (0: stopped while serving, 130: stopped while starting, 2: could not start, with one line saying
    why). A stop signal is acted on at any moment (``prvr.serve.lifecycle``)."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    lifecycle.install()  # done already under ``python app.py`` (before the imports): the same one
    settings = AppSettings.from_args(argv)
    try:
        predictor = Predictor.from_settings(settings)
    except DataDirBusy as busy:
        print(f"error: {busy}", file=sys.stderr)
        return 2
    try:
        return serve(predictor, settings)
    finally:
        predictor.close()


def serve(predictor: Predictor, settings: AppSettings) -> int:
    """Launch the app over ``predictor`` and block until a stop signal (SIGINT or SIGTERM) or the server's
    end; 0, or 2 if the port was taken meanwhile."""
    sessions = ClosedSessions()
    demo = build_ui(predictor, sessions)
    demo.queue(max_size=64, default_concurrency_limit=2)
    log.info("starting the web server")
    try:
        demo.launch(server_name=settings.host, server_port=settings.port, css=CSS,
                    theme=gr.themes.Soft(primary_hue="indigo"),
                    max_file_size=settings.max_upload_mb * gr.FileSize.MB, footer_links=["api", "gradio"],
                    mcp_server=settings.mcp, prevent_thread_lock=True,
                    app_kwargs={"routes": routes(predictor, sessions)})
    except OSError as err:  # the port was free at start-up, taken since
        print(f"error: {PortBusy(settings.host, settings.port, str(err).split('.')[0]).message}",
              file=sys.stderr)
        return 2
    if settings.mcp:
        install_mcp(demo, predictor)
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
