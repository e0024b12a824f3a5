"""Qwen3 dense: Llama-style decoder with per-head RMSNorm on queries and keys, query scale at run time."""

from converter.families import common
from converter.families.base import DecoderSemantics, Family

FAMILY = Family(
    name="qwen3",
    architectures=("Qwen3ForCausalLM",),
    targets=("qwen3",),
    infer_target=common.single_target("qwen3"),
    semantics=lambda cfg, target: DecoderSemantics(qk_norm=True),
    layout=common.dense_decoder,
    check=common.no_sliding_window,
)
