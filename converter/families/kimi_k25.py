"""Kimi K2.5 and K2.6 (`KimiK25ForConditionalGeneration`): Kimi K2's text model (DeepSeek V3's architecture,
converter/families/deepseek.py) under `language_model.`, beside a MoonViT vision tower and its projector.

The text config is config.json's `text_config` (with `quantization_config`: the routed experts ship INT4,
converter/sources/compressed.py), its head `language_model.lm_head.weight` (transformers' Kimi_K25Config defaults
`tie_word_embeddings` to true, but the checkpoint stores its own head). MaxText 0.2.5 runs the text model as
`kimi-k2-1t` and has no form for the vision tower: `vision_tower.*` and `mm_projector.*` are skipped with a warning
that names them (MaxText's own script drops them silently), so no flag is needed. The way back writes the text
model under the wrapper's names with the original config, which transformers loads (its tower left initialised).
"""

from converter.families import deepseek
from converter.families.base import Family, Layout
from converter.model_config import ModelConfig

TEXT = "language_model."
VISION = {
    r"(model\.)?vision_tower\.": "the MoonViT vision tower: MaxText 0.2.5's kimi-k2-1t is text only (it has no"
                                " Kimi vision encoder), so it is not converted",
    r"(model\.)?mm_projector\.": "the vision tower's projector into the text model: MaxText 0.2.5 has no Kimi"
                                 " vision encoder, so it is not converted",
}


def _layout(cfg: ModelConfig, target: str, target_vocab: int, scan_layers: bool) -> Layout:
  text = deepseek.FAMILY.layout(cfg, target, target_vocab, scan_layers)
  return text.under(TEXT + "model.").under(TEXT + "lm_head.", old="lm_head.")


def _ignored(cfg: ModelConfig) -> dict[str, str]:
  text = {TEXT.replace(".", r"\.") + p if p.startswith("model") else p: why
          for p, why in deepseek.FAMILY.ignored_tensors(cfg).items()}
  return {**text, **VISION}


FAMILY = Family(
    name="kimi_k25",
    # The hub's config names the remote-code class; transformers 5.24 saves its own, Kimi_K25...
    architectures=("KimiK25ForConditionalGeneration", "Kimi_K25ForConditionalGeneration"),
    targets=("kimi-k2",),
    infer_target=lambda cfg: deepseek.KIMI_MODEL,
    runtime=deepseek.FAMILY.runtime,
    layout=_layout,
    check=deepseek.FAMILY.check,
    ignored_tensors=_ignored,
    # transformers 5.24 saves its own Kimi_K25 model's text layers as `blocks` (a reverse-mapping artefact).
    tensor_aliases=lambda cfg: ((r"^language_model\.model\.blocks\.", "language_model.model.layers."),),
)
