"""The Whisper path computes what transformers' own pipeline computes, at full size (issue 43, item 6).

A random whisper-base (the default speech model's exact architecture) with Whisper's real tokenizer,
converted from the ``multilingual.tiktoken`` that openai-whisper ships (tests/full_size_whisper.py), is saved
as a local folder and loaded the way the app loads it (``load_speech(DIR)``). On a few seconds of real
recorded narration (the NASA clip) our model call's token ids must equal those of
``pipeline("automatic-speech-recognition")`` on the same audio with the same decoding settings, and our lines
must be the pipeline's text and times. ``max_new_tokens`` is kept small so that this takes seconds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from extract.words.audio import RATE, decode_audio
from extract.words.segment import WordSegment
from extract.words.speech import Whisper, load_speech
from tests.full_size_whisper import NUM_LANGUAGES, WHISPER_BASE, make_whisper_base, openai_tokenizer

SHARED = Path(__file__).resolve().parents[2] / "shared"
NASA = SHARED / "videos_dev" / "torchcodec__nasa_13013.mp4"
NARRATION = ("NAR: This is the optical and science segment of the Webb space telescope in one of the largest "
             "cleanrooms in the world at NASA’s Goddard Space Flight Center in Greenbelt, Maryland.")

pytestmark = pytest.mark.skipif(not NASA.exists(), reason="needs ../shared (the real NASA narration)")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_whisper_base(tmp_path_factory.mktemp("whisper") / "whisper-base-random")


@pytest.fixture(scope="module")
def recognizer(folder: Path) -> Whisper:
    recognizer = load_speech(str(folder), device="cpu")
    assert isinstance(recognizer, Whisper)
    recognizer.generate_kwargs["max_new_tokens"] = 8  # random weights: a few tokens tell as much as many
    return recognizer


@pytest.fixture(scope="module")
def audio() -> np.ndarray:
    return decode_audio(NASA)[: 3 * RATE]  # "This is the optical and ..."


@pytest.fixture(scope="module")
def ours(recognizer: Whisper, audio: np.ndarray) -> dict:
    return recognizer.generate(recognizer.features(audio))


@pytest.fixture(scope="module")
def pipe(recognizer: Whisper):  # transformers' AutomaticSpeechRecognitionPipeline
    """transformers' own speech recognition pipeline on the same model, tokenizer and feature extractor."""
    from transformers import pipeline

    return pipeline("automatic-speech-recognition", model=recognizer.network,
                    tokenizer=recognizer.processor.tokenizer,
                    feature_extractor=recognizer.processor.feature_extractor, device="cpu")


@pytest.fixture(scope="module")
def theirs(pipe, recognizer: Whisper, audio: np.ndarray) -> tuple[torch.Tensor, dict]:
    """The pipeline on the same audio: its generated token ids and its final output."""
    (inputs,) = list(pipe.preprocess(audio.copy()))
    forwarded = pipe.forward(inputs, **recognizer.generate_kwargs)
    return forwarded["tokens"], pipe.postprocess([forwarded], return_timestamps=True)


def test_tokenizer_is_whispers_own(recognizer: Whisper) -> None:
    reference = openai_tokenizer()
    tokenizer = recognizer.processor.tokenizer
    for text in (" " + NARRATION, " Größe, 東京 and café — 12% off!", "  spaces\tand\nnew lines"):
        assert tokenizer.encode(text, add_special_tokens=False) == reference.encode(text)
    ids = tokenizer.convert_tokens_to_ids
    assert ids("<|endoftext|>") == reference.eot and ids("<|startoftranscript|>") == reference.sot
    assert ids("<|transcribe|>") == reference.transcribe
    assert ids("<|notimestamps|>") == reference.no_timestamps
    assert ids("<|0.00|>") == reference.timestamp_begin and ids("<|en|>") == reference.to_language_token("en")
    assert len(tokenizer) == WHISPER_BASE["vocab_size"] == reference.timestamp_begin + 1501
    assert len(reference.all_language_tokens) == NUM_LANGUAGES


def test_the_architecture_is_whisper_base(recognizer: Whisper) -> None:
    config = recognizer.network.config
    assert {k: getattr(config, k) for k in WHISPER_BASE} == WHISPER_BASE
    assert sum(p.numel() for p in recognizer.network.parameters()) > 70_000_000  # whisper-base: 72.6 M
    assert recognizer.name == "whisper" and recognizer.device == "cpu"


def test_features_are_the_pipelines_short_and_long(pipe, recognizer: Whisper) -> None:
    narration = decode_audio(NASA)
    for audio in (narration[: 3 * RATE], np.tile(narration, 3)):  # 3 s; 39 s: transformers' long form
        (expected,) = list(pipe.preprocess(audio.copy()))
        got = recognizer.features(audio)
        assert torch.equal(got["input_features"], expected["input_features"])
        assert torch.equal(got["attention_mask"], expected["attention_mask"])
    assert got["input_features"].shape[-1] == len(audio) // 160  # unpadded: sequential 30 s windows


def test_token_ids_equal_the_pipelines(ours: dict, theirs: tuple[torch.Tensor, dict]) -> None:
    tokens, _ = theirs
    assert ours["sequences"].shape[-1] > 0
    assert torch.equal(ours["sequences"].cpu(), tokens.cpu())


def test_lines_are_the_pipelines_text_and_times(recognizer: Whisper, ours: dict,
                                                theirs: tuple[torch.Tensor, dict]) -> None:
    _, output = theirs
    lines = recognizer.segments(ours)
    assert lines and all(isinstance(s, WordSegment) and s.source == "speech" for s in lines)
    assert all(0.0 <= s.score <= 1.0 for s in lines)
    assert "".join(s.text for s in lines).replace(" ", "") == output["text"].replace(" ", "")
    # the first 30 s window's lines: the pipeline's chunks with text, times and words alike
    chunks = [(c["timestamp"][0], c["timestamp"][1], c["text"].strip()) for c in output["chunks"]
              if c["text"].strip() and c["timestamp"][1] is not None and c["timestamp"][1] <= 30.0]
    first = [(s.start, s.end, s.text) for s in lines if s.end <= 30.0]
    assert chunks and first == [(pytest.approx(a, abs=1e-6), pytest.approx(b, abs=1e-6), text)
                                for a, b, text in chunks]


def test_transcribe_is_features_then_the_model_call(recognizer: Whisper, audio: np.ndarray, ours: dict,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    given = []

    def model_call(features: dict) -> dict:
        given.append(features)
        return ours

    monkeypatch.setattr(recognizer, "generate", model_call)
    seen: list[float] = []
    got = recognizer.transcribe(audio, progress=seen.append)
    assert len(given) == 1 and torch.equal(given[0]["input_features"],
                                           recognizer.features(audio)["input_features"])
    assert given[0]["input_features"].shape == (1, WHISPER_BASE["num_mel_bins"], 3000)
    assert seen == [1.0]
    # lines are kept where the voice detector hears speech (the narration runs through these 3 s)
    assert got and set(got) <= set(recognizer.segments(ours))
    assert all(s.start < 3.0 for s in got)
    # silence: the model is not called at all
    given.clear()
    assert recognizer.transcribe(np.zeros(5 * RATE, np.float32)) == [] and not given
    assert recognizer.prepare(np.zeros(5 * RATE, np.float32)).features is None
