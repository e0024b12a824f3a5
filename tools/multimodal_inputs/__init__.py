"""Image (+ audio) + text cases for the MaxText interop check of multimodal tiny models (test-only: torch).

One module per input kind (a TinyModelSpec's `inputs`), each with `make_case(hf_dir, seed) -> MultimodalCase`: the
token ids with the image placeholders where MaxText expects them, transformers' float32 logits for them, and the
arrays MaxText's model call takes (`encoder_images`, `encoder_audios`, and `decoder_positions` where MaxText's own
processor computes positions other than 0..S-1), prepared as MaxText's own preprocessing prepares them.
"""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np


@dataclasses.dataclass
class MultimodalCase:
  token_ids: np.ndarray  # (B, S) int32.
  reference: np.ndarray  # transformers' float32 logits (B, S, V).
  # Keyword arguments of MaxText's model call, and `rope_index_<argument>`: arguments of MaxText's own
  # `get_rope_index`, which computes the decoder positions on the MaxText side (maxtext_logits.py).
  maxtext_inputs: dict[str, np.ndarray]
  # MaxText 0.2.5 arithmetic switched to transformers' for the aligned forward (maxtext_logits.ALIGNMENTS).
  align: tuple[str, ...] = ()

  def save(self, path: str) -> None:
    np.savez(path, token_ids=self.token_ids, **self.maxtext_inputs)


def make_case(model: str, hf_dir: str, seed: int) -> MultimodalCase:
  from tools.testing import tiny_models  # pylint: disable=g-import-not-at-top

  kind = tiny_models.TINY_MODELS[model].inputs
  return importlib.import_module(f"{__name__}.{kind}").make_case(hf_dir, seed)
