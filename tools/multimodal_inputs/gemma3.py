"""Gemma 3: one 64x64 image between text tokens, as transformers' Gemma3Processor lays it out (begin-of-image,
256 placeholders, end-of-image) and normalizes it ((x/255 - 0.5)/0.5); MaxText takes the same pixels channels-last.
transformers needs `token_type_ids` (1 on the image) for the bidirectional image block, MaxText finds the block by
the placeholder id."""

from __future__ import annotations

import json
import os

import numpy as np

from tools.multimodal_inputs import MultimodalCase

IMAGE_TOKEN = 262144
TOKENS_PER_IMAGE = 256


def make_case(hf_dir: str, seed: int) -> MultimodalCase:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
    config = json.load(f)
  vocab = config["text_config"]["vocab_size"]
  size = config["vision_config"]["image_size"]
  rng = np.random.default_rng(seed)
  pixels = rng.integers(0, 256, size=(1, size, size, 3)).astype(np.float32)
  normalized = (pixels / 255.0 - 0.5) / 0.5
  before = rng.integers(2, vocab, size=20)
  after = rng.integers(2, vocab, size=28)
  boi, eoi = config.get("boi_token_index", 255999) % vocab, config.get("eoi_token_index", 256000) % vocab
  ids = np.concatenate([before, [boi], np.full(TOKENS_PER_IMAGE, IMAGE_TOKEN), [eoi], after]).astype(np.int64)[None]
  model = transformers.Gemma3ForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32,
                                                                      attn_implementation="eager").eval()
  with torch.no_grad():
    out = model(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(normalized).permute(0, 3, 1, 2),
                token_type_ids=torch.from_numpy((ids == IMAGE_TOKEN).astype(np.int64)),
                attention_mask=torch.ones_like(torch.from_numpy(ids)))
  reference = out.logits.float().numpy()
  return MultimodalCase(ids.astype(np.int32), reference, {"encoder_images": normalized[:, None]})
