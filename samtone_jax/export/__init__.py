"""`samtone export`: folder.py writes and checks an export folder; hf_weights.py, tokenizer.py,
sentence_transformers.py and model_card.py are its parts."""
