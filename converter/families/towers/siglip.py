"""Gemma 3's SigLIP vision tower and its projector (MaxText `vision_encoder_block: gemma3`).

The patch embedding is a conv (HF (Dv, 3, p, p) -> HWIO), the position table gains MaxText's leading axis, the
projector's input kernel is stored (in, out) already and its RMSNorm is applied as 1 + w (Gemma's rule, stored
w + 1 as the decoder's norms). No query scale is baked in: MaxText scales by dv**-0.5 at run time, as SigLIP does.
"""

from __future__ import annotations

from converter import ops
from converter.families.base import Param, Towers
from converter.families.towers import parts
from converter.model_config import ModelConfig

ENCODER = "vision_encoder/Gemma3VisionEncoderLayer_0"
PROJECTOR = "vision_encoder/VisionEmbedder_0"
TOKENS_PER_IMAGE = 256  # MaxText's VisionExit(output_length=256).
IMAGE_TOKEN = 262144  # Hard-coded by MaxText, not read from config.json.


def towers(cfg: ModelConfig, *, tower: str, projector: str) -> Towers:
  """The tower read from `tower` (e.g. "vision_tower.vision_model") and the projector from `projector`."""
  need = parts.Section.of(cfg, "vision_config")
  Dv, Hv, Iv, Nv = need.encoder()
  p, s, C = int(need("patch_size")), int(need("image_size")), int(need("num_channels", 3))
  E = cfg.hidden_size
  _check(cfg, need.values, s, p)
  side = s // p
  params: list[Param] = [
      Param(f"{ENCODER}/embedding/kernel", f"{tower}.embeddings.patch_embedding.weight", (Dv, C, p, p),
            (ops.Permute((2, 3, 1, 0)),)),
      Param(f"{ENCODER}/embedding/bias", f"{tower}.embeddings.patch_embedding.bias", (Dv,)),
      Param(f"{ENCODER}/pos_embedding", f"{tower}.embeddings.position_embedding.weight", (side * side, Dv),
            (ops.Reshape((1, side * side, Dv)),)),
  ]
  for i in range(Nv):
    mt, hf = f"{ENCODER}/Transformer/encoderblock_{i}", f"{tower}.encoder.layers.{i}"
    params += parts.norm(f"{mt}/LayerNorm_0", f"{hf}.layer_norm1", Dv)
    params += parts.attention(f"{mt}/MultiHeadDotProductAttention_0", f"{hf}.self_attn", Dv, Hv,
                              ("q_proj", "k_proj", "v_proj", "out_proj"))
    params += parts.norm(f"{mt}/LayerNorm_1", f"{hf}.layer_norm2", Dv)
    params += parts.dense(f"{mt}/MlpBlockViT_0/Dense_0", f"{hf}.mlp.fc1", Dv, Iv)
    params += parts.dense(f"{mt}/MlpBlockViT_0/Dense_1", f"{hf}.mlp.fc2", Iv, Dv)
  params += parts.norm(f"{ENCODER}/Transformer/encoder_norm", f"{tower}.post_layernorm", Dv)
  params += [
      Param(f"{PROJECTOR}/mm_input_projection/w", f"{projector}.mm_input_projection_weight", (Dv, E)),
      *parts.norm(f"{PROJECTOR}/mm_soft_embedding_norm", f"{projector}.mm_soft_emb_norm", Dv, bias=False,
                  offset=1.0),
  ]
  overrides = (("image_size_for_vit", s), ("patch_size_for_vit", p), ("conv_stride_for_vit", p),
               ("hidden_size_for_vit", Dv), ("intermediate_size_for_vit", Iv), ("num_hidden_layers_for_vit", Nv),
               ("num_attention_heads_for_vit", Hv), ("num_channels_for_vit", C))
  owns = {rf"{_escape(tower)}\.": "the SigLIP vision tower", rf"{_escape(projector)}\.": "the vision projector"}
  return Towers(tuple(params), overrides, owns)


def _escape(prefix: str) -> str:
  return prefix.replace(".", r"\.")


def _check(cfg: ModelConfig, v: dict, image_size: int, patch: int) -> None:
  """What MaxText's Gemma 3 tower fixes rather than reads: refused where it would compute something else."""
  problems = []
  if image_size % patch or (image_size // patch) % 16:
    problems.append(f"vision_config image_size/patch_size = {image_size}/{patch}: MaxText pools the patch grid to"
                    f" 16x16 = {TOKENS_PER_IMAGE} tokens, so it must be a multiple of 16 patches a side")
  tokens = cfg.get("mm_tokens_per_image", TOKENS_PER_IMAGE)
  if tokens != TOKENS_PER_IMAGE:
    problems.append(f"mm_tokens_per_image={tokens}: MaxText's Gemma 3 tower always yields {TOKENS_PER_IMAGE}")
  token = cfg.get("image_token_index", cfg.get("image_token_id", IMAGE_TOKEN))
  if token != IMAGE_TOKEN:
    problems.append(f"image_token_index={token}: MaxText 0.2.5 hard-codes {IMAGE_TOKEN}")
  if v.get("vision_use_head"):
    problems.append("vision_config.vision_use_head=true: MaxText's tower has no attention-pooling head")
  act = v.get("hidden_act", "gelu_pytorch_tanh")
  if act not in ("gelu_pytorch_tanh", "gelu_new", "gelu_fast"):
    problems.append(f"vision_config.hidden_act={act!r}: MaxText's tower uses the tanh GELU")
  eps = float(v.get("layer_norm_eps", 1e-6))
  if abs(eps - cfg.rms_norm_eps) > 1e-12:
    problems.append(f"vision_config.layer_norm_eps={eps:g} differs from the text rms_norm_eps={cfg.rms_norm_eps:g}:"
                    " MaxText uses one normalization_layer_epsilon for both")
  parts.refuse_if_any(cfg, "vision tower", problems)
