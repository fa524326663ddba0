"""A mutation run: single-line changes a careless developer could make, each applied alone, its tests run.

    python -m benchmarks.mutations [--only SUBSTRING ...] [--timeout SECONDS] [--list]

Each mutation in ``MUTATIONS`` is (file, the exact fragment of one line, its replacement, the pytest
arguments that should catch it). The fragment must occur exactly once in the file. The file is changed in
place and always restored (``finally``, also on Ctrl-C or SIGTERM); the tests run in a child process with
a timeout (a mutant that hangs counts as killed by the timeout). One JSON line per mutation on stdout:
``{"id", "file", "line", "old", "new", "status": "killed" | "survived" | "timeout", "by": [failing
tests], "seconds"}``, then a summary line. Run it on a clean work tree: it refuses files with uncommitted
changes, so a restore can never lose work. Results of the issue #42 run: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    """One single-line change and the tests that should fail under it."""

    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    why: str = ""  # what a careless developer did

    @property
    def id(self) -> str:
        """A short name: the file's stem and the new fragment."""
        return f"{Path(self.file).stem}: {self.new.strip()[:60]}"


def m(file: str, old: str, new: str, *tests: str, why: str = "") -> Mutation:
    """A mutation of ``file`` (``old`` -> ``new``) caught by ``pytest tests...``."""
    return Mutation(file, old, new, tests, why)


MOMENTS, RESPONSE = "prvr/results/moments.py", "prvr/results/response.py"
CONFIDENCE, SEARCH, QUERY = "prvr/results/confidence.py", "prvr/results/search.py", "prvr/results/query.py"
MCP, RANK = "prvr/serve/mcp_tools.py", "prvr/index/rank.py"
T_MOMENTS = ("tests/test_moments.py", "tests/test_filler.py")
T_SEARCH = ("tests/test_search.py",)
T_CONF = ("tests/test_confidence.py", "tests/test_calibration.py", "-k", "not end_to_end")
T_INDEX = ("tests/test_index.py", "-k", "pruned or frame_bound or quantized or head_bound or window_factor "
           "or refuses or exact_on_random or exact_with or persistence")  # (the whole file: ~8 min a mutant)
T_MCP_UNIT = ("tests/test_mcp.py", "-k", "every_form or multiple_of_4 or none_is_allowed")
T_MCP = ("tests/test_mcp.py",)

MUTATIONS = [
    # --- the eight survivors of the issue
    m(MCP, "if not any(resolved.is_relative_to(root) for root in roots):",
      "if not any(path.is_relative_to(root) for root in roots):", *T_MCP_UNIT, why="wrong variable"),
    m(MCP, "if len(data) % 4 or BASE64.fullmatch(data) is None:", "if BASE64.fullmatch(data) is None:",
      *T_MCP_UNIT, why="dropped guard"),
    m(RESPONSE, '"end": round(float(spans[key_end - 1, 1]), 3)',
      '"end": round(float(spans[min(key_end, len(spans) - 1), 1]), 3)', *T_SEARCH, "tests/test_results.py",
      why="off by one"),
    m(MOMENTS, "if first == stop or taken[first:stop].any():", "if first == stop or taken[first:stop].all():",
      *T_MOMENTS, why="any/all"),
    m(CONFIDENCE, "for directory in [*map(Path, directories), SHIPPED_CALIBRATIONS]:",
      "for directory in [SHIPPED_CALIBRATIONS, *map(Path, directories)]:", *T_CONF, why="order swapped"),
    m(CONFIDENCE, "float(high[j]) + cfg.high_margin", "float(high[j]) + cfg.medium_margin", *T_CONF,
      why="wrong variable"),
    m("prvr/index/upgrade.py", '"context_beta", "references", "mode")', '"context_beta", "mode")',
      "tests/test_index.py", "-k", "upgrade", why="dropped identity field"),
    m(SEARCH, "evidence = Evidence.merge([ix.rank(q, k, w, approximate, text) for ix",
      "evidence = Evidence.merge([ix.rank(q, k, w, False, text) for ix", *T_SEARCH, why="argument dropped"),
    m(MOMENTS, 'return float(moment.get("play_from", moment["start"]))', 'return float(moment["start"])',
      *T_MOMENTS, why="rule dropped"),
    # --- results: moments
    m(MOMENTS, "if m and t[k] <= 0:", "if t[k] <= 0:", *T_MOMENTS, why="dropped guard"),
    m(MOMENTS, "if t[best] < level:", "if t[best] <= level:", *T_MOMENTS, why="comparison boundary"),
    m(MOMENTS, "if n <= max_cells:  # one cell per row", "if n < max_cells:  # one cell per row", *T_MOMENTS,
      why="comparison boundary"),
    m(MOMENTS, '"end": round(float(end[stop - 1]), 3)', '"end": round(float(start[stop - 1]), 3)', *T_MOMENTS,
      why="wrong variable"),
    m(MOMENTS, "    out[:-1] |= same\n", "", *T_MOMENTS, why="dropped line"),
    m(MOMENTS, "return out if not out.all() else np.zeros(len(v), np.bool_)", "return out", *T_MOMENTS,
      why="dropped guard"),
    m(MOMENTS, "sd = max(np.sqrt(var / n), 1e-9)", "sd = max(np.sqrt(var / (n - 1)), 1e-9)", *T_MOMENTS,
      why="off by one"),
    # --- results: response, query, search
    m(RESPONSE, "if n <= max_ctx_l:", "if n < max_ctx_l:", *T_SEARCH, why="comparison boundary"),
    m(RESPONSE, '"clip_score": round(hit.clip, 6)', '"clip_score": round(hit.frame, 6)', *T_SEARCH,
      why="wrong variable"),
    m(RESPONSE, 'return bool(self.results) and all(r["confidence"] == "none" for r in self.results)',
      'return all(r["confidence"] == "none" for r in self.results)', "tests/test_calibration.py",
      "tests/test_app_api.py", "-k", "not end_to_end", why="dropped guard"),
    m(QUERY, "truncated = len(text) > MAX_QUERY_CHARS", "truncated = len(text) >= MAX_QUERY_CHARS", *T_SEARCH,
      why="comparison boundary"),
    m(QUERY, "in _CONTROL and not ch.isspace())", "in _CONTROL)", *T_SEARCH, why="dropped guard"),
    m(SEARCH, "if x.ndim != 2 or len(x) == 0 or not np.isfinite(x).all():", "if x.ndim != 2 or len(x) == 0:",
      *T_SEARCH, why="dropped guard"),
    m(SEARCH, "for ix in indexes if len(ix)]", "for ix in indexes]", *T_SEARCH, why="dropped guard"),
    # --- results: confidence
    m(CONFIDENCE, "if score > null.high:", "if score >= null.high:", *T_CONF, why="comparison boundary"),
    m(CONFIDENCE, "score <= null.none else", "score < null.none else", *T_CONF, why="comparison boundary"),
    m(CONFIDENCE, 'axis=1, method="lower") + cfg.none_margin', 'axis=1, method="higher") + cfg.none_margin',
      *T_CONF, why="wrong argument"),
    m(CONFIDENCE, 'calibration.source.get("reference_captions", digest) != digest:',
      'calibration.source.get("reference_captions", digest) == digest:', *T_CONF, why="comparison flip"),
    m(CONFIDENCE, "if labels and all(label == \"none\" for label in labels):",
      "if all(label == \"none\" for label in labels):", *T_CONF, why="dropped guard"),
    m(CONFIDENCE, "if found.model == json.loads(json.dumps(identity)):", "if found.model:", *T_CONF,
      why="dropped check"),
    # --- index
    m(RANK, "keep = bound + eps >= tau", "keep = bound + eps > tau", *T_INDEX, why="comparison boundary"),
    m(RANK, "if page.rest + eps < tau:", "if page.rest < tau:", *T_INDEX, why="dropped slack"),
    m(RANK, "return -np.inf if len(values) < k else", "return -np.inf if len(values) <= k else", *T_INDEX,
      why="comparison boundary"),
    m(RANK, "pos = pos[refine(pos, tau) + eps >= tau]", "pos = pos[refine(pos, tau) >= tau]",
      *T_INDEX, why="dropped slack"),
    m("prvr/index/evidence.py", "any(p.approximate for p in parts))", "all(p.approximate for p in parts))",
      *T_SEARCH, why="any/all"),
    m("prvr/index/evidence.py", "sum(p.scored_exactly for p in parts)", "first.scored_exactly", *T_SEARCH,
      why="wrong variable"),
    m("prvr/index/store.py", 'if size != entry["bytes"]:', 'if size > entry["bytes"]:', *T_INDEX,
      why="comparison"),
    m("prvr/index/upgrade.py", 'store.FORMAT and manifest.get("schema_version") in PREVIOUS',
      'store.FORMAT or manifest.get("schema_version") in PREVIOUS', "tests/test_index.py", "-k",
      "schema", why="and/or"),
    m("prvr/index/sketch.py", "factors += factors * steps < inv", "factors += factors * steps > inv",
      *T_INDEX, why="comparison flip"),
    # --- serve
    m(MCP, 'if url.netloc not in ("", "localhost"):', 'if url.netloc in ("", "localhost"):', *T_MCP_UNIT,
      why="comparison flip"),
    m(MCP, "if own_host and parsed.netloc == own_host and parsed.path",
      "if own_host or parsed.netloc == own_host and parsed.path", *T_MCP, why="and/or"),
    m(MCP, "if ip.is_private or ip.is_loopback or ip.is_link_local", "if ip.is_private or ip.is_link_local",
      *T_MCP, why="dropped guard"),
    m("prvr/serve/persist.py", 'if _identity_text(h.get("profile")) != mine:',
      'if _identity_text(h.get("profile")) == mine:', "tests/test_persist.py", "-k", "another_profile",
      why="comparison flip"),
    m("prvr/serve/persist.py", "return not full or sha256_path(path)[0] == sha",
      "return full or sha256_path(path)[0] == sha", "tests/test_persist.py", "-k", "cut_short or every_file",
      why="dropped not"),
    m("prvr/serve/media.py", "if path.is_file() and path.resolve() not in keep:",
      "if path.is_file() and path.resolve() in keep:", "tests/test_uploads.py", "-k", "sweeps", why="flip"),
    m("prvr/serve/progress.py", "if now - self.last < self.every and fraction < 1.0:",
      "if now - self.last < self.every or fraction < 1.0:", "tests/test_progress.py", why="and/or"),
]

FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


def changed_files() -> set[str]:
    """Files with uncommitted changes (a mutation may not touch them: its restore would be ambiguous)."""
    out = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout
    return {line[3:] for line in out.splitlines()}


def apply(mutation: Mutation) -> tuple[str, int]:
    """Change the file; returns its original text and the changed line's number."""
    path = REPO / mutation.file
    text = path.read_text()
    count = text.count(mutation.old)
    if count != 1:
        raise ValueError(f"{mutation.file}: the fragment {mutation.old!r} occurs {count} times (need 1)")
    line = text[:text.index(mutation.old)].count("\n") + 1
    path.write_text(text.replace(mutation.old, mutation.new))
    return text, line


def run_tests(tests: tuple[str, ...], timeout: float) -> tuple[str, list[str], float]:
    """("killed" | "survived" | "timeout", failing tests, seconds) of pytest on ``tests``."""
    t0 = time.monotonic()
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-rfE", *tests]
    child = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        out, _ = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the whole pytest group, children included
        child.communicate()
        return "timeout", [], time.monotonic() - t0
    by = FAILED.findall(out)
    if child.returncode == 0:
        return "survived", [], time.monotonic() - t0
    if not by:  # a collection error, or no test selected: not a kill
        by = [f"pytest exit {child.returncode}: " + " | ".join(out.strip().splitlines()[-3:])]
    return "killed", by, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    """Run the mutations one at a time; JSON lines and a summary on stdout."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[],
                        help="run the mutations whose file or id contains this (repeatable; default: all)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per mutation's tests")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    args = parser.parse_args(argv)
    chosen = [mu for mu in MUTATIONS if not args.only or any(o in mu.file or o in mu.id for o in args.only)]
    if args.list:
        for mu in chosen:
            print(json.dumps({"id": mu.id, "file": mu.file, "old": mu.old, "new": mu.new, "tests": mu.tests}))
        return 0
    dirty = changed_files() & {mu.file for mu in chosen}
    if dirty:
        print(f"uncommitted changes in {', '.join(sorted(dirty))}: commit or stash them first",
              file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # restore through ``finally`` on SIGTERM too
    counts: dict[str, int] = {}
    for mu in chosen:
        original, line = apply(mu)
        try:
            status, by, seconds = run_tests(mu.tests, args.timeout)
        finally:
            (REPO / mu.file).write_text(original)
        counts[status] = counts.get(status, 0) + 1
        print(json.dumps({"id": mu.id, "file": mu.file, "line": line, "old": mu.old, "new": mu.new,
                          "why": mu.why, "status": status, "by": by, "seconds": round(seconds, 1)}),
              flush=True)
    print(json.dumps({"summary": counts, "mutations": len(chosen)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
