"""Qwen3-Omni (`Qwen3OmniMoeForConditionalGeneration`) -> MaxText `qwen3-omni-30b-a3b`: the thinker, with its vision
tower (converter/families/towers/qwen_vision.py, Omni's merger names) and audio encoder
(converter/families/towers/qwen_omni_audio.py).

The thinker's text decoder is Qwen3-MoE (converter/families/qwen3_moe.py: q/k norms, every layer a softmax top-k
mixture of experts, stored one expert at a time) under `thinker.model.`, with its own `thinker.lm_head`, and
interleaved MRoPE (the (t, h, w) sections of config's `mrope_section`, rotate-half in both). config.json nests the
decoder's dims in `thinker_config.text_config` (ModelConfig merges them) and the towers' in
`thinker_config.{vision,audio}_config`. The speech-output modules (`talker.*`, `code2wav.*`) have no MaxText model and
are skipped. transformers 5.24's `save_pretrained` writes the hub's names and per-expert tensors (its in-memory state
dict differs: `thinker.model.language_model.*`, fused experts; not read).

MaxText hard-codes the placeholder ids by model name (image 151655 after vision start 151652, audio 151675 between
audio start 151669 and end 151670): a checkpoint whose config names others is refused. The deepstack mergers feed
single decoder layers, so MaxText refuses scan_layers=true with them (configs/types.py; the model yml sets false;
converter/planning/plan.py refuses it first): with its towers the checkpoint converts unscanned only. The yml
turns the towers on (`use_multimodal`, `use_audio`, three deepstack indexes), so a text-only conversion turns them
off, and then scans as Qwen3-MoE does (MRoPE with equal positions in its three sections is plain rope, as
transformers computes for text alone).
"""

from converter.errors import ConversionError
from converter.families import common, qwen3_moe, qwen3_vl
from converter.families.base import ROTARY_CACHES, Family, Layout, Towers
from converter.families.runtime import Runtime
from converter.families.towers import qwen_omni_audio, qwen_vision
from converter.model_config import ModelConfig

ARCHITECTURE = "Qwen3OmniMoeForConditionalGeneration"
TARGET = "qwen3-omni-30b-a3b"
TEXT = "thinker.model."
LM_HEAD = "thinker.lm_head."
VISION = "thinker.visual"
AUDIO = "thinker.audio_tower"
# config key, MaxText 0.2.5's hard-coded id (processor_qwen3_omni.QWEN_SPECIAL_TOKEN_CONFIGS), transformers' default
# where its config class declares the key (None: the key is read only when present).
AUDIO_TOKENS = (("audio_token_id", 151675, 151646), ("audio_start_token_id", 151669, 151647),
                ("audio_end_token_id", 151670, None))


def _layout(cfg: ModelConfig, target: str, target_vocab: int, scan_layers: bool) -> Layout:
  return qwen3_moe.FAMILY.layout(cfg, target, target_vocab, scan_layers).under(TEXT).under(LM_HEAD, old="lm_head.")


def _runtime(cfg: ModelConfig, target: str) -> Runtime:
  """The text decoder's keys, towers off (the model yml turns them on); the towers' keys replace
  `deepstack_visual_indexes_for_vit` when they are converted."""
  return qwen3_moe.FAMILY.runtime(cfg, target).replace_config(
      use_mrope=True, mrope_section=qwen3_vl.mrope_section(cfg), use_multimodal=False, use_audio=False,
      towers=(("deepstack_visual_indexes_for_vit", []),))


def _towers(cfg: ModelConfig, target: str) -> Towers:
  _check_audio_tokens(cfg)
  vision = qwen_vision.towers(cfg, prefix=VISION, kind=qwen_vision.QWEN3_OMNI)
  audio = qwen_omni_audio.towers(cfg, prefix=AUDIO)
  # Positions per second of audio and video time in MaxText's multimodal rope (its preprocessing reads it).
  seconds = (("position_id_per_seconds", int(cfg.get("position_id_per_seconds", 25))),)
  return Towers(vision.params + audio.params, vision.overrides + audio.overrides + seconds,
                {**vision.owns, **audio.owns})


def _check_audio_tokens(cfg: ModelConfig) -> None:
  wrong = [f"thinker_config.{key}={cfg.get(key, default)}" + (" (transformers' default)" if key not in cfg.raw else "")
           + f", MaxText hard-codes {expected}"
           for key, expected, default in AUDIO_TOKENS if cfg.get(key, default) not in (None, expected)]
  if wrong:
    raise ConversionError(f"{cfg.path}: MaxText 0.2.5 places audio by {TARGET}'s token ids, not config.json's: "
                          + "; ".join(wrong) + " (--text_only converts the text decoder alone)")


def _check(cfg: ModelConfig, target: str) -> list[str]:
  if target != TARGET:
    raise ConversionError(f"--target_model={target}: MaxText 0.2.5 has one Qwen3-Omni model, {TARGET} (its towers,"
                          " placeholder ids and multimodal merge are chosen by that name)")
  rope = common.rope_parameters(cfg)
  if common.rope_kind(rope) != "default":
    raise ConversionError(f"{cfg.path}: text_config rope_parameters={rope}: MaxText's multimodal rotary (use_mrope)"
                          " applies no rope scaling")
  return (common.no_sliding_window(cfg, target) + common.norm_topk_prob_ignored(cfg, target)
          + qwen_omni_audio.window_warnings(cfg))


def _ignored(cfg: ModelConfig) -> dict[str, str]:
  return {**ROTARY_CACHES, r"talker\.": "the talker (speech output), which MaxText's model does not have",
          r"code2wav\.": "the code-to-waveform decoder (speech output), which MaxText's model does not have"}


FAMILY = Family(
    name="qwen3_omni",
    architectures=(ARCHITECTURE,),
    targets=("qwen3-omni",),
    infer_target=common.single_target(TARGET),
    runtime=_runtime,
    layout=_layout,
    check=_check,
    ignored_tensors=_ignored,
    towers=_towers,
)
