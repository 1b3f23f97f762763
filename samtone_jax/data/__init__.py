"""Official data formats -> retrieval collections, tokenisation, the tf.data pipeline, packing."""
