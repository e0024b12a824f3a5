"""The way back to HuggingFace, as converter/planning/ is the way there: the plan of which stored slice becomes which
HF tensor (reverse_plan.py), the streaming safetensors writer (safetensors_output.py), the files a server reads
beside the weights (serving_files.py), the conversion back (to_huggingface.py) and a MaxText LoRA checkpoint as a
PEFT adapter (lora_adapter.py)."""
