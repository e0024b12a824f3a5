"""The plan: every output leaf and the loader that computes it region by region, from a HuggingFace source
(plan.py, with loaders.py, loader.py, native_fp8.py) or a MaxText checkpoint laid out again (relayout.py); and a
plan's leaves as the handlers' lazy tensors (lazy_leaves.py)."""
