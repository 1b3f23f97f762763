"""Compressed embeddings: int8 / binary codes and the int8 ranges a model is served with."""
