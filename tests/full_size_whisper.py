"""A full-size random Whisper model folder with the real tokenizer, made on the spot (no hub).

The architecture is that of the default speech model ``openai/whisper-base`` (its published config, written
out below); the weights are random. The tokenizer is Whisper's own: its byte-pair vocabulary
(``multilingual.tiktoken``) ships in the ``openai-whisper`` sdist and is converted to transformers'
``vocab.json`` + ``merges.txt`` the way transformers' ``convert_openai_to_hf.py`` does (each token's merge
recovered by re-running BPE up to its rank), with the special, language and timestamp tokens in Whisper's
order. The generation config (language and task ids, suppressed tokens) is read off openai-whisper's own
tokenizer, as the published ``generation_config.json`` was made.
"""

from __future__ import annotations

import base64
from pathlib import Path

import torch

import extract  # noqa: F401  - the torchvision fix, before transformers

# openai/whisper-base's config.json (the fields that shape the network)
WHISPER_BASE = {
    "vocab_size": 51865, "num_mel_bins": 80, "d_model": 512, "encoder_layers": 6, "decoder_layers": 6,
    "encoder_attention_heads": 8, "decoder_attention_heads": 8, "encoder_ffn_dim": 2048,
    "decoder_ffn_dim": 2048, "max_source_positions": 1500, "max_target_positions": 448,
    "activation_function": "gelu", "scale_embedding": False, "bos_token_id": 50257, "eos_token_id": 50257,
    "pad_token_id": 50257, "decoder_start_token_id": 50258,
}
# a tiny random Whisper of the same vocabulary (the real tokenizer), for a model call in seconds
TINY_WHISPER = {**WHISPER_BASE, "d_model": 16, "encoder_layers": 1, "decoder_layers": 1,
                "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 32,
                "decoder_ffn_dim": 32}
NUM_LANGUAGES = 99  # whisper-base: vocab 51865 = 51765 + 1 + 99 languages


def tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """A ``.tiktoken`` file: one base64 token and its rank a line."""
    ranks = {}
    for line in path.read_text().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _bpe(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """``token`` split by byte-pair merges of rank below ``max_rank`` (the pair that made it, at the end)."""
    parts = [bytes([b]) for b in token]
    while True:
        best = None
        for i, pair in enumerate(zip(parts[:-1], parts[1:], strict=False)):
            rank = ranks.get(pair[0] + pair[1])
            if rank is not None and rank < max_rank and (best is None or rank < best[1]):
                best = (i, rank)
        if best is None:
            return parts
        i = best[0]
        parts = parts[:i] + [parts[i] + parts[i + 1]] + parts[i + 2 :]


def whisper_vocabulary() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Whisper's multilingual byte-pair vocabulary and merges in transformers' form, from openai-whisper's
    ``multilingual.tiktoken``."""
    import whisper
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    ranks = tiktoken_ranks(Path(whisper.__file__).parent / "assets" / "multilingual.tiktoken")
    byte_encoder = bytes_to_unicode()

    def as_text(b: bytes) -> str:
        return "".join(byte_encoder[c] for c in b)

    vocab, merges = {}, []
    for token, rank in ranks.items():
        vocab[as_text(token)] = rank
        if len(token) > 1:
            merged = _bpe(ranks, token, rank)
            if len(merged) == 2:
                merges.append((as_text(merged[0]), as_text(merged[1])))
    return vocab, merges


def openai_tokenizer():  # whisper.tokenizer.Tokenizer
    """openai-whisper's own multilingual tokenizer (tiktoken), the reference."""
    from whisper.tokenizer import get_tokenizer

    return get_tokenizer(multilingual=True, num_languages=NUM_LANGUAGES, task="transcribe")


def generation_config(reference) -> dict:
    """whisper-base's generation settings, read off openai-whisper's tokenizer."""
    from whisper.tokenizer import LANGUAGES

    langs = list(LANGUAGES)[:NUM_LANGUAGES]
    ids = dict(zip(reference.all_language_tokens, langs, strict=True))
    return {
        "decoder_start_token_id": reference.sot, "bos_token_id": reference.eot, "eos_token_id": reference.eot,
        "pad_token_id": reference.eot, "max_length": 448, "is_multilingual": True,
        "lang_to_id": {f"<|{code}|>": token for token, code in ids.items()},
        "task_to_id": {"translate": reference.translate, "transcribe": reference.transcribe},
        "no_timestamps_token_id": reference.no_timestamps, "prev_sot_token_id": reference.sot_prev,
        # openai-whisper's decoding: suppress_tokens "-1", and suppress_blank (" " and end of text first)
        "suppress_tokens": sorted(set(reference.non_speech_tokens) | {
            reference.sot, reference.sot_lm, reference.sot_prev, reference.no_speech}),
        "begin_suppress_tokens": [reference.encode(" ")[0], reference.eot],
        "max_initial_timestamp_index": 50,  # DecodingOptions.max_initial_timestamp 1.0 s / 0.02 s
    }


def make_whisper_base(folder: Path, seed: int = 0, config: dict | None = None) -> Path:
    """A random whisper-base (or the architecture ``config``, e.g. ``TINY_WHISPER``) with Whisper's real
    tokenizer, feature extractor and generation config, saved."""
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizer,
    )
    from whisper.tokenizer import LANGUAGES

    folder.mkdir(parents=True, exist_ok=True)
    vocab, merges = whisper_vocabulary()
    tokenizer = WhisperTokenizer(vocab=vocab, merges=merges)
    # the order of openai-whisper's special tokens (transformers' convert_tiktoken_to_hf)
    specials = (["<|endoftext|>", "<|startoftranscript|>"]
                + [f"<|{code}|>" for code in list(LANGUAGES)[:NUM_LANGUAGES]]
                + ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>",
                   "<|notimestamps|>"])
    tokenizer.add_tokens(specials, special_tokens=True)
    tokenizer.add_tokens([f"<|{i * 0.02:.2f}|>" for i in range(1501)], special_tokens=False)
    features = WhisperFeatureExtractor(feature_size=WHISPER_BASE["num_mel_bins"])
    processor = WhisperProcessor(feature_extractor=features, tokenizer=tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = WhisperForConditionalGeneration(WhisperConfig(**(config or WHISPER_BASE)))
    model.generation_config = GenerationConfig(**generation_config(openai_tokenizer()))
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder
