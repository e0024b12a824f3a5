"""The Qwen3-Omni thinker's audio encoder and its projector (MaxText `use_audio: true`, qwen3-omni-30b-a3b only).

MaxText's `Qwen3OmniAudioEncoder` takes the log-mel features (batch, mel, frames), cuts them into chunks of
2 * n_window frames and runs each chunk alone: three stride-2 3x3 convs over (mel, time) with GELU, `conv_out` on the
(channel, mel) features of each time step, sinusoidal positions (computed, never stored: both sides derive them from
d_model), then pre-norm Whisper-style layers (LayerNorm, attention with biases, LayerNorm, fc1/GELU/fc2), a
final LayerNorm, and the projector proj1/GELU/proj2 into the decoder's width. transformers computes the same.

HF convs are (O, I, kh, kw) over (mel, time); MaxText's input is channels-last (chunks, mel, time, 1), so the HWIO
kernel is the HF one transposed (2, 3, 1, 0), mel still first. `conv_out`'s input features are ordered (channel, mel)
on both sides, so it is a plain transpose. Every LayerNorm of the tower has eps 1e-5 on both sides, hard-coded
(`nn.LayerNorm` defaults in transformers, `epsilon=1e-5` in MaxText): no config key reaches either.

What MaxText does differently and no checkpoint changes (maxtext-contract-multimodal.md, sections 2 and 8): tanh
GELU where transformers uses erf GELU (the interop check's `omni_audio_exact_gelu` alignment switches it), and
attention within each chunk where transformers attends across the chunks of one n_window_infer window (identical
while the audio is one chunk, or n_window_infer is one chunk: `window_warnings`).
"""

from __future__ import annotations

from typing import Any, Mapping

from converter import ops
from converter.errors import ConversionError
from converter.families.base import Param, Towers
from converter.families.towers import parts
from converter.model_config import ModelConfig

ENCODER = "audio_encoder/Qwen3OmniAudioEncoder_0"
PROJECTOR = "audio_encoder/Qwen3OmniAudioProjector_0"
CONVS = 3  # transformers' conv2d1..3 and MaxText's num_conv_layers_for_audio: both fixed at three.
# MaxText's processor (`processor_qwen3_omni._get_feat_extract_output_lengths`, used by its get_rope_index and token
# expansion) hard-codes chunks of 100 frames whatever n_window_for_audio says.
PROCESSOR_CHUNK_FRAMES = 100
GELUS = ("gelu", "gelu_pytorch_tanh", "gelu_new", "gelu_fast")  # MaxText applies jax.nn.gelu (tanh) for all.


def _dims(cfg: ModelConfig) -> dict[str, int]:
  """audio_config's dimensions, as MaxText's `*_for_audio` keys, checked (ConversionError naming the key)."""
  a = parts.sub_config(cfg, "audio_config")

  def need(key: str, *aliases: str) -> int:
    value = next((a[k] for k in (key, *aliases) if a.get(k) is not None), None)
    value = parts.require(cfg, a, "audio_config", key, value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
      raise ConversionError(f"{cfg.path}: audio_config.{key}={value!r}: MaxText's audio encoder takes one positive"
                            " integer here")
    return value

  dims = {
      "d_model_for_audio": need("d_model", "hidden_size"),
      "encoder_layers_for_audio": need("encoder_layers", "num_hidden_layers"),
      "encoder_attention_heads_for_audio": need("encoder_attention_heads", "num_attention_heads"),
      "encoder_ffn_dim_for_audio": need("encoder_ffn_dim", "intermediate_size"),
      "num_mel_bins_for_audio": need("num_mel_bins"),
      "downsample_hidden_size_for_audio": need("downsample_hidden_size"),
      "output_dim_for_audio": need("output_dim"),
      "n_window_for_audio": need("n_window"),
      "n_window_infer_for_audio": need("n_window_infer"),
      "max_source_positions_for_audio": need("max_source_positions"),
  }
  _check(cfg, a, dims)
  return dims


def conv_out_features(channels: int, mel_bins: int) -> int:
  """`conv_out`'s input width: the channels times the mel bins left after three stride-2 convs (padding 1)."""
  for _ in range(CONVS):
    mel_bins = (mel_bins + 1) // 2
  return channels * mel_bins


def towers(cfg: ModelConfig, *, prefix: str) -> Towers:
  """The audio encoder and projector read from `prefix` (the hub's "thinker.audio_tower")."""
  d = _dims(cfg)
  Da, Ha, Fa = d["d_model_for_audio"], d["encoder_attention_heads_for_audio"], d["encoder_ffn_dim_for_audio"]
  Ca, out = d["downsample_hidden_size_for_audio"], d["output_dim_for_audio"]
  hwio = (ops.Permute((2, 3, 1, 0)),)  # (O, I, mel, time) -> (mel, time, I, O).
  params: list[Param] = []
  for k in range(1, CONVS + 1):
    channels_in = 1 if k == 1 else Ca
    params += [Param(f"{ENCODER}/conv2d{k}/kernel", f"{prefix}.conv2d{k}.weight", (Ca, channels_in, 3, 3), hwio),
               Param(f"{ENCODER}/conv2d{k}/bias", f"{prefix}.conv2d{k}.bias", (Ca,))]
  params += parts.dense(f"{ENCODER}/conv_out", f"{prefix}.conv_out",
                        conv_out_features(Ca, d["num_mel_bins_for_audio"]), Da, bias=False)
  for i in range(d["encoder_layers_for_audio"]):
    mt, hf = f"{ENCODER}/layers_{i}", f"{prefix}.layers.{i}"
    params += parts.norm(f"{mt}/input_layer_norm", f"{hf}.self_attn_layer_norm", Da)
    params += parts.attention(f"{mt}/self_attention_audio", f"{hf}.self_attn", Da, Ha,
                              ("q_proj", "k_proj", "v_proj", "out_proj"))
    params += parts.norm(f"{mt}/post_attention_layer_norm", f"{hf}.final_layer_norm", Da)
    params += parts.dense(f"{mt}/AudioMLP/wi", f"{hf}.fc1", Da, Fa)
    params += parts.dense(f"{mt}/AudioMLP/wo", f"{hf}.fc2", Fa, Da)
  params += parts.norm(f"{ENCODER}/layernorm_post", f"{prefix}.ln_post", Da)
  params += parts.dense(f"{PROJECTOR}/proj1", f"{prefix}.proj1", Da, Da)
  params += parts.dense(f"{PROJECTOR}/proj2", f"{prefix}.proj2", Da, out)
  overrides = (("use_audio", True),) + tuple(d.items())
  return Towers(tuple(params), overrides, {rf"{_escape(prefix)}\.": "the audio encoder and its projector"})


def _escape(prefix: str) -> str:
  return prefix.replace(".", r"\.")


def window_warnings(cfg: ModelConfig) -> list[str]:
  """What MaxText computes around a correct conversion differently from transformers (the tower itself converts)."""
  a = parts.sub_config(cfg, "audio_config")
  n_window, n_window_infer = int(a.get("n_window", 50)), int(a.get("n_window_infer", 800))
  found = []
  if 2 * n_window != PROCESSOR_CHUNK_FRAMES:
    found.append(f"{cfg.path}: audio_config.n_window={n_window}: MaxText's encoder cuts audio into chunks of"
                 f" {2 * n_window} frames, but its preprocessing (processor_qwen3_omni: audio token counts and"
                 f" positions) hard-codes chunks of {PROCESSOR_CHUNK_FRAMES}: compute the audio token counts and"
                 " positions yourself")
  if n_window_infer != 2 * n_window:
    found.append(f"{cfg.path}: audio_config.n_window_infer={n_window_infer}: transformers attends across the"
                 f" {2 * n_window}-frame chunks of each {n_window_infer}-frame window, MaxText within each chunk"
                 f" only: audio longer than {2 * n_window} frames encodes differently")
  return found


def _check(cfg: ModelConfig, a: Mapping[str, Any], d: dict[str, int]) -> None:
  """What MaxText's audio encoder fixes rather than reads: refused where it would compute something else."""
  problems = []
  Da, Ha = d["d_model_for_audio"], d["encoder_attention_heads_for_audio"]
  if Da % Ha:
    problems.append(f"audio_config.d_model={Da} is not a multiple of encoder_attention_heads={Ha}")
  if Da % 2:
    problems.append(f"audio_config.d_model={Da} is odd: the sinusoidal positions need an even width")
  if d["output_dim_for_audio"] != cfg.hidden_size:
    problems.append(f"audio_config.output_dim={d['output_dim_for_audio']} differs from the text hidden_size="
                    f"{cfg.hidden_size}: the projector's output replaces the audio placeholders' embeddings")
  act = a.get("activation_function", "gelu")
  if act not in GELUS:
    problems.append(f"audio_config.activation_function={act!r}: MaxText's audio convs, MLPs and projector apply"
                    " GELU (tanh form)")
  parts.refuse_if_any(cfg, "audio encoder", problems)
