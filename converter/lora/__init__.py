"""MaxText LoRA checkpoints: exported as PEFT adapters and merged (lora_export.py), written from PEFT adapters
(lora_checkpoint.py). A PEFT adapter merged while converting is a source: converter/sources/lora.py."""
