"""Gemma 4's vision tower and its projector (MaxText `vision_encoder_block: gemma4`, gemma4-26b and gemma4-31b).

No biases anywhere and no norm offsets: Gemma 4 stores its norms as applied (x * w), text and vision alike, so the
encoder's norms and q/k norms are copied (the value norm and the projector's pre-norm have no scale). The patch
embedding is a linear layer over patches flattened as (kh, kw, C), the order of both patchifiers, so its kernel is
the plain transpose; the two position tables (HF (2, Npos, Dv): x then y) become MaxText's (Npos, 2, Dv). The tower
attends unscaled on both sides. HF's soft-token standardization (`std_bias`, `std_scale`, saved buffers) is always
applied by MaxText, so a checkpoint without it is refused rather than given zeros and ones.

MaxText's multimodal pipeline (multimodal/processor_gemma4.py) resizes every image to 672x960 and counts its soft
tokens with a patch of 16 and a pooling kernel of 3 (280 per image); the tower itself patchifies and pools whatever
image it is given to `vision_output_length` tokens. The overrides describe that geometry with the checkpoint's own
patch and pooling sizes.
"""

from __future__ import annotations

from converter import ops
from converter.families.base import Param, Towers
from converter.families.towers import parts
from converter.model_config import ModelConfig

ENCODER = "vision_encoder/Gemma4VisionEncoderLayer_0"
PROJECTOR = "vision_encoder/Gemma4VisionProjector_0"
TOWER, EMBEDDER = "model.vision_tower", "model.embed_vision"
IMAGE_TOKEN = 258880  # processor_gemma4.GEMMA4_TOKEN_PLACEHOLDER, hard-coded by MaxText.
IMAGE_SIZE = (672, 960)  # processor_gemma4.GEMMA4_IMAGE_HEIGHT / _WIDTH: MaxText resizes every image to this.
PROCESSOR_PATCH, PROCESSOR_POOLING = 16, 3  # What processor_gemma4 counts soft tokens with.
OWNS = {r"model\.vision_tower\.": "Gemma 4's vision tower", r"model\.embed_vision\.": "Gemma 4's vision embedder"}


def towers(cfg: ModelConfig) -> Towers:
  """The tower of a `Gemma4ForConditionalGeneration` checkpoint (hub and transformers 5.24 names alike)."""
  need = parts.Section.of(cfg, "vision_config")
  v = need.values
  Dv, Hv, Iv, Nv = need.encoder()
  p, k, Npos = int(need("patch_size")), int(need("pooling_kernel_size")), int(need("position_embedding_size"))
  E = cfg.hidden_size
  _check(cfg, v, Dv, Hv, p, k, Npos)
  dv = Dv // Hv
  params: list[Param] = [
      Param(f"{ENCODER}/vision_entry/input_projection/kernel", f"{TOWER}.patch_embedder.input_proj.weight",
            (Dv, p * p * 3), (ops.Transpose(),)),
      Param(f"{ENCODER}/vision_entry/pos_emb_param", f"{TOWER}.patch_embedder.position_embedding_table",
            (2, Npos, Dv), (ops.Permute((1, 0, 2)),)),
  ]
  for i in range(Nv):
    mt, hf = f"{ENCODER}/layer_{i}", f"{TOWER}.encoder.layers.{i}"
    attention, mlp = f"{hf}.self_attn", f"{hf}.mlp"
    for name in ("query", "key", "value"):
      params += parts.heads_projection(f"{mt}/attention/{name}", f"{attention}.{name[0]}_proj", Dv, Hv, bias=False,
                                       weight="linear.weight")
    params += parts.out_projection(f"{mt}/attention/out", f"{attention}.o_proj", Dv, Hv, bias=False,
                                   weight="linear.weight")
    params += parts.norm(f"{mt}/attention/query_norm", f"{attention}.q_norm", dv, bias=False)
    params += parts.norm(f"{mt}/attention/key_norm", f"{attention}.k_norm", dv, bias=False)
    for maxtext_norm, hf_norm in (("pre_attention_norm", "input_layernorm"),
                                  ("post_attention_norm", "post_attention_layernorm"),
                                  ("pre_ffw_norm", "pre_feedforward_layernorm"),
                                  ("post_ffw_norm", "post_feedforward_layernorm")):
      params += parts.norm(f"{mt}/{maxtext_norm}", f"{hf}.{hf_norm}", Dv, bias=False)
    params += parts.dense(f"{mt}/mlp/wi_0", f"{mlp}.gate_proj.linear", Dv, Iv, bias=False)
    params += parts.dense(f"{mt}/mlp/wi_1", f"{mlp}.up_proj.linear", Dv, Iv, bias=False)
    params += parts.dense(f"{mt}/mlp/wo", f"{mlp}.down_proj.linear", Iv, Dv, bias=False)
  params += [
      Param(f"{ENCODER}/std_bias", f"{TOWER}.std_bias", (Dv,)),
      Param(f"{ENCODER}/std_scale", f"{TOWER}.std_scale", (Dv,)),
      *parts.dense(f"{PROJECTOR}/projection", f"{EMBEDDER}.embedding_projection", Dv, E, bias=False),
  ]
  height, width = IMAGE_SIZE
  overrides = (("hidden_size_for_vit", Dv), ("intermediate_size_for_vit", Iv), ("num_hidden_layers_for_vit", Nv),
               ("num_attention_heads_for_vit", Hv), ("num_channels_for_vit", 3), ("patch_size_for_vit", p),
               ("conv_stride_for_vit", p), ("image_size_for_vit", [height, width]),
               ("num_position_embeddings_for_vit", Npos),
               ("vision_output_length", (height // p) * (width // p) // (k * k)),
               ("rope_theta_for_vit", _rope_theta(v)))
  return Towers(tuple(params), overrides, dict(OWNS))


def warnings(cfg: ModelConfig) -> list[str]:
  """What converts but will not run in MaxText as in transformers: MaxText's image block attention, and its own
  image preprocessing's fixed geometry."""
  v = parts.sub_config(cfg, "vision_config")
  p, k = int(v.get("patch_size")), int(v.get("pooling_kernel_size"))
  height, width = IMAGE_SIZE
  tokens = (height // p) * (width // p) // (k * k)
  found = []
  bidirectional, window = cfg.get("use_bidirectional_attention"), int(cfg.get("sliding_window") or 512)
  if bidirectional != "vision":
    found.append(f"{cfg.path}: use_bidirectional_attention={bidirectional!r}: MaxText's Gemma 4 lets each image's"
                 " placeholders attend to each other in sliding-window layers (transformers does so only with"
                 " \"vision\"), so logits from image positions on differ from transformers'")
  if window <= tokens:
    found.append(f"{cfg.path}: sliding_window={window} does not exceed the {tokens} soft tokens of an image:"
                 " MaxText and transformers combine the window with the image block differently, so logits from"
                 " image positions on differ from transformers'")
  if (p, k) != (PROCESSOR_PATCH, PROCESSOR_POOLING):
    found.append(f"{cfg.path}: vision_config patch_size={p}, pooling_kernel_size={k}: MaxText 0.2.5's Gemma 4 image"
                 f" preprocessing (multimodal/processor_gemma4.py) counts the soft tokens of a {height}x{width} image"
                 f" with patch {PROCESSOR_PATCH} and pooling {PROCESSOR_POOLING}, so its prompts hold the wrong number"
                 f" of image placeholders for this tower; images prepared elsewhere (vision_output_length={tokens}"
                 " per image) run as in transformers")
  return found


def _rope_theta(v: dict) -> float:
  """transformers 5's `rope_parameters.rope_theta`, or transformers 4's `rope_theta`; else Gemma4VisionConfig's."""
  return float((v.get("rope_parameters") or {}).get("rope_theta", v.get("rope_theta", 100.0)))


def _check(cfg: ModelConfig, v: dict, Dv: int, Hv: int, p: int, k: int, Npos: int) -> None:
  """What MaxText's Gemma 4 tower fixes rather than reads: refused where it would compute something else."""
  problems = []
  if Dv % Hv:
    problems.append(f"vision_config.hidden_size={Dv} is not a multiple of num_attention_heads={Hv}")
  elif int(v.get("head_dim") or Dv // Hv) != Dv // Hv:
    problems.append(f"vision_config.head_dim={v.get('head_dim')}: MaxText's tower uses hidden_size /"
                    f" num_attention_heads = {Dv // Hv}")
  kv_heads = int(v.get("num_key_value_heads") or Hv)
  if kv_heads != Hv:
    problems.append(f"vision_config.num_key_value_heads={kv_heads}: MaxText's tower has as many key/value heads as"
                    f" query heads ({Hv})")
  if v.get("use_clipped_linears"):
    problems.append("vision_config.use_clipped_linears=true: MaxText's tower has no clip bounds (its e2b/e4b towers"
                    " need them, and MaxText 0.2.5 runs those text-only)")
  if not v.get("standardize"):
    problems.append("vision_config.standardize=false: MaxText's tower always standardizes its soft tokens with"
                    " std_bias/std_scale, which this checkpoint does not have")
  act = v.get("hidden_activation", "gelu_pytorch_tanh")
  if act not in ("gelu_pytorch_tanh", "gelu_new", "gelu_fast"):
    problems.append(f"vision_config.hidden_activation={act!r}: MaxText's tower uses the tanh GELU")
  # transformers reads "default" as "axial" here (the hub configs say "default"; RotaryEmbeddingConfigMixin).
  rope_type = (v.get("rope_parameters") or {}).get("rope_type", "axial")
  if rope_type not in ("axial", "default"):
    problems.append(f"vision_config.rope_parameters.rope_type={rope_type!r}: MaxText's tower has only the axial 2-D"
                    " rope")
  eps = float(v.get("rms_norm_eps", 1e-6))
  if abs(eps - cfg.rms_norm_eps) > 1e-12:
    problems.append(f"vision_config.rms_norm_eps={eps:g} differs from the text rms_norm_eps={cfg.rms_norm_eps:g}:"
                    " MaxText's tower and projector norms use normalization_layer_epsilon, the text one")
  height, width = IMAGE_SIZE
  if height % (p * k) or width % (p * k):
    problems.append(f"vision_config patch_size={p}, pooling_kernel_size={k}: MaxText's {height}x{width} images do"
                    f" not split into whole {p * k}-pixel pooling cells")
  elif max(height, width) // p > Npos:
    problems.append(f"vision_config.position_embedding_size={Npos} is smaller than the {max(height, width) // p}"
                    f" patches a side of MaxText's {height}x{width} images (MaxText's table lookup yields NaN there)")
  token = cfg.get("image_token_id", cfg.get("image_token_index", IMAGE_TOKEN))
  if token != IMAGE_TOKEN:
    problems.append(f"image_token_id={token}: MaxText 0.2.5 hard-codes {IMAGE_TOKEN}")
  parts.refuse_if_any(cfg, "vision tower", problems)
