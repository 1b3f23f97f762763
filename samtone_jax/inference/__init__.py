"""A trained model as an encoder of text: batched / packed encoding and `samtone_jax.load`."""
