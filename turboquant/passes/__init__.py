"""FX passes over captured graphs: find KV-cache writes and the attention that reads them."""

from .eager_attention import rewrite_eager_attention
from .kv_sites import CacheSite, LayerSites, find_kv_sites

__all__ = ["CacheSite", "LayerSites", "find_kv_sites", "rewrite_eager_attention"]
