"""Configuration: the serving choices (`serving.py`) and the one reader of a Hugging Face
`config.json` (`hf.py`) that `mlakit check` and the model loader share."""

from mlakit.config.serving import AUTO, KV_CACHE_DTYPES, ServingConfig

__all__ = ["AUTO", "KV_CACHE_DTYPES", "ServingConfig"]
