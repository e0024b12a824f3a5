"""Vision and audio towers of multimodal checkpoints in MaxText's tree: one module per tower kind, shared by the
families that carry it (the Qwen vision tower serves Qwen3-VL, Qwen3.5 and Qwen3-Omni).

A tower module turns the HF `vision_config` (or `audio_config`) into `Param`s under `params/params/vision_encoder/`
(`audio_encoder/`) and the MaxText keys that describe it; the family file decides whether its checkpoint has a
tower and where its tensors are. Towers never scan, so every layer's params are written out one by one.
"""
