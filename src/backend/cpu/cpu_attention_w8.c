/*
 * cpu_attention_w8.c — the attention kernels with 8-float vectors, for
 * processors without AVX-512 (ymm on AVX2: 16 registers, so the passes
 * are half a tile and one column vector a block; the 16-wide code spilled
 * there), in an AVX2 clone and the baseline.
 */
#define ATT_V 8
#define ATT_TV 2
#define ATT_RV 1
#define ATT_AV 2
#define ATT_NAME(x) x##_w8
#if defined(GP_ISA_CLONES) && GP_ISA_CLONES >= 3
#define ATT_TARGET __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define ATT_TARGET
#endif
#include "backend/cpu/cpu_attention_body.h"
