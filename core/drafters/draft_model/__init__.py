"""draft_model: a small independent LM with the target's tokenizer."""
