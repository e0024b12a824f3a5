"""Llama 4: one image of two tiles between text tokens, each tile normalized as transformers' Llama4ImageProcessor
does ((x/255 - 0.5)/0.5) and given channels-first to both models (MaxText: (B, tiles, 3, t, t); transformers: the
tiles of the batch, (B * tiles, 3, t, t)). The text holds begin-of-image, one `<|patch|>` placeholder per soft
token of each tile ((t/p)^2 * r^2) with a text token between the tiles, and end-of-image; both models fill the
placeholders with the tiles' soft tokens in order. Neither attends bidirectionally over the image.

transformers 5.24's `Llama4ForConditionalGeneration.forward` reads `image_outputs` from its language model's output,
a `MoeCausalLMOutputWithPast` that has no such field (AttributeError); the reference runs with that class given a
None default for it, which changes nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os

import numpy as np

from tools.multimodal_inputs import MultimodalCase

PATCH_TOKEN = 200092  # LLAMA4_PATCH_TOKEN.
TILES = 2
TEXT_IDS = 200000  # Random text ids stay below Llama 4's special tokens.


@contextlib.contextmanager
def _image_outputs_default():
  """`MoeCausalLMOutputWithPast.image_outputs` = None for the duration (transformers 5.24's forward reads it)."""
  from transformers import modeling_outputs  # pylint: disable=g-import-not-at-top

  cls = modeling_outputs.MoeCausalLMOutputWithPast
  had = "image_outputs" in vars(cls)
  if not had:
    cls.image_outputs = None
  try:
    yield
  finally:
    if not had:
      del cls.image_outputs


def make_case(hf_dir: str, seed: int) -> MultimodalCase:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
    config = json.load(f)
  vocab, vision = config["text_config"]["vocab_size"], config["vision_config"]
  if vocab <= PATCH_TOKEN:
    raise ValueError(f"{hf_dir}: vocab_size {vocab} <= {PATCH_TOKEN}: transformers embeds the placeholder ids")
  tile = vision["image_size"]
  per_tile = int((tile // vision["patch_size"]) ** 2 * vision["pixel_shuffle_ratio"] ** 2)
  rng = np.random.default_rng(seed)
  pixels = rng.integers(0, 256, size=(1, TILES, 3, tile, tile)).astype(np.float32)
  normalized = (pixels / 255.0 - 0.5) / 0.5
  text = lambda n: rng.integers(2, min(vocab, TEXT_IDS), size=n)  # pylint: disable=unnecessary-lambda-assignment
  image = [config["boi_token_index"], *np.full(per_tile, PATCH_TOKEN), *text(1), *np.full(per_tile, PATCH_TOKEN),
           config["eoi_token_index"]]
  ids = np.concatenate([text(12), image, text(14)]).astype(np.int64)[None]
  model = transformers.Llama4ForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32,
                                                                      attn_implementation="eager").eval()
  with torch.no_grad(), _image_outputs_default():
    out = model(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(normalized.reshape(-1, 3, tile, tile)),
                attention_mask=torch.ones_like(torch.from_numpy(ids)))
  reference = out.logits.float().numpy()
  return MultimodalCase(ids.astype(np.int32), reference, {"encoder_images": normalized})
