/* The model a one-call decode forward runs (decode_forward.c in fp32 and INT8,
 * decode_forward_bf16.c in bf16), handed over once by engine/models/decode.py (its ctypes twin,
 * field for field). The element type of the pointers is the forward's: fp32 (projections int8 rows
 * with fp32 scales when `int8`), or bf16 with the projections in bf16_linear.c's panels. */
#ifndef DECODE_MODEL_H
#define DECODE_MODEL_H

typedef struct {
    int layers, hidden, heads, kv_heads, head_dim, intermediate;
    float eps, attn_scale;
    int int8;          /* projections: 2 int8_vnni.c panels, 1 int8 rows (int8_linear.c), with fp32
                        * scales; 0 fp32 rows (or bf16 panels) */
    long cache_slots;  /* S of each layer's cache [2, KVH, S, D] */
    int block_size;
    const void *cos, *sin;  /* [P, D] RoPE tables, sin with its first half negated */
    const void *final_norm;
    const void *const *input_norm, *const *post_norm;            /* [layers] each */
    const void *const *qkv, *const *o, *const *gate_up, *const *down;
    const float *const *qkv_scale, *const *o_scale, *const *gate_up_scale, *const *down_scale;
    const void *const *qkv_bias, *const *o_bias;                 /* entries may be NULL */
    void *const *kv;                                             /* [layers] caches */
    int amx_min_rows, amx_max_rows; /* bf16: batches of this many rows run bf16_amx.c (0, 0: none) */
    void (*between_layers)(int layer); /* called after each layer when set (engine/interrupts.py) */
} DecodeModel;

#endif
