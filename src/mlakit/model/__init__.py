"""Model-level MLA: rope, the attention layer, the DeepSeek-architecture runner."""
