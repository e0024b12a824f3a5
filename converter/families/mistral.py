"""Mistral: Llama layout, query scale baked in, no permutation; MaxText ignores the sliding window."""

from converter.families import common
from converter.families.base import DecoderSemantics, Family

FAMILY = Family(
    name="mistral",
    architectures=("MistralForCausalLM",),
    targets=("mistral",),
    infer_target=common.single_target("mistral"),
    semantics=lambda cfg, target: DecoderSemantics(query_scale_in_kernel=True),
    layout=common.dense_decoder,
    check=common.no_sliding_window,
)
