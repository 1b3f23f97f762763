"""Foundation: errors users read, the one path layer (local and gs://), the names of the folders we
write, complete-or-absent files, the MODEL_DIR lease, process set-up and log sinks."""
