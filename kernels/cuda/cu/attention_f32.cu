// Program attention_f32: f32 K/V storage.
ATTN_VARIANTS(float, f32)
