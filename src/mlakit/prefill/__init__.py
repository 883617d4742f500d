"""The MHA-form prefill: its per-step metadata (`metadata`), the passes shared by every backend
(`mha`), and the triton backend's calls prepared per input layout (`prepared`)."""
