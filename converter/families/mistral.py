"""Mistral: Llama layout, query scale baked in, no permutation; MaxText ignores the sliding window."""

import math

from converter.families import common
from converter.families.base import Family
from converter.families.runtime import Decoder

FAMILY = Family(
    name="mistral",
    architectures=("MistralForCausalLM",),
    targets=("mistral",),
    infer_target=common.single_target("mistral"),
    runtime=lambda cfg, target: common.runtime(cfg, Decoder(query_scale=1.0)),
    layout=lambda cfg, target, vocab, scan: common.dense_decoder(
        cfg, common.WeightRules(query_scale=1 / math.sqrt(cfg.head_dim)), vocab, scan),
    check=common.no_sliding_window,
)
