"""FX passes over captured graphs: find KV-cache writes and the attention that reads them; fold
copies of constants in Inductor's post-grad graph."""

from .constant_copies import FoldConstantCopies
from .eager_attention import rewrite_eager_attention
from .kv_sites import CacheSite, LayerSites, find_kv_sites

__all__ = ["FoldConstantCopies", "CacheSite", "LayerSites", "find_kv_sites", "rewrite_eager_attention"]
