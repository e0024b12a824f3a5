"""Qwen3-VL, Weaver and Qwen3.5: one image between text tokens, as the Qwen processors lay it out (vision start,
one image placeholder per merged 2x2 patch block, vision end).

The image is given as patch rows, (T*H*W, C*tp*p*p) in the processors' merge-window order: random values, the two
frames of each patch different (a still image repeats one frame; distinct frames make the conv's temporal kernel
axis count). transformers takes those rows with `image_grid_thw`; MaxText takes the same rows reshaped raw to
(1, C, tp*T, p*H, p*W), as its own `preprocess_mm_data_qwen3_omni` packs them (the encoder reshapes them back to
patches). MaxText's MRoPE positions come from its own `get_rope_index`, run on the MaxText side
(`rope_index_image_grid_thw`: maxtext_logits.py); transformers builds its own from `mm_token_type_ids` (1 on the
image), without which it raises.
"""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np

from tools import weaver_checkpoint
from tools.multimodal_inputs import MultimodalCase

GRID = (1, 6, 8)  # (T, H, W) in patches: a non-square grid, so swapped axes change values.
ALIGN = ("qwen_vision_pos_embed_f32", "qwen_merger_exact_gelu")  # maxtext_logits.ALIGNMENTS (contract section 2).


def make_case(hf_dir: str, seed: int) -> MultimodalCase:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  if weaver_checkpoint.is_weaver(hf_dir):  # transformers has no Weaver: the Qwen3-VL it renames runs.
    with tempfile.TemporaryDirectory() as renamed:
      return make_case(weaver_checkpoint.as_qwen3_vl(hf_dir, renamed), seed)
  with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
    config = json.load(f)
  vision = config["vision_config"]
  p, tp, m, channels = (vision[k] for k in ("patch_size", "temporal_patch_size", "spatial_merge_size", "in_channels"))
  t, h, w = GRID
  rng = np.random.default_rng(seed)
  patches = rng.uniform(-1.0, 1.0, size=(t * h * w, channels * tp * p * p)).astype(np.float32)
  start, end, image = config["vision_start_token_id"], config["vision_end_token_id"], config["image_token_id"]
  text = min(start, image)  # Ordinary text ids: below every special token either side looks for.
  ids = np.concatenate([rng.integers(0, text, size=20), [start], np.full(t * h * w // (m * m), image), [end],
                        rng.integers(0, text, size=28)]).astype(np.int64)[None]
  grid = np.asarray([GRID], dtype=np.int64)
  model = getattr(transformers, config["architectures"][0]).from_pretrained(
      hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
  with torch.no_grad():
    out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.ones_like(torch.from_numpy(ids)),
                pixel_values=torch.from_numpy(patches), image_grid_thw=torch.from_numpy(grid),
                mm_token_type_ids=torch.from_numpy((ids == image).astype(np.int64)))
  reference = out.logits.float().numpy()
  images = patches.reshape(1, channels, tp * t, p * h, p * w)
  return MultimodalCase(ids.astype(np.int32), reference,
                        {"encoder_images": images, "rope_index_image_grid_thw": grid.astype(np.int32)}, align=ALIGN)
