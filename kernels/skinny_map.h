/*
 * kernels/skinny_map.h — where the operands of kernels/skinny.cu's mma.m16n8k16 come from: the
 * weight columns and staged x values each lane holds, and which lane writes which output.
 * Host and device (KL_HD), plain C, so tests/test_skinny_map.c runs this map on the CPU with
 * mma.m16n8k16 emulated from its documented fragment layout (kernels/mma.cuh) and compares the
 * products with the straightforward ones.
 *
 * A warp multiplies 32 weight rows (two m16 tiles) by the tokens (n8 tiles).  K goes in units
 * of 32 columns: in a unit, lane 4 g + t holds 8 consecutive columns (from kl_sk_col) of rows g
 * and g + 8 of each m16 tile, and of token g of each n8 tile, as four bf16 pairs ("words" 0..3:
 * word w holds values 2w (low half) and 2w + 1).  A sum over K may take its columns in any
 * order as long as A and B take the same: the unit is two MMAs, MMA h (0, 1) of it takes words
 * 2h and 2h + 1 (kl_sk_word) as the fragment halves that hold logical k 2t, 2t + 1 (a[0], a[1],
 * b0) and 2t + 8, 2t + 9 (a[2], a[3], b1).  So each weight row of a lane is 16-byte loads and
 * each staged token one 16-byte shared-memory read.
 *
 * BF16: unit U is columns 32 U .. 32 U + 31, lane t's 8 are 32 U + 8 t .. (one 16-byte load;
 * the 4 lanes of a row read 64 contiguous bytes).  MXFP4: the 4 units of a granule of 128
 * columns give lane t the 32 codes of one scale block (block t of the granule: one 16-byte
 * load and its scale), unit U % 4 being its codes 8 (U % 4) .. (word U % 4 of the load), so
 * every value a lane multiplies in a granule has one scale; decoded exactly to bf16 with the
 * scale (kernels/mx_bf16.h).  Columns are relative to a granule-aligned origin (a stage).
 */
#ifndef KL_KERNELS_SKINNY_MAP_H
#define KL_KERNELS_SKINNY_MAP_H

#include "common/mxfp4_format.h"

#include <stdint.h>

#define KL_SK_UNIT 32u  /* columns of a unit */
#define KL_SK_GRAN 128u /* columns of a granule: K ranges and stages are whole granules */

/* The first of the 8 consecutive columns lane t (lane % 4) holds in unit U (mx: MXFP4). */
KL_HD static inline uint32_t kl_sk_col(int mx, uint32_t U, uint32_t t)
{
    return mx ? KL_SK_GRAN * (U / 4) + 32u * t + 8u * (U % 4) : KL_SK_UNIT * U + 8u * t;
}

/* The word of a lane's unit that MMA h of the unit takes as fragment half j (0: a[0], a[1],
 * b0; 1: a[2], a[3], b1). */
KL_HD static inline uint32_t kl_sk_word(uint32_t h, uint32_t j)
{
    return 2u * h + j;
}

/* MMA h's A fragment from a lane's unit words of rows g (lo) and g + 8 (hi) of an m16 tile,
 * and its B fragment from the unit words of token g of an n8 tile. */
KL_HD static inline void kl_sk_frags(const uint32_t lo[4], const uint32_t hi[4],
                                     const uint32_t x[4], uint32_t h, uint32_t a[4],
                                     uint32_t b[2])
{
    for (uint32_t j = 0; j < 2; j++) {
        a[2 * j] = lo[kl_sk_word(h, j)];
        a[2 * j + 1] = hi[kl_sk_word(h, j)];
        b[j] = x[kl_sk_word(h, j)];
    }
}

/* Where the staged x of part p (0 hi, 1 lo, 2 lo2), unit U, token tok, lane t lies, in 16-byte
 * pieces (8 bf16): [part][unit][token][lane t], units and toks per stage.  The 8 lanes of a
 * quarter warp (g, g + 1; t 0..3) read 128 contiguous bytes: no bank conflict. */
KL_HD static inline uint32_t kl_sk_stage_at(uint32_t p, uint32_t U, uint32_t tok, uint32_t t,
                                            uint32_t units, uint32_t toks)
{
    return ((p * units + U) * toks + tok) * 4u + t;
}

/* The row (within the m16 tile) and token (within the n8 tile) of accumulator element i of
 * lane 4 g + t. */
KL_HD static inline uint32_t kl_sk_c_row(uint32_t g, uint32_t i)
{
    return g + 8u * (i / 2u);
}

KL_HD static inline uint32_t kl_sk_c_tok(uint32_t t, uint32_t i)
{
    return 2u * t + i % 2u;
}

#endif
