"""Qwen2 / Qwen2.5: Llama layout with q/k/v biases, query scale at run time."""

from converter.families import common
from converter.families.base import DecoderSemantics, Family

FAMILY = Family(
    name="qwen2",
    architectures=("Qwen2ForCausalLM",),
    targets=("qwen2.5", "qwen2"),
    infer_target=common.single_target("qwen2.5"),
    semantics=lambda cfg, target: DecoderSemantics(attention_bias=True),
    layout=common.dense_decoder,
    check=common.no_sliding_window,
    extra_overrides=lambda cfg: {"attention_bias": True},
)
