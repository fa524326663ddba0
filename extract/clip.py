"""CLIP-family image-text models (CLIP, SigLIP): both towers from one folder or hub id.

The ``clip`` profile's visual backbone ``clip`` (one pooled, projected image embedding per frame) and text
backbone ``clip_text`` (every token's last hidden state) are two towers of ONE model, loaded once with
transformers' Auto classes and shared by both (``load_pair``). Both take their inputs as the model's authors
prepare them, so a row or a query is what the reference computes (tests/test_clip_fidelity.py): frames go
through the model's own image processor (``ImageTower.pixel_values``; ``frame_fit`` "whole", profile
``clip_whole``, resizes the whole frame to the square input instead); text is cleaned as OpenAI's CLIP and
open_clip clean it (``clean_text``: ftfy, HTML entities, whitespace) and cut at the context length
(``TowerDims.context``) keeping the end-of-text token. The pooled text embedding is ``text_head`` applied to
the last row ``clip_text`` returns (CLIP's end-of-text token; SigLIP's last of its 64 padded positions),
exactly the model's ``get_text_features``.

``DEFAULT_MODEL``: the LAION ViT-B/32, the most published ImageNet zero-shot accuracy per CPU second
(``python -m benchmarks.clip_speed``); on a GPU host
``--weights clip=hf-hub:google/siglip-base-patch16-224`` is stronger. The comparison: benchmarks/RESULTS.md,
"Issue #42: history moved from module docstrings".
"""

from __future__ import annotations

import html
import logging
import re
import threading
from dataclasses import dataclass

import torch
from torch import nn

from extract.weights import Weights, WeightsUnavailable, from_hub

log = logging.getLogger(__name__)

DEFAULT_MODEL = "hf-hub:laion/CLIP-ViT-B-32-laion2B-s34B-b79K"
FULL_LENGTH_TEXT = ("siglip", "siglip2")  # model types trained on max-length padded text, no attention mask


@dataclass(frozen=True)
class TowerDims:
    """Widths of one image-text model's outputs."""

    image: int  # pooled, projected image embedding (a feature row)
    tokens: int  # text token features (last hidden states)
    query: int  # pooled, projected text embedding (the query space; equals ``image``)
    context: int  # the text tower's context length (tokens, special tokens included)


@dataclass
class PairedModel:
    """One loaded image-text model with its tokenizer and image processor."""

    model: nn.Module
    tokenizer: object
    image_processor: object
    weights: Weights

    @property
    def model_type(self) -> str:
        """The transformers model type ("clip", "siglip", ...)."""
        return self.model.config.model_type

    def text_head(self) -> nn.Linear:
        """The linear map from the pooled token row to the text embedding (CLIP: text_projection)."""
        head = getattr(self.model, "text_projection", None) or getattr(self.model.text_model, "head", None)
        if not isinstance(head, nn.Linear):
            raise WeightsUnavailable(f"{self.weights.location}: a {self.model_type} model has no text "
                                     "projection (text_projection or text_model.head): not CLIP-family")
        return head


def _source(weights: Weights) -> str:
    """What ``from_pretrained`` takes: a hub id or a folder."""
    if weights.kind not in ("hub", "dir") or not weights.location.startswith(("hf-hub:", "/")):
        raise WeightsUnavailable(f"CLIP-family models load from hf-hub:ORG/NAME or a local folder, not "
                                 f"{weights.location}")
    return weights.location.removeprefix("hf-hub:")


def tower_dims(weights: Weights) -> TowerDims:
    """Output widths read from the model's config alone (that of the loaded model, when it is loaded)."""
    from transformers import AutoConfig

    if weights in _LOADED:
        config = _LOADED[weights].model.config
    else:
        config = from_hub(weights, lambda: AutoConfig.from_pretrained(_source(weights)))
    text = getattr(config, "text_config", None)
    if text is None or getattr(config, "vision_config", None) is None:
        raise WeightsUnavailable(f"{weights.location} is a {config.model_type} model, not an image-text "
                                 "model with vision_config and text_config (CLIP, SigLIP)")
    context = text.max_position_embeddings
    if hasattr(config, "projection_dim"):  # CLIP: both towers projected to projection_dim
        return TowerDims(config.projection_dim, text.hidden_size, config.projection_dim, context)
    query = getattr(text, "projection_size", None) or text.hidden_size  # SigLIP: the text head's width
    return TowerDims(config.vision_config.hidden_size, text.hidden_size, query, context)


_LOADED: dict[Weights, PairedModel] = {}  # one copy per process, shared by both towers and the model
_LOCK = threading.Lock()


def load_pair(weights: Weights, local_only: bool = False) -> PairedModel:
    """The model, tokenizer and image processor of ``weights``, loaded once per process (CPU, eval).

    ``local_only``: never touch the network (a hub id must already be in the local Hugging Face cache).
    """
    with _LOCK:
        if weights not in _LOADED:
            _LOADED[weights] = _load(weights, local_only)
        return _LOADED[weights]


def _load(weights: Weights, local_only: bool) -> PairedModel:
    """Load the three parts of an image-text model (see ``load_pair``)."""
    from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

    source, kw = _source(weights), {"local_files_only": local_only}
    log.info("loading image-text model %s", weights.location)
    model = from_hub(weights, lambda: AutoModel.from_pretrained(source, **kw))
    if not hasattr(model, "get_image_features") or not hasattr(model, "text_model"):
        raise WeightsUnavailable(f"{weights.location} loads as {type(model).__name__}, not an image-text "
                                 "model (CLIP, SigLIP)")
    tokenizer = from_hub(weights, lambda: AutoTokenizer.from_pretrained(source, **kw))
    processor = from_hub(weights, lambda: AutoImageProcessor.from_pretrained(source, **kw))
    pair = PairedModel(model.eval(), tokenizer, processor, weights)
    pair.text_head()  # fail now, not at the first query, for a model without one
    return pair


def image_preprocessing(processor: object) -> dict:
    """BackboneCfg overrides (input_size, mean, std) from a transformers image processor."""
    size = processor.crop_size if getattr(processor, "do_center_crop", False) else processor.size
    side = size.get("height") or size.get("shortest_edge")
    return {"input_size": int(side), "mean": tuple(processor.image_mean), "std": tuple(processor.image_std)}


class ImageTower(nn.Module):
    """Normalised pixels (N, 3, S, S) -> (N, D) pooled, projected image embeddings."""

    def __init__(self, pair: PairedModel) -> None:
        super().__init__()
        self.model, self.processor = pair.model, pair.image_processor
        self.preprocess = image_preprocessing(pair.image_processor)  # read by create_backbone
        self.head = None  # no classifier (VisualBackbone.classify refuses)

    def pixel_values(self, frames: torch.Tensor, fit: str = "crop") -> torch.Tensor:
        """uint8 RGB frames (N, 3, H, W) of any size -> the model's input (N, 3, S, S), by its own image
        processor: "crop" as the processor is configured (the reference), "whole" with the whole frame
        resized to the square input (no crop)."""
        out = self.processor(images=list(frames.cpu()), return_tensors="pt", **self._fit(fit))
        return out["pixel_values"]

    def prepared(self, frames: torch.Tensor, fit: str = "crop") -> torch.Tensor:
        """The processor's geometric steps alone (resize, crop): uint8 (N, 3, H, W) -> uint8 (N, 3, S, S).

        ``pixel_values`` of the result equals ``pixel_values`` of the frames bit for bit (the processor's
        resize and crop leave an S x S frame as it is), so frames can be prepared on a CPU and stored small
        while the model's device does only the rest (tests/test_clip_fidelity.py)."""
        out = self.processor(images=list(frames.cpu()), return_tensors="pt", do_rescale=False,
                             do_normalize=False, **self._fit(fit))["pixel_values"]
        return out if out.dtype == torch.uint8 else out.round().clamp_(0, 255).to(torch.uint8)

    def _fit(self, fit: str) -> dict:
        """The processor's arguments for a frame fit: none for "crop", the whole frame squared for "whole"."""
        side = self.preprocess["input_size"]
        return {} if fit == "crop" else {"do_center_crop": False, "size": {"height": side, "width": side}}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Embeddings in the model's dtype (half on CUDA)."""
        dtype = next(self.model.parameters()).dtype
        return self.model.get_image_features(pixel_values=x.to(dtype)).pooler_output


class TextTower(nn.Module):
    """Token ids -> last hidden states; SigLIP ignores the attention mask, as it was trained."""

    def __init__(self, pair: PairedModel) -> None:
        super().__init__()
        self.text_model = pair.model.text_model
        self.full_length = pair.model_type in FULL_LENGTH_TEXT

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **_: object) -> object:
        """The text model's output (``last_hidden_state`` (B, L, D))."""
        mask = None if self.full_length else attention_mask
        return self.text_model(input_ids=input_ids, attention_mask=mask)


def clean_text(text: str) -> str:
    """A caption as OpenAI's CLIP and open_clip clean it before their BPE (``basic_clean`` then
    ``whitespace_clean``): ftfy's ``fix_text``, HTML entities unescaped twice, runs of whitespace made one
    space, stripped."""
    import ftfy

    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return re.sub(r"\s+", " ", text).strip()


class ModelTokenizer:
    """The model's tokenizer fed as its authors feed it: texts cleaned (``clean_text``) first; for models
    trained on full-length text (SigLIP), padded texts go to the full length with every position kept
    (SigLIP's text tower attends to all positions, padding included, and pools the last one)."""

    def __init__(self, tokenizer: object, full_length: int | None = None) -> None:
        self.tokenizer, self.full_length = tokenizer, full_length

    def __call__(self, texts: list[str], **kw: object) -> dict:
        """Tokenize the cleaned texts (``padding``: see the class docstring)."""
        texts = [clean_text(t) for t in ([texts] if isinstance(texts, str) else texts)]
        if not kw.get("padding") or self.full_length is None:
            return self.tokenizer(texts, **kw)
        kw.update(padding="max_length", truncation=True, max_length=self.full_length)
        out = self.tokenizer(texts, **kw)
        out["attention_mask"] = torch.ones_like(out["input_ids"])
        return out

    def __getattr__(self, name: str) -> object:
        return getattr(self.tokenizer, name)


def text_tokenizer(pair: PairedModel) -> ModelTokenizer:
    """The tokenizer ``TextBackbone`` should call for this model."""
    full = pair.model_type in FULL_LENGTH_TEXT
    length = pair.model.config.text_config.max_position_embeddings
    return ModelTokenizer(pair.tokenizer, length if full else None)
