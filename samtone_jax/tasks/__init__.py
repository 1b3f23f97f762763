"""Tasks: the catalogue of named retrieval tasks (catalogue.py), their prompts (prompts.py), their
seqio registration (registration.py) and task-homogeneous mixture batches (task_batches.py)."""
