"""Qwen3 dense: Llama-style decoder with per-head RMSNorm on queries and keys, query scale at run time."""

from converter.families import common
from converter.families.base import Family
from converter.families.runtime import Decoder

FAMILY = Family(
    name="qwen3",
    architectures=("Qwen3ForCausalLM",),
    targets=("qwen3",),
    infer_target=common.single_target("qwen3"),
    runtime=lambda cfg, target: common.runtime(cfg, Decoder(qk_norm="rms")),
    layout=lambda cfg, target, vocab, scan: common.dense_decoder(cfg, common.WeightRules(), vocab, scan, qk_norm=True),
    check=common.no_sliding_window,
)
