"""samtone_jax: dual-encoder retrieval training in JAX/Flax (T5.1.1 towers, SamToNe loss)."""

from setuptools import find_packages, setup

setup(
    name="samtone_jax",
    version="0.1.0",
    description="Train T5.1.1 dual-encoder retrievers with same-tower negatives (SamToNe) in JAX/Flax.",
    python_requires=">=3.11",
    packages=find_packages(include=["samtone_jax", "samtone_jax.*"]),
    # The native CPU top-k kernel's source, compiled on first use (samtone_jax/evaluation/native_top_k.py),
    # and the gin files every mode resolves `--gin_file=models/...` against (gin_config.GIN_CONFIGS_DIR).
    package_data={"samtone_jax.evaluation": ["native/*.cc"], "samtone_jax": ["gin_configs/*/*.gin"]},
    install_requires=[
        "jax>=0.10,<0.11",
        "jaxlib>=0.10,<0.11",
        "flax>=0.12",
        "optax>=0.2.8",
        "orbax-checkpoint>=0.12",
        "gin-config>=0.5",
        "seqio>=0.0.20",
        "tensorflow>=2.20,<2.21",
        "tensorflow-text>=2.20,<2.21",
        "sentencepiece>=0.2",
        "numpy>=2",
        "tensorstore>=0.1.86",
        "msgpack",
        "safetensors",
        "ir-measures>=0.4.3",
        "matplotlib",
        "scikit-learn",
        "tqdm",
        "bm25s",
        "etils[epath]",
        "gcsfs>=2026.10",  # gs:// through the path layer (samtone_jax/core/paths.py)
        "google-cloud-storage",  # the MODEL_DIR lock's generation preconditions (run_lock.py)
        "google-crc32c",  # TensorBoard event records (event_writer.py)
        "tensorboard",
    ],
    extras_require={
        "test": ["pytest", "ruff", "torch==2.13.0", "transformers==5.24.0", "sentence-transformers==6.2.0"],
        "export": ["torch==2.13.0", "transformers==5.24.0", "sentence-transformers==6.2.0"],
        "faiss": ["faiss-cpu>=1.15"],
    },
    entry_points={"console_scripts": ["samtone=samtone_jax.cli.main:main"]},
)
