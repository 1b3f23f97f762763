"""Training: the optimizer, the loop every mode shares, the contrastive mode and its batches."""
