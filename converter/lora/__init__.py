"""MaxText LoRA checkpoints: their factors planned from the family layouts and merged (lora_export.py; written back
as a PEFT adapter by converter/reverse/lora_adapter.py), written from PEFT adapters (lora_checkpoint.py). A PEFT
adapter merged while converting is a source: converter/sources/lora.py."""
