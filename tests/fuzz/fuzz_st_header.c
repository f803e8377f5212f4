/*
 * tests/fuzz/fuzz_st_header.c — libFuzzer target for kl_st_parse.
 *
 * Input layout: bytes 0..1 = D, a little-endian int16; the rest = the N header bytes.  The file
 * is taken to be 8 + N + D bytes long (clamped at 0), so the fuzzer can both match a data
 * section exactly (reaching the success path) and make the file too short or too long (the
 * size rules).  On success the table's invariants are checked; a violation traps.
 */
#include "common/err.h"
#include "loader/dtype.h"
#include "loader/safetensors.h"

#include <stdint.h>
#include <string.h>

#define CHECK(cond)                                                                           \
    do {                                                                                      \
        if (!(cond))                                                                          \
            __builtin_trap();                                                                 \
    } while (0)

static void check_tensor(const kl_st_file *f, size_t i, uint64_t expect_begin)
{
    const kl_st_tensor *t = &f->tensors[i];
    CHECK(t->name && t->name[0]);
    CHECK(kl_st_find(f, t->name) == t);
    CHECK(t->dtype >= 0 && t->dtype < KL_DT_COUNT);
    CHECK(t->rank >= 0 && t->rank <= KL_ST_MAX_RANK);
    CHECK(t->begin == expect_begin && t->end >= t->begin);
    CHECK(t->n_bytes == t->end - t->begin);
    CHECK(t->file_off == f->data_off + t->begin);
    uint64_t numel = 1;
    for (int d = 0; d < t->rank; d++)
        numel *= t->shape[d];
    CHECK(numel == t->numel);
    CHECK(numel * kl_dtype_bits(t->dtype) / 8 == t->n_bytes);
}

static void check_file(const kl_st_file *f)
{
    uint64_t end = 0;
    for (size_t i = 0; i < f->n_tensors; i++) {
        check_tensor(f, i, end);
        end = f->tensors[i].end;
    }
    CHECK(f->data_off == 8 + f->header_bytes);
    CHECK(f->data_off + end == f->file_bytes);
    for (size_t i = 0; i < f->n_meta; i++) {
        CHECK(f->meta[i].key && f->meta[i].value);
        CHECK(kl_st_meta_get(f, f->meta[i].key) != NULL);
    }
    CHECK(f->has_metadata || (f->warnings & KL_ST_WARN_NO_METADATA));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    int16_t d = (int16_t)(data[0] | (data[1] << 8));
    const uint8_t *hdr = data + 2;
    uint64_t n = size - 2;
    int64_t file_bytes = (int64_t)(8 + n) + d;
    kl_st_file f;
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_st_parse(&f, "fuzz.safetensors", hdr, n, file_bytes < 0 ? 0 : (uint64_t)file_bytes,
                         &err);
    if (rc == 0) {
        check_file(&f);
    } else {
        /* Failure: an error is recorded, one line, and f is left zeroed. */
        CHECK(rc < 0 && err.code == rc && err.msg[0] && !strchr(err.msg, '\n'));
        CHECK(rc != KL_E_FORMAT || err.rule[0]);
        CHECK(!f.tensors && !f.strings && !f.meta && !f.path && f.n_tensors == 0);
    }
    kl_st_close(&f);
    return 0;
}
