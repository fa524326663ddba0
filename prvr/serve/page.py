"""What the page shows, as text: its CSS and script, each result card's HTML (heatmap SVG, moment chips,
player), the summary line, the info panel and the upload table, from the API's result dicts.

Pure functions over result and info dicts (Contract 4, ``Predictor.describe``): no Gradio here, so each
piece is checked without a server; ``app.py`` puts their output into widgets.
"""

from __future__ import annotations

import html

from prvr.plural import counted
from prvr.results.confidence import summary_words
from prvr.results.moments import play_from
from prvr.results.response import SearchResponse
from prvr.serve.clips import clip_url
from prvr.serve.posters import poster_url
from prvr.serve.routes import video_url
from prvr.serve.settings import AppSettings

CLEARLY_T = 3.0  # "stands out" this much is "clearly better": the three-sigma level moments refine at
# (prvr.results.moments.MomentConfig.descend_t)
HEAT_STOPS = ((238, 242, 255), (129, 140, 248), (190, 18, 60))  # pale -> indigo -> crimson
WORDS_COLOUR = "#0d9488"  # teal: the matched words' times on the strip and their lines under it
WORDS_SHOWN = 3  # matched lines shown under a card (best first)
SOURCE_WORDS = {"subtitles": "subtitles", "speech": "said", "screen": "on screen"}  # a line's source, shown

HEADER = ('<div class="prvr-header"><h1>Find the moment in long videos</h1><p>Partially Relevant Video '
          "Retrieval with MS-SL: type what happens; every video that contains it is ranked, with where it "
          "happens and how sure the model is.</p></div>")

# In the browser, per card (no round trip): clicking a heatmap bin, a moment's outline, a moment chip or a
# matched line plays the card's video from there. A card holds no <video> until asked (ten players with
# their controls cost the browser ~1.5 s per search; issue #45): a light stand-in (``player_html``) is swapped
# for the player on the first click on it or on any of those, which plays from the clicked time (its media
# fragment, #t=). A new search's HTML has the stand-in again where the player was: Gradio patches an HTML
# value node by node and replaces an element of another tag, so every search starts at its key moment.
SEEK_JS = """
element.addEventListener('click', (event) => {
  const target = event.target.closest('[data-t]');  // the card clicked (one HTML may hold more)
  const body = target && (target.closest('.card-body') || element);
  if (!body) return;
  const t = parseFloat(target.dataset.t);
  let player = body.querySelector('video.player');
  if (player) {
    player.currentTime = t;
  } else {
    const stub = body.querySelector('.player-stub');
    if (!stub) return;
    player = document.createElement('video');
    player.className = 'player';
    player.controls = true;
    player.playsInline = true;
    player.preload = 'auto';
    player.setAttribute('aria-label', stub.dataset.title);
    player.src = stub.dataset.src.split('#')[0] + '#t=' + t.toFixed(2);
    const focused = document.activeElement === stub;
    stub.replaceWith(player);
    if (focused) player.focus();
  }
  player.play().catch(() => {});  // a click plays from there (a browser may refuse: it stays paused there)
});
"""

CSS = """
.prvr-header h1 {margin-bottom: 0.2em}
.prvr-header p {margin-top: 0; opacity: 0.8}
.result-card {padding: 10px 12px !important; border-radius: 12px !important}
.card-head {display: flex; align-items: baseline; gap: 10px; flex-wrap: wrap}
.card-head .rank {font-weight: 700; font-size: 1.25em; color: #4338ca}
.card-head .title {font-weight: 600; font-size: 1.1em}
.card-head .vid {opacity: 0.8; font-size: 0.85em}
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
.axis {display: flex; justify-content: space-between; font-size: 0.78em; opacity: 0.8}
.chips {display: flex; flex-wrap: wrap; gap: 6px; margin-top: 8px}
.chip {border: 1px solid var(--border-color-primary); border-radius: 999px; padding: 3px 11px;
  background: var(--background-fill-secondary); cursor: pointer; font-size: 0.86em}
.chip.key {border-color: #be123c; color: #be123c; font-weight: 600}
.chip:hover {filter: brightness(0.95)}
.hint {font-size: 0.8em; opacity: 0.8; margin-top: 6px}
.words {display: flex; flex-direction: column; gap: 4px; margin-top: 8px}
.words .line {text-align: left; border: none; border-left: 3px solid #0d9488; padding: 2px 8px;
  background: var(--background-fill-secondary); cursor: pointer; font-size: 0.88em; border-radius: 4px}
.words .line .where {opacity: 0.7; font-size: 0.9em; margin-left: 6px; white-space: nowrap}
.card-body {display: grid; grid-template-columns: minmax(0, 3fr) minmax(0, 2fr); gap: 14px;
  align-items: start}
.card-body .player, .player-stub {width: 100%; max-height: 260px; background: #000; border-radius: 8px}
.player-stub {aspect-ratio: 16 / 9; border: none; color: #fff; cursor: pointer; display: flex;
  flex-direction: column; align-items: center; justify-content: center; gap: 2px; font-size: 0.9em;
  position: relative; overflow: hidden}
.player-stub .poster {position: absolute; inset: 0; width: 100%; height: 100%; object-fit: contain}
.player-stub .play, .player-stub .from {position: relative; color: #fff; background: rgba(0, 0, 0, 0.6);
  border-radius: 999px}
.player-stub .play {font-size: 2.2em; line-height: 1; padding: 4px 10px 6px 14px}
.player-stub .from {padding: 1px 10px}
/* a card off screen is laid out and painted when scrolled to (the browser's work per search: issue #45) */
.result-card {content-visibility: auto; contain-intrinsic-size: auto 330px}
@media (max-width: 760px) {.card-body {grid-template-columns: 1fr}
  .result-card {contain-intrinsic-size: auto 640px}}
.summary {padding: 8px 12px; border-radius: 10px; background: var(--background-fill-secondary)}
.summary.abstain {background: #fff7ed; color: #9a3412}
/* the upload table: words stay whole (Gradio's prose tables wrap "anywhere", which squeezed the result column
   to "rejecte/d"); a long file name still breaks where it must */
#upload-status td, #upload-status th {overflow-wrap: break-word; word-break: normal}
#upload-status td:nth-child(2) {white-space: nowrap}
"""

UPLOAD_TABLE_HEAD = ["| file | result | details |", "|---|---|---|"]
TITLE_LABEL = "Title (optional): the name the video is found by (default: its file name)"
# Gradio's screen-reader live region says the translation of "common.complete" when an event ends, a key its
# English dictionary lacks (the key itself was read out): a sentence for it, given to launch(i18n=...)
LIVE_WORDS = {"common": {"complete": "Done: the page has been updated."}}
SUBTITLES_LABEL = ("Subtitles (optional): .srt or .vtt files, each read with the video of the same name "
                   "(with one video, any name)")


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
    for line in result.get("words") or []:  # where the matched words are said or shown: a band under it
        x, w = 1000 * line["start"] / duration, max(1000 * (line["end"] - line["start"]) / duration, 4.0)
        parts.append(f'<rect class="word" data-t="{line["start"]:.2f}" x="{x:.1f}" y="45" width="{w:.1f}" '
                     f'height="5" fill="{WORDS_COLOUR}"><title>{html.escape(words_where(line))}: '
                     f'“{html.escape(line["text"])}”</title></rect>')
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
    # "stands out" compares a moment with the rest of its own video: evidence of where, never of whether.
    # Only a strong match (the label's verdict on whether) shows the number on its chips; the others' chips
    # give the moment and its time, their tooltips say why no number.
    sure = confidence == "high"
    chips = "".join(
        f'<button class="chip{" key" if i == 0 else ""}" data-t="{play_from(m):.2f}" '
        f'title="{html.escape(stands_out_words(m, result["confidence_label"], sure))}">'
        f'{"★ key moment" if i == 0 else f"moment {i + 1}"}{" (words)" if m.get("from") == "words" else ""} '
        f'· {clock(m["start"])}-{clock(m["end"])}{f" · {stands_out_chip(m)}" if sure else ""}</button>'
        for i, m in enumerate(moments_of(result)))
    mine = '<span class="badge badge-mine">your upload</span>' if result.get("source") == "session" else ""
    head = (f'<div class="card-head"><span class="rank">#{result["rank"]}</span>'
            f'<span class="title">{html.escape(result["title"])}</span>'
            f'<span class="badge badge-{confidence}">{html.escape(result["confidence_label"])}</span>{mine}'
            f'<span class="vid">{html.escape(result["video_id"])} · {clock(result["duration"])}</span></div>')
    scores = (f'<div class="scores">score <b>{result["score"]:.3f}</b> = {clip_weight:.2f} × clip '
              f'{result["clip_score"]:.3f} + {1 - clip_weight:.2f} × frame {result["frame_score"]:.3f}</div>')
    strip = heatmap_svg(result, score_range)
    text = f'{head}{scores}{strip}<div class="chips">{chips}</div>{words_html(result)}'
    return (f'<div class="card-body" data-search="{search_id}"><div class="card-text">{text}</div>'
            f'{player_html(result, root)}</div>')


def words_where(line: dict) -> str:
    """A matched line's source and time: "subtitles 1:05-1:09"."""
    return f"{SOURCE_WORDS.get(line['source'], line['source'])} {clock(line['start'])}-{clock(line['end'])}"


def words_html(result: dict) -> str:
    """The lines of the video's words that matched the query (``result["words"]``, best first), each with
    its source and time; a click plays from it. "" when no words matched."""
    lines = (result.get("words") or [])[:WORDS_SHOWN]
    if not lines:
        return ""
    buttons = "".join(f'<button class="line" data-t="{line["start"]:.2f}" title="Play from '
                      f'{clock(line["start"])}">“{html.escape(line["text"])}”<span class="where">'
                      f'{html.escape(words_where(line))}</span></button>' for line in lines)
    return f'<div class="words" aria-label="matched words">{buttons}</div>'


def player_html(result: dict, root: str) -> str:
    """The result's player as the page first shows it: a stand-in button ("play from" the key moment) over
    the frame it starts on (its poster, fetched when the card is scrolled to), that the page's script
    (``SEEK_JS``) replaces with the player on a click, its video from this app's video route under ``root``
    (the page's URL), as API clients fetch it (no server path), starting at ``start_position`` (a media
    fragment) or at the clicked moment; under it, each moment's download link (``clip_links``)."""
    start = f"{start_position(result):.2f}"
    src = f"{root}{video_url(result['video_id'])}#t={start}"
    poster = f"{root}{poster_url(result['video_id'], float(start))}"
    title, at = html.escape(result["title"]), clock(float(start))
    return (f'<div class="card-media"><button class="player-stub" type="button" data-t="{start}" '
            f'data-start="{start}" data-src="{html.escape(src)}" data-title="{title}" '
            f'aria-label="Play {title} from {at}"><img class="poster" src="{html.escape(poster)}" alt="" '
            f'loading="lazy" decoding="async"><span class="play" aria-hidden="true">▶</span>'
            f'<span class="from">play from {at}</span></button>{clip_links(result, root)}</div>')


def start_position(result: dict) -> float:
    """Where a result's player starts: its key moment's ``play_from`` (its first row's frame, never a blank
    card, where the moment's first second may still show one)."""
    return play_from(result["key_moment"])


def stands_out_chip(moment: dict) -> str:
    """A strong match's chip ends with its number: "stands out 6.3"."""
    return f"stands out {moment['contrast']:.1f}"


def stands_out_words(moment: dict, label: str = "strong match", sure: bool = True) -> str:
    """A moment chip's tooltip: what its "stands out" number means, on what scale; for a result that is not
    a strong match (``sure`` False; ``label``: its confidence words), that it says where this video comes
    closest to the query, not that the video shows it."""
    t = moment["contrast"]
    how = (f"clearly better than in the rest of the video, by {t:.1f} standard errors" if t >= CLEARLY_T else
           f"better than in the rest of the video, by {t:.1f} standard errors" if t > 0 else
           "no better than in the rest of the video")
    play = f"Click to play from {clock(play_from(moment))}."
    if not sure:
        return (f"Where this video comes closest to the query: it stands out {t:.1f} within this video only "
                f"(a t statistic against the rest of the same video). That is no evidence the video shows "
                f"what you asked: this result is “{label}”, not a strong match. {play}")
    return (f"Stands out {t:.1f}: the query matches here {how} (a t statistic: 0 is no better, "
            f"{CLEARLY_T:g} or more is clearly better). {play}")


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
    """One line above the cards: what was searched (as cleaned) and plainly when nothing matches well; the
    text model's notice when it cannot read the query (``response.notice``); then, once for every card,
    how to read them (``CARD_HELP``, folded)."""
    if not response.results:
        return '<div class="summary">The gallery is empty: add videos in the "Add videos" tab.</div>'
    searched = response.query.get("text", query)  # the cleaned, possibly shortened text
    q, note = html.escape(searched), searched_note(response.query)
    notice = (f'<div class="notice" role="note"><b>Not read as English.</b> '
              f'{html.escape(response.notice["message"])}</div>' if response.notice else "")
    kind, words = summary_words([r["confidence"] for r in response.results], response.calibrated)
    if kind != "strong":  # the words come from prvr.results.confidence, one vocabulary with the labels
        title = {"none": "No match", "uncalibrated": "Unconfirmed"}.get(kind, "No confident match")
        line = f'<div class="summary abstain"><b>{title}</b> for “{q}”: {words}{note}</div>'
    else:
        line = f'<div class="summary">{words} for “{q}”.{note}</div>'
    return f"{notice}{line}{CARD_HELP}"


CARD_HELP = ('<details class="card-help"><summary>How to read the results</summary><p>Each card: its ▶ '
             "plays from the key moment (★); click the strip, a moment or a matched line to play from there. "
             "Strip: how close each second of the video is to the query (longer videos: each stretch; darker "
             "is closer), the moments outlined, the orange line where the frame branch looked, teal marks "
             "where matched words are said or shown. The label says whether a video shows what you asked: "
             "strong match, possible match, unconfirmed, no match. “Stands out” compares a moment with the "
             "rest of its own video, in standard errors (a t statistic): 0 is no better, "
             f"{CLEARLY_T:g} or more is clearly better than the rest of that video; moments are ordered by "
             "it. It says where in a video the query fits best, not whether the video shows it, so it is "
             "shown only on strong matches.</p></details>")


def refusal_html(problem: Exception) -> str:
    """The summary line for a search that was refused (a bad query): its message, not an error dialog."""
    return f'<div class="summary">{html.escape(str(problem))}</div>'


def score_range(results: list[dict]) -> tuple[float, float]:
    """Common colour scale for all cards of one query, so heatmaps compare across videos."""
    scores = [s for r in results for s in r["heatmap"]["score"]]
    lo, hi = (min(scores), max(scores)) if scores else (0.0, 1.0)
    return lo, max(hi, lo + 1e-6)


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
    if "words" in info:  # prvr.serve.predictor.Predictor.words_info
        lines.append(f"**Words:** {words_info_words(info['words'])}")
    if "search" in info:  # prvr.serve.predictor.Predictor.search_mode: exact or approximate, and why
        lines.append(f"**Search:** {info['search']['why']}")
    return "\n\n".join(lines)


def words_info_words(words: dict) -> str:
    """The info panel's words line: which sources are read and by which models (``WordsReader.describe``)."""
    if words.get("mode") == "off" or not words.get("sources"):
        return "off: videos are searched by their pictures only (--words off)"
    models = words.get("models") or {}
    used = "; ".join(f"{k}: {v}" for k, v in models.items()) if isinstance(models, dict) else \
        ", ".join(map(str, models))
    return (f"{words['mode']}: each video's {', '.join(words['sources'])} are read and searched beside its "
            f"pictures" + (f" ({used})" if used else ""))


def upload_intro(settings: AppSettings, gpu_words: str) -> str:
    """The "Add videos" tab's first lines: where uploads go and how big they may be (``gpu_words``: what an
    upload asks of a ZeroGPU visitor's quota, "" elsewhere)."""
    limits = f"Up to {settings.max_upload_mb} MB and {settings.max_duration_s / 60:.0f} minutes each"
    if settings.uploads == "session":
        return (f"Videos you add are private to your browser session and deleted when it ends. {limits}, "
                f"{settings.max_uploads_per_session} per session.{gpu_words}")
    return f"Videos you add join the shared gallery and stay after a restart. {limits}.{gpu_words}"


def upload_row(name: str, outcome: dict) -> str:
    """One file's row of the upload table (after ``UPLOAD_TABLE_HEAD``): its name, status and message."""
    return f"| {md_cell(name)} | {outcome['status']} | {md_cell(outcome['message'])} |"


def unmatched_row(name: str) -> str:
    """The upload table's row for a subtitle file that no chosen video takes."""
    return (f"| {md_cell(name)} | not used | no video of this name was chosen with it: a subtitle file is "
            "read with the video of the same name (talk.srt with talk.mp4) |")


def upload_table(rows: list[tuple[str, dict | None]]) -> str:
    """The upload table: a row per (file name, its outcome), or per (subtitle file, None) no video took."""
    return "\n".join([*UPLOAD_TABLE_HEAD, *(upload_row(name, outcome) if outcome is not None
                                            else unmatched_row(name) for name, outcome in rows)])


def words_following(outcome: dict | None) -> bool:
    """Whether an upload's words still follow its video (it joined by its pictures; ``words.state``)."""
    return ((outcome or {}).get("words") or {}).get("state") == "following"


def md_cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return html.escape(text).replace("|", "\\|").replace("\n", " ")


MORE_STEP = 10  # results the page's "more" button adds (after those shown, up to routes.MAX_TOP_K)


def clip_links(result: dict, root: str = "") -> str:
    """Each moment's download action: a link to its clip on this app's clip route (an MP4 of the moment,
    cut where it starts; ``prvr.serve.clips``)."""
    links = []
    for i, moment in enumerate(moments_of(result)):
        start, end = max(0.0, moment["start"]), min(moment["end"], result["duration"])
        if end <= start:
            continue
        name, mark = ("★ key moment", "★") if i == 0 else (f"moment {i + 1}", str(i + 1))
        href = html.escape(root + clip_url(result["video_id"], start, end))
        # short (the chips above name each moment in full; a phone fits the links on one line)
        links.append(f'<a class="clip-link" href="{href}" download title="Download {name} ({clock(start)}-'
                     f'{clock(end)}) as an MP4 clip">⬇ {mark} {clock(start)}-{clock(end)}</a>')
    return f'<div class="clip-links">Download: {" ".join(links)}</div>' if links else ""


def more_cards_html(results: list[dict], clip_weight: float, score_range: tuple[float, float], root: str = "",
                    search_id: str = "") -> str:
    """Cards of further results (the "more" button's), each as a result card of its own in one HTML block:
    the same card as the first ones', on the same colour scale."""
    return "".join(f'<div class="more-card">{card_html(r, clip_weight, score_range, root, search_id)}</div>'
                   for r in results)


CSS += """
.clip-links {margin-top: 6px; font-size: 0.82em; display: flex; flex-wrap: wrap; gap: 4px 10px;
  align-items: baseline}
.clip-link {text-decoration: none; border-bottom: 1px dotted currentColor}
.more-card {padding: 10px 12px; border-radius: 12px; margin-top: 10px;
  border: 1px solid var(--border-color-primary); background: var(--block-background-fill)}
/* colours of our own in both themes (Gradio's dark theme sets .dark on the page), each with a WCAG
   contrast of 4.5 or more (tests/test_browser.py); bold text inherits its box's colour (the theme's strong
   colour is for its own backgrounds) */
.summary.abstain b, .notice b {color: inherit}
.notice {padding: 8px 12px; border-radius: 10px; margin-bottom: 6px; background: #fef3c7; color: #78350f;
  border-left: 4px solid #d97706}
.card-help {margin-top: 6px; font-size: 0.86em}
.card-help summary {cursor: pointer}
.card-help p {margin: 4px 0 0}
.dark .summary.abstain {background: #431407; color: #fed7aa}
.dark .notice {background: #451a03; color: #fde68a}
.dark .chip.key {border-color: #fb7185; color: #fda4af}
.dark .card-head .rank, .dark .clip-links a.clip-link {color: #a5b4fc}  /* over Gradio's .prose a */
"""


def duration_words(seconds: float) -> str:
    """A time left as a person says it: "40 s", "12 min", "2 h 10 min"."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def folder_line(status: dict | None) -> str:
    """The page's line on --gallery's folder (``prvr.serve.folder.FolderSync.status``): how far its
    background indexing is, or that it is watched; "" without a folder."""
    if not status:
        return ""
    name = html.escape(status["folder"])
    done = counted(status["done"], "video")
    failed = (f"; {counted(status['failed'], 'file')} could not be indexed (see /info)"
              if status["failed"] else "")
    if status["state"] == "unreadable":
        return f"Your folder {name} cannot be read now: its {done} stay searchable{failed}."
    if status["state"] == "starting":
        return f"Looking at your folder {name}: {done} searchable so far."
    if status["to_do"] or status["waiting"] or status["state"] in ("starting", "indexing"):
        left = status["seconds_left"]
        when = ", estimating the time left" if left is None else f", about {duration_words(left)} left" \
            if left > 0 else ""
        now = f" (now: {html.escape(status['current'])})" if status["current"] else ""
        return (f"Indexing your folder {name} in the background: {done} searchable, {status['to_do']} to do"
                f"{now}{when}; searches cover what is indexed so far{failed}.")
    return f"Your folder {name}: {done} searchable, watched for new, changed and removed files{failed}."

CSS += """
#folder-status {font-size: 0.88em}
"""
