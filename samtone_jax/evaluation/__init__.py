"""Retrieval evaluation: exact top-k search and ranking metrics (ir-measures)."""
