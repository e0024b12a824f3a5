"""Llama 4's vision tower, its pixel-shuffle adapter and the projector (MaxText `vision_encoder_block: llama4`).

The patch embedding is a linear layer over torch `Unfold` patches, whose columns are (C, kh, kw) as those of
`lax.conv_general_dilated_patches`, so its kernel is the plain transpose. The class embedding and the position
table (patch rows in (h, w) order, the class row last, as both sides append the class token) are copied, as are
the LayerNorms; q/k/v/o have biases and no rotary permutation (both sides rotate adjacent pairs). The adapter
shuffles (t/p)^2 patches of Dv features into r^2 as many tokens of Dv / r^2 features before its two bias-free
layers. MaxText's mapping is that of its standalone `llama4_ckpt_unscanned.py` (it has no `to_maxtext` route).

transformers builds the vision LayerNorms with torch's default epsilon (1e-5), whatever `norm_eps` says; MaxText
gives them `normalization_layer_epsilon`, the text RMSNorms' epsilon.
"""

from __future__ import annotations

from converter.families.base import Param, Towers
from converter.families.towers import parts
from converter.model_config import ModelConfig

ENCODER = "vision_encoder/Llama4VisionModel_0"
PROJECTOR = "vision_encoder/Llama4MultiModalProjector_0"
TOWER, ADAPTER = "vision_model", "multi_modal_projector"
IMAGE_TOKEN = 200092  # processor_llama4.LLAMA4_PATCH_TOKEN (<|patch|>), hard-coded by MaxText.
HF_LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which transformers' Llama4VisionModel never changes.
OWNS = {r"vision_model\.": "Llama 4's vision tower and pixel-shuffle adapter",
        r"multi_modal_projector\.": "Llama 4's vision projector"}


def towers(cfg: ModelConfig) -> Towers:
  """The tower of a `Llama4ForConditionalGeneration` checkpoint (hub and transformers 5.24 names alike)."""
  need = parts.Section.of(cfg, "vision_config")
  v = need.values
  Dv, Hv, Iv, Nv = need.encoder()
  t, p, C = need("image_size"), need("patch_size"), int(need("num_channels", 3))
  ratio = float(need("pixel_shuffle_ratio"))
  Pin, Pout, Vout = int(need("projector_input_dim")), int(need("projector_output_dim")), int(need("vision_output_dim"))
  E = cfg.hidden_size
  _check(cfg, v, Dv, Hv, Iv, t, p, ratio, Pin, Pout, Vout)
  patches = (t // p) ** 2
  params: list[Param] = [
      *parts.dense(f"{ENCODER}/Llama4UnfoldConvolution_0/vit_unfold_linear", f"{TOWER}.patch_embedding.linear",
                   C * p * p, Dv, bias=False),
      Param(f"{ENCODER}/class_embedding", f"{TOWER}.class_embedding", (Dv,)),
      Param(f"{ENCODER}/positional_embedding_vlm", f"{TOWER}.positional_embedding_vlm", (patches + 1, Dv)),
      *parts.norm(f"{ENCODER}/layernorm_pre", f"{TOWER}.layernorm_pre", Dv),
      *parts.norm(f"{ENCODER}/layernorm_post", f"{TOWER}.layernorm_post", Dv),
  ]
  for i in range(Nv):
    mt, hf = f"{ENCODER}/Llama4VisionEncoder_0/layers_{i}", f"{TOWER}.model.layers.{i}"
    params += parts.norm(f"{mt}/input_layer_norm", f"{hf}.input_layernorm", Dv)
    params += parts.attention(f"{mt}/self_attention_vision", f"{hf}.self_attn", Dv, Hv,
                              ("q_proj", "k_proj", "v_proj", "o_proj"))
    params += parts.norm(f"{mt}/post_attention_layer_norm", f"{hf}.post_attention_layernorm", Dv)
    params += parts.dense(f"{mt}/Llama4VisionMLP_0/vit_encoder_layer_mlp_fc1", f"{hf}.mlp.fc1", Dv, Iv)
    params += parts.dense(f"{mt}/Llama4VisionMLP_0/vit_encoder_layer_mlp_fc2", f"{hf}.mlp.fc2", Iv, Dv)
  shuffle = f"{ENCODER}/Llama4VisionPixelShuffleMLP_0/pixel_shuffle_mlp"
  params += parts.dense(f"{shuffle}/vit_pixel_shuffle_mlp_fc1", f"{TOWER}.vision_adapter.mlp.fc1", Iv, Pin, bias=False)
  params += parts.dense(f"{shuffle}/vit_pixel_shuffle_mlp_fc2", f"{TOWER}.vision_adapter.mlp.fc2", Pout, Pout,
                        bias=False)
  params += parts.dense(f"{PROJECTOR}/vit_multi_modal_projector", f"{ADAPTER}.linear_1", Vout, E, bias=False)
  overrides = (("hidden_size_for_vit", Dv), ("num_attention_heads_for_vit", Hv), ("num_hidden_layers_for_vit", Nv),
               ("intermediate_size_for_vit", Iv), ("image_size_for_vit", t), ("tile_size_for_vit", t),
               ("patch_size_for_vit", p), ("conv_stride_for_vit", p), ("num_channels_for_vit", C),
               ("pixel_shuffle_ratio_for_vit", ratio), ("projector_input_dim_for_vit", Pin),
               ("projector_output_dim_for_vit", Pout), ("vision_output_dim_for_vit", Vout),
               ("rope_theta_for_vit", _rope_theta(v)))
  return Towers(tuple(params), overrides, dict(OWNS))


def _rope_theta(v: dict) -> float:
  """transformers 5's `rope_parameters.rope_theta`, or the hub's (transformers 4) `rope_theta`; else the default."""
  return float((v.get("rope_parameters") or {}).get("rope_theta", v.get("rope_theta", 10000.0)))


def _check(cfg: ModelConfig, v: dict, Dv: int, Hv: int, Iv: int, t: int | list[int], p: int | list[int],
           ratio: float, Pin: int, Pout: int, Vout: int) -> None:
  """What MaxText's Llama 4 tower fixes rather than reads (and what transformers' own tower requires): refused."""
  problems = []
  if not isinstance(t, int) or not isinstance(p, int):
    problems.append(f"vision_config image_size={t}, patch_size={p}: MaxText's tower takes square tiles and patches"
                    " (one integer each)")
  elif t % p:
    problems.append(f"vision_config.image_size={t} (the tile) is not a multiple of patch_size={p}")
  elif (t // p * ratio) % 1:
    problems.append(f"vision_config: {t // p} patches a side do not shuffle by pixel_shuffle_ratio={ratio:g} into"
                    " whole tokens")
  rope_type = (v.get("rope_parameters") or {}).get("rope_type", "default")
  if rope_type != "default":
    problems.append(f"vision_config.rope_parameters.rope_type={rope_type!r}: MaxText's tower has only the unscaled"
                    " 2-D rope")
  if Dv % Hv or (Dv // Hv) % 4:
    problems.append(f"vision_config hidden_size={Dv}, num_attention_heads={Hv}: the 2-D rope needs a head size"
                    " that is a multiple of 4")
  if Iv != Dv / ratio**2:
    problems.append(f"vision_config.intermediate_size={Iv}: the pixel-shuffle MLP reads hidden_size /"
                    f" pixel_shuffle_ratio^2 = {Dv / ratio**2:g} features, which MaxText sizes by intermediate_size")
  if Pin != Pout:
    problems.append(f"vision_config projector_input_dim={Pin} != projector_output_dim={Pout}: the adapter's second"
                    " layer is (projector_output_dim, projector_output_dim) in transformers and reads"
                    " projector_input_dim in MaxText")
  if Vout != Pout:
    problems.append(f"vision_config vision_output_dim={Vout} != projector_output_dim={Pout}: the projector reads"
                    " what the adapter writes")
  if abs(cfg.rms_norm_eps - HF_LAYER_NORM_EPS) > 1e-12:
    problems.append(f"text rms_norm_eps={cfg.rms_norm_eps:g}: transformers' vision LayerNorms use"
                    f" {HF_LAYER_NORM_EPS:g} and MaxText gives them normalization_layer_epsilon, the text one")
  token = cfg.get("image_token_index", cfg.get("image_token_id", IMAGE_TOKEN))
  if token != IMAGE_TOKEN:
    problems.append(f"image_token_index={token}: MaxText 0.2.5 hard-codes {IMAGE_TOKEN}")
  parts.refuse_if_any(cfg, "vision tower", problems)
