"""Gemma 4: one image between text tokens, at the geometry MaxText's own preprocessing resizes every image to
(multimodal/processor_gemma4.py: 672x960, in [0, 1], no mean/std: both models compute 2(x - 0.5) themselves).

MaxText takes the image channels-last and patchifies it itself; transformers takes the patches as its image
processor lays them out (each patch's pixels (p, p, C) row-major, patches row by row) with their (x, y) = (column,
row) ids, padding none. The text holds begin-of-image, one placeholder per soft token (patches / pooling^2) and
end-of-image. transformers needs `use_bidirectional_attention: "vision"` (config) and `mm_token_type_ids` (1 on the
placeholders) for the image block's bidirectional attention in sliding layers; MaxText finds the block by the
placeholder id. transformers replaces placeholder ids by pad before embedding; MaxText clamps them.
"""

from __future__ import annotations

import json
import os

import numpy as np

from tools.multimodal_inputs import MultimodalCase

IMAGE_TOKEN = 258880  # GEMMA4_TOKEN_PLACEHOLDER.
IMAGE_HEIGHT, IMAGE_WIDTH = 672, 960  # GEMMA4_IMAGE_HEIGHT / GEMMA4_IMAGE_WIDTH.


def patchify(image: np.ndarray, patch: int) -> tuple[np.ndarray, np.ndarray]:
  """(H, W, C) -> patches (N, p*p*C) and their (x, y) ids (N, 2), as transformers' Gemma4ImageProcessor
  (`convert_image_to_patches`, then a meshgrid of (column, row))."""
  height, width, channels = image.shape
  rows, columns = height // patch, width // patch
  patches = image.reshape(rows, patch, columns, patch, channels).transpose(0, 2, 1, 3, 4)
  positions = np.stack(np.meshgrid(np.arange(columns), np.arange(rows), indexing="xy"), axis=-1)
  return patches.reshape(rows * columns, patch * patch * channels), positions.reshape(rows * columns, 2)


def make_case(hf_dir: str, seed: int) -> MultimodalCase:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
    config = json.load(f)
  vocab = config["text_config"]["vocab_size"]
  patch, pooling = config["vision_config"]["patch_size"], config["vision_config"]["pooling_kernel_size"]
  rng = np.random.default_rng(seed)
  image = (rng.integers(0, 256, size=(IMAGE_HEIGHT, IMAGE_WIDTH, 3)) / 255.0).astype(np.float32)
  patches, positions = patchify(image, patch)
  tokens = len(patches) // pooling**2
  boi, eoi = config["boi_token_id"] % vocab, config["eoi_token_id"] % vocab
  before, after = rng.integers(2, vocab, size=20), rng.integers(2, vocab, size=40)
  ids = np.concatenate([before, [boi], np.full(tokens, IMAGE_TOKEN), [eoi], after]).astype(np.int64)[None]
  model = transformers.Gemma4ForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32,
                                                                      attn_implementation="eager").eval()
  with torch.no_grad():
    out = model(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(patches[None]),
                image_position_ids=torch.from_numpy(positions[None]),
                mm_token_type_ids=torch.from_numpy((ids == IMAGE_TOKEN).astype(np.int64)),
                attention_mask=torch.ones_like(torch.from_numpy(ids)))
  reference = out.logits.float().numpy()
  return MultimodalCase(ids.astype(np.int32), reference, {"encoder_images": image[None, None]})
