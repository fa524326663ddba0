"""Feature extraction speed: decoding (decord vs PyAV), backbones, and whole profiles. Prints JSON.

    python -m benchmarks.extract_speed            # 10-minute 480p synthetic video; CPU, and CUDA if present
    python -m benchmarks.extract_speed --minutes 2 --video my.mp4 --skip-paper

The synthetic video is encoded once with PyAV (H.264, x264 'veryfast', 30 fps, default keyframe interval)
into a temp folder (or --video, reused when it exists). Backbones whose hub weights are unreachable run
with random weights: speed does not depend on the weight values. ``load_avg`` is reported because other
processes on the machine slow every number down.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import extract  # noqa: F401  - the torchvision fix, before any backbone
from extract.backbones import create_backbone, get_backbone_cfg
from extract.decode import FrameReader, _DecoderFailed, probe, window_times
from extract.pipeline import TextEncoder, VideoExtractor


def make_video(path: Path, minutes: float, width: int = 854, height: int = 480, fps: int = 30) -> Path:
    """Encode a synthetic moving-pattern H.264 video (frames built in YUV to keep encoding cheap)."""
    import av

    rng = np.random.default_rng(0)
    luma = rng.integers(0, 255, (height, 2 * width), dtype=np.uint8)  # wider than the frame: it scrolls
    luma = (luma.astype(np.float32) * 0.3 + np.linspace(0, 170, 2 * width)[None]).astype(np.uint8)
    chroma = np.full((height // 2, width), 128, np.uint8)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "veryfast"}
        for i in range(int(minutes * 60 * fps)):
            shift = (4 * i) % width
            planes = np.concatenate([luma[:, shift : shift + width], chroma], axis=0)  # (h * 3/2, w)
            frame = av.VideoFrame.from_ndarray(planes, format="yuv420p")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


def decode_speed(path: Path, seconds: float) -> dict:
    """Sampled frames/s at 1 fps, 224x224, over the first ``seconds``: decord vs PyAV (our two readers)."""
    times = window_times(seconds, 1.0, 1)[2]
    out = {}
    for name in ("decord", "pyav"):
        reader = FrameReader(str(path), times, (224, 224), 32)
        if name == "pyav":  # the sequential reader decord hands over to on damaged files
            reader._decord_batches = _no_decord
        start, cpu = time.perf_counter(), time.process_time()
        n = sum(len(b.times) for b in reader)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        out[name] = {"sampled_frames_per_s": round(n / wall, 2), "video_s_per_s": round(seconds / wall, 2),
                     "cpu_s_per_video_minute": round(60 * cpu / seconds, 2)}
    return out


def _no_decord():  # a generator that makes FrameReader switch to PyAV at once
    raise _DecoderFailed("benchmark: PyAV path")
    yield


def backbone_speed(name: str, device: str, batch: int = 16, repeats: int = 2) -> dict:
    """Frames (or clips) per second of one backbone on random pixels, after a warm-up batch."""
    cfg = get_backbone_cfg(name)
    weights = None if cfg.weights.startswith("package:") else "random"
    backbone = create_backbone(name, weights=weights, device=device)
    shape = (batch, cfg.clip_len, 224, 224, 3) if cfg.kind == "clip" else (batch, 224, 224, 3)
    pixels = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    backbone.embed(pixels[:2])
    start = time.perf_counter()
    for _ in range(repeats):
        backbone.embed(pixels)
    per_s = batch * repeats / (time.perf_counter() - start)
    return {f"{cfg.kind}s_per_s": round(per_s, 2), "weights": "real" if weights is None else "random"}


def profile_speed(profile: str, path: Path, device: str, weights: dict | None = None) -> dict:
    """End-to-end extraction of one video (model loading excluded): wall time and real-time factor."""
    extractor = VideoExtractor(profile, weights=weights, device=device)
    duration = probe(path).duration
    start, cpu = time.perf_counter(), time.process_time()
    video = extractor.extract(path)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"video_s": round(duration, 1), "rows": len(video.features), "wall_s": round(wall, 2),
            "realtime_factor": round(duration / wall, 2), "rows_per_s": round(len(video.features) / wall, 2),
            # CPU seconds of all threads (decord's included): on an idle machine wall >= cpu_s / cores
            "cpu_s": round(cpu, 2), "idle_estimate_wall_s": round(cpu / len(os.sched_getaffinity(0)), 2)}


def text_speed(device: str, n: int = 256) -> dict:
    """Captions per second through the lite profile's MiniLM."""
    encoder = TextEncoder("lite", device=device)
    texts = [f"a person walks to the door number {i} and opens it slowly" for i in range(n)]
    encoder.encode(texts[:8])
    start = time.perf_counter()
    encoder.encode(texts)
    return {"captions_per_s": round(n / (time.perf_counter() - start), 1)}


def main() -> None:
    """Run every measurement and print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the synthetic video")
    parser.add_argument("--video", type=Path, help="video to use (encoded here first when missing)")
    parser.add_argument("--decode-seconds", type=float, default=120.0, help="span for the decoder comparison")
    parser.add_argument("--skip-paper", action="store_true", help="skip the slow paper-profile measurement")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    folder = Path(tempfile.mkdtemp(prefix="extract_speed_"))
    video = args.video or folder / f"synthetic_{args.minutes:g}min_480p.mp4"
    if not video.exists():
        start = time.perf_counter()
        make_video(video, args.minutes)
        logging.warning("encoded %s in %.0f s", video, time.perf_counter() - start)
    short = make_video(folder / "short_6s.mp4", 0.1)
    result: dict = {"cpu_cores": len(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads(),
                    "load_avg_1min": round(os.getloadavg()[0], 2), "video": str(video),
                    "video_info": probe(video).__dict__, "devices": {}}
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        r: dict = {"backbones": {}, "profiles": {}}
        if device == "cpu":
            r["decode_1fps_224px"] = decode_speed(video, min(args.decode_seconds, probe(video).duration))
        for name in ("efficientnet_lite0", "resnet152", "i3d_r50"):
            r["backbones"][name] = backbone_speed(name, device, batch=16 if name != "i3d_r50" else 2)
        r["backbones"]["minilm"] = text_speed(device)
        r["profiles"]["lite"] = profile_speed("lite", video, device)
        if not args.skip_paper:
            r["profiles"]["paper (random weights, 6 s clip)"] = profile_speed(
                "paper", short, device, weights={"resnet152": "random", "i3d_r50": "random"})
        result["devices"][device] = r
        result["load_avg_1min_end"] = round(os.getloadavg()[0], 2)
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)  # bounded decode
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
