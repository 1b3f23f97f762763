"""Training objectives: the contrastive loss family, distillation, Matryoshka, quantization-aware terms."""
