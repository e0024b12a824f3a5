"""Qwen3-Omni thinker: one image and one audio clip between text tokens, laid out as transformers' processor and
MaxText's `add_extra_tokens_for_qwen3_omni` lay them out (<|vision_start|>, one <|image_pad|> per merged 2x2 patch
block, <|vision_end|>; <|audio_start|>, one <|audio_pad|> per audio token, <|audio_end|>).

The image is given as patch rows, as for Qwen3-VL (tools/multimodal_inputs/qwen_vl.py: random rows on a non-square
grid, the two frames of each patch different; MaxText takes them reshaped raw to (1, C, tp*T, p*H, p*W)). The audio
is one chunk of 2 * n_window frames of log-mel features (batch, mel, frames), the case where MaxText's chunk-local
attention and transformers' windowed attention agree. transformers builds the thinker's 3-D MRoPE positions only
when given `attention_mask` (without it: 1-D positions, silently); MaxText's come from its own `get_rope_index` on the
MaxText side (maxtext_logits.py), given the image grid and the audio length in frames (`audio_lengths` are frames
there: it counts the tokens itself).
"""

from __future__ import annotations

import json
import os

import numpy as np

from tools.multimodal_inputs import MultimodalCase, qwen_vl

GRID = (1, 8, 12)  # (T, H, W) in patches: a non-square grid, so swapped axes change values.
ALIGN = qwen_vl.ALIGN + ("omni_audio_exact_gelu",)  # maxtext_logits.ALIGNMENTS (contract section 2).
# Log-mel features drawn in [-8, 8], several times the processor's range: the tiny model's random 3x3 kernels (std
# 0.05) pass on little more than their biases at [-1, 1], where a kernel with its (mel, time) axes swapped moves the
# logits by 1e-4 only (3e-2 here).
FEATURE_RANGE = 8.0


def audio_tokens(frames: int) -> int:
  """The audio tokens of one chunk: its frames after three stride-2 convs (100 -> 13), as both sides count them."""
  for _ in range(3):
    frames = (frames - 1) // 2 + 1
  return frames


def make_case(hf_dir: str, seed: int) -> MultimodalCase:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
    config = json.load(f)
  thinker = config["thinker_config"]
  vision, audio = thinker["vision_config"], thinker["audio_config"]
  p, tp, m, channels = (vision[k] for k in ("patch_size", "temporal_patch_size", "spatial_merge_size", "in_channels"))
  mel, frames = audio["num_mel_bins"], 2 * audio["n_window"]
  t, h, w = GRID
  rng = np.random.default_rng(seed)
  patches = rng.uniform(-1.0, 1.0, size=(t * h * w, channels * tp * p * p)).astype(np.float32)
  features = rng.uniform(-FEATURE_RANGE, FEATURE_RANGE, size=(1, mel, frames)).astype(np.float32)

  specials = {k: thinker[k] for k in ("vision_start_token_id", "image_token_id", "vision_end_token_id",
                                       "audio_start_token_id", "audio_token_id", "audio_end_token_id")}
  text = lambda n: rng.integers(0, min(specials.values()), size=n)  # Ordinary ids, below every special one.
  ids = np.concatenate([text(8), [specials["vision_start_token_id"]],
                        np.full(t * h * w // (m * m), specials["image_token_id"]), [specials["vision_end_token_id"]],
                        text(6), [specials["audio_start_token_id"]],
                        np.full(audio_tokens(frames), specials["audio_token_id"]), [specials["audio_end_token_id"]],
                        text(8)]).astype(np.int64)[None]
  grid = np.asarray([GRID], dtype=np.int64)

  model = transformers.Qwen3OmniMoeForConditionalGeneration.from_pretrained(
      hf_dir, dtype=torch.float32, attn_implementation="eager").thinker.eval()
  with torch.no_grad():
    out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.ones_like(torch.from_numpy(ids)),
                pixel_values=torch.from_numpy(patches), image_grid_thw=torch.from_numpy(grid),
                input_features=torch.from_numpy(features),
                feature_attention_mask=torch.ones((1, frames), dtype=torch.long))
  reference = out.logits.float().numpy()
  images = patches.reshape(1, channels, tp * t, p * h, p * w)
  return MultimodalCase(ids.astype(np.int32), reference,
                        {"encoder_images": images, "encoder_audios": features,
                         "rope_index_image_grid_thw": grid.astype(np.int32),
                         "rope_index_audio_lengths": np.asarray([frames], dtype=np.int32)}, align=ALIGN)
