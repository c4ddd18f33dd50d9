"""LoRA adapters over the base model: PEFT folders read and checked, resident slots, the mixed-batch delta."""
