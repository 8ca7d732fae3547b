"""FX passes over captured graphs: find KV-cache writes and the attention that reads them."""

from .kv_sites import CacheSite, LayerSites, find_kv_sites

__all__ = ["CacheSite", "LayerSites", "find_kv_sites"]
