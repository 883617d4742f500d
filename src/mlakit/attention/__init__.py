"""The attention calls every backend serves (`functional`: mla_decode, mla_extend, mla_prefill) and
their input checks (`checks`)."""
