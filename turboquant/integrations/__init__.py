"""Where turboquant meets cache objects owned by other libraries (transformers)."""
