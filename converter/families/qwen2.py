"""Qwen2 / Qwen2.5: Llama layout with q/k/v biases, query scale at run time."""

from converter.families import common
from converter.families.base import Family
from converter.families.runtime import Decoder

FAMILY = Family(
    name="qwen2",
    architectures=("Qwen2ForCausalLM",),
    targets=("qwen2.5", "qwen2"),
    infer_target=common.single_target("qwen2.5"),
    runtime=lambda cfg, target: common.runtime(cfg, Decoder(), attention_bias=True),
    layout=lambda cfg, target, vocab, scan: common.dense_decoder(cfg, common.WeightRules(), vocab, scan, bias=True),
    check=common.no_sliding_window,
)
