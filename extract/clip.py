"""CLIP-family image-text models (CLIP, SigLIP): both towers from one folder or hub id.

The ``clip`` profile's visual backbone ``clip`` (one pooled, projected image embedding per frame) and text
backbone ``clip_text`` (every token's last hidden state) are two towers of ONE model, loaded once with
transformers' Auto classes (``AutoModel``, ``AutoTokenizer``, ``AutoImageProcessor``) from a hub id or a
local folder and shared by both backbones (``load_pair``). Image size, mean and std come from the folder's
image processor; frames are resized whole (no crop) by the frame pipeline, as for every backbone.

The pooled, projected text embedding that training-free scoring needs is a linear head applied to ONE
token row (``text_head``): CLIP pools the end-of-text token, which is the last non-padding token that
``clip_text`` keeps; SigLIP was trained on text padded to its full length (64) with no attention mask and
pools the last position, so for SigLIP ``clip_text`` keeps all 64 positions. Either way the pooled row is
the last row returned, so ``head(tokens[-1])`` is exactly the model's ``get_text_features``.

Default hub model, chosen by quality per CPU second (``python -m benchmarks.clip_speed`` times the real
architectures with random weights on CPU, same FLOPs; quality is the published ImageNet zero-shot top-1):
  laion/CLIP-ViT-B-32-laion2B-s34B-b79K  66.6 %  (open_clip results table)  ViT-B/32: 1/4 of a B/16's FLOPs
  openai/clip-vit-base-patch32           63.2 %  (CLIP paper)                same cost as the LAION B/32
  openai/clip-vit-base-patch16           68.6 %  (CLIP paper)                ViT-B/16: about 4x the FLOPs
  google/siglip-base-patch16-224         76.2 %  (big_vision SigLIP table)   ViT-B/16: about 4x the FLOPs
Counted: 8.7 GFLOPs per frame for a B/32, 33.7 (CLIP B/16) and 34.0 (SigLIP B/16); measured CPU time per
frame follows (3.6-4x). The LAION ViT-B/32 gives the most accuracy per CPU second, about 3.5x that of
either B/16 (a free Space has 2 CPU cores and every uploaded minute is 60 frames), and beats the OpenAI
B/32 at equal cost. On a GPU host, where frame cost hardly
matters, ``--weights clip=hf-hub:google/siglip-base-patch16-224`` is the stronger choice (SigLIP-family
features lead training-free PRVR, docs field notes). Measured numbers: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import logging
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
    if hasattr(config, "projection_dim"):  # CLIP: both towers projected to projection_dim
        return TowerDims(config.projection_dim, text.hidden_size, config.projection_dim)
    query = getattr(text, "projection_size", None) or text.hidden_size  # SigLIP: the text head's width
    return TowerDims(config.vision_config.hidden_size, text.hidden_size, query)


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
        self.model = pair.model
        self.preprocess = image_preprocessing(pair.image_processor)  # read by create_backbone
        self.head = None  # no classifier (VisualBackbone.classify refuses)

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


class FullLengthTokenizer:
    """A tokenizer that pads every text to the model's full length and marks every position as kept.

    SigLIP's text tower attends to all positions (padding included) and pools the last one.
    """

    def __init__(self, tokenizer: object, length: int) -> None:
        self.tokenizer, self.length = tokenizer, length

    def __call__(self, texts: list[str], **kw: object) -> dict:
        """Tokenize; with ``padding`` requested, pad to the full length and keep every position."""
        if not kw.get("padding"):
            return self.tokenizer(texts, **kw)
        kw.update(padding="max_length", truncation=True, max_length=self.length)
        out = self.tokenizer(texts, **kw)
        out["attention_mask"] = torch.ones_like(out["input_ids"])
        return out


def text_tokenizer(pair: PairedModel) -> object:
    """The tokenizer ``TextBackbone`` should call for this model."""
    if pair.model_type not in FULL_LENGTH_TEXT:
        return pair.tokenizer
    return FullLengthTokenizer(pair.tokenizer, pair.model.config.text_config.max_position_embeddings)
