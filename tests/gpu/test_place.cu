/*
 * tests/gpu/test_place.cu — kl_gpu_place_span (kernels/place.h), the kernel that puts a staged
 * span's tensors in place during the load: spans of 1 MiB of random bytes, places of every
 * kind (runs of 1 byte to the whole span; offsets, widths and destinations 16-byte aligned or
 * not, so both the 16-byte and the byte path run; rows with a pitch, as a tensor-parallel cut),
 * a range [first, first + n) of a longer list, and an empty range.  Checked: every destination
 * holds the span's bytes (rows packed), the bytes around each destination untouched.  One JSON
 * line {"test":"place",...}; exit 0 pass, 1 fail, 77 no GPU.
 */
extern "C" {
#include "kernels/place.h"
}
#include "tests/gpu/gpu_testutil.h"

#define SPAN (1u << 20)
#define GUARD 64u

/* A random place inside the span: aligned (every offset and width a multiple of 16) or not;
 * rows > 1 with a pitch for one in four. */
static kl_gpu_place random_place(int aligned, uint64_t *dst_at)
{
    kl_gpu_place p = {};
    p.rows = t_u32() % 4 == 0 ? 1 + t_u32() % 40 : 1;
    p.width = 1 + t_u32() % (p.rows > 1 ? 4096 : SPAN / 2);
    p.pitch = p.rows > 1 ? p.width + t_u32() % 512 : 0;
    if (aligned) {
        p.width = (p.width + 15) / 16 * 16;
        p.pitch = (p.pitch + 15) / 16 * 16;
    }
    const uint64_t extent = (p.rows - 1) * p.pitch + p.width;
    p.off = t_u32() % (SPAN - extent + 1);
    if (aligned)
        p.off = p.off / 16 * 16;
    *dst_at = (*dst_at + GUARD + 15) / 16 * 16 + (aligned ? 0 : t_u32() % 16);
    return p;
}

int main(void)
{
    if (!t_have_gpu("test_place"))
        return 77;
    std::vector<uint8_t> span(SPAN);
    for (auto &b : span)
        b = (uint8_t)t_u32();
    const size_t n_places = 64;
    std::vector<kl_gpu_place> pl(n_places);
    std::vector<uint64_t> at(n_places);
    uint64_t dst_bytes = 0;
    for (size_t i = 0; i < n_places; i++) {
        pl[i] = random_place(i % 2 == 0, &dst_bytes);
        at[i] = dst_bytes;
        dst_bytes += pl[i].width * pl[i].rows;
    }
    dst_bytes += GUARD;
    uint8_t *d_span = t_upload(span), *d_dst = (uint8_t *)t_alloc(dst_bytes);
    T_CHECK(hipMemset(d_dst, 0xA5, dst_bytes));
    for (size_t i = 0; i < n_places; i++)
        pl[i].dst = d_dst + at[i];
    kl_gpu_place *d_pl = t_upload(pl);
    kl_err err;
    kl_err_clear(&err);
    const uint32_t first = 3, n = (uint32_t)n_places - 5;   /* a range of the list */
    t_ok(kl_gpu_place_span(d_span, d_pl, first, n, NULL, &err), &err, "place");
    t_ok(kl_gpu_place_span(d_span, d_pl, 0, 0, NULL, &err), &err, "place nothing");
    std::vector<uint8_t> want(dst_bytes, 0xA5);
    for (size_t i = first; i < first + n; i++)
        for (uint64_t r = 0; r < pl[i].rows; r++)
            memcpy(&want[at[i] + r * pl[i].width], &span[pl[i].off + r * pl[i].pitch],
                   pl[i].width);
    std::vector<uint8_t> got = t_download(d_dst, dst_bytes);
    size_t wrong = 0;
    for (size_t i = 0; i < dst_bytes; i++)
        wrong += got[i] != want[i];
    t_check("bytes placed wrong or written outside their places", (double)wrong, 0);
    hipFree(d_span);
    hipFree(d_dst);
    hipFree(d_pl);
    printf("{\"test\":\"place\",\"ok\":%s,\"places\":%u,\"bytes\":%llu,\"checks\":[%s]}\n",
           t_all_ok ? "true" : "false", n, (unsigned long long)dst_bytes, t_checks.c_str());
    return t_all_ok ? 0 : 1;
}
