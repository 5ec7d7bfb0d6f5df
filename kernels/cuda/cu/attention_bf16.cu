// Program attention_bf16: bf16 K/V storage (f32 accumulation).
ATTN_VARIANTS(unsigned short, bf16)
