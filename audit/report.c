/*
 * audit/report.c — an audit report: collecting findings, then text and JSON rendering (see
 * report.h).
 */
#include "audit/report.h"

#include "common/fmt.h"
#include "common/grow.h"
#include "common/jsonout.h"
#include "common/mem.h"

#include <inttypes.h>
#include <stdarg.h>
#include <string.h>

/* ---- building ------------------------------------------------------------------------------ */

int kl_audit_collect(void *report, const kl_finding *f)
{
    kl_audit_report *r = report;
    if (kl_grow(&r->findings, &r->cap_findings, r->n_findings + 1, sizeof *r->findings))
        return KL_E_NOMEM;
    r->findings[r->n_findings++] = *f;
    if (f->severity == KL_SEV_ERROR)
        r->n_errors++;
    else if (f->severity == KL_SEV_WARN)
        r->n_warnings++;
    return 0;
}

int kl_audit_add(kl_audit_report *r, kl_severity sev, const char *rule, const char *file,
                 const char *tensor, uint64_t offset, const char *fmt, ...)
{
    kl_finding f;
    va_list ap;
    va_start(ap, fmt);
    kl_finding_vset(&f, sev, rule, file, tensor, offset, fmt, ap);
    va_end(ap);
    return kl_audit_collect(r, &f);
}

int kl_audit_add_err(kl_audit_report *r, const kl_err *e, const char *default_rule,
                     const char *default_file)
{
    kl_finding f;
    kl_finding_from_err(&f, KL_SEV_ERROR, e, default_rule, default_file);
    return kl_audit_collect(r, &f);
}

void kl_audit_report_free(kl_audit_report *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n_hashes; i++)
        kl_free(r->hashes[i].file);
    kl_free(r->hashes);
    kl_free(r->findings);
    kl_free(r->regions);
    kl_free(r->dir);
    memset(r, 0, sizeof *r);
}

int kl_audit_has_problems(const kl_audit_report *r)
{
    return r->n_errors > 0;
}

/* ---- text ---------------------------------------------------------------------------------- */

static void print_finding(const kl_finding *f, FILE *out)
{
    /* Names come from files: escape control bytes so none can forge lines or reach the
     * terminal (JSON output escapes them by itself). */
    char file[1100], tensor[800], msg[1300];
    kl_escape_controls(file, sizeof file, f->file);
    kl_escape_controls(tensor, sizeof tensor, f->tensor);
    kl_escape_controls(msg, sizeof msg, f->message);
    fprintf(out, "  %-7s ", kl_severity_name(f->severity));
    if (file[0])
        fprintf(out, "%s: ", file);
    if (tensor[0])
        fprintf(out, "tensor %s", tensor);
    if (f->offset != KL_NO_OFFSET)
        fprintf(out, "%s@ %" PRIu64, tensor[0] ? " " : "", f->offset);
    if (tensor[0] || f->offset != KL_NO_OFFSET)
        fprintf(out, ": ");
    fprintf(out, "[%s] %s\n", f->rule, msg);
}

static void print_regions(const kl_audit_report *r, FILE *out, int verbose)
{
    size_t contiguous = 0, absent = 0;
    for (size_t i = 0; i < r->n_regions; i++) {
        contiguous += r->regions[i].contiguous;
        absent += r->regions[i].n_tensors == 0;
    }
    size_t spread = r->n_regions - contiguous - absent;
    fprintf(out, "  experts      %zu MoE layers: %zu as one contiguous region each, %zu spread "
                 "over several extents%s", r->n_regions, contiguous, spread,
            absent ? "" : "\n");
    if (absent)
        fprintf(out, ", %zu without expert tensors\n", absent);
    if (!verbose)
        return;
    for (size_t i = 0; i < r->n_regions; i++) {
        const kl_expert_region *g = &r->regions[i];
        char size[32];
        fprintf(out, "    layer %-3u %5u tensors %11s  ", g->layer, g->n_tensors,
                kl_fmt_bytes(size, sizeof size, g->n_bytes));
        if (g->contiguous)
            fprintf(out, "one extent: shard %u @ %" PRIu64 "\n", g->shard, g->file_off);
        else if (!g->n_tensors)
            fprintf(out, "no expert tensors found\n");
        else
            fprintf(out, "spread over %u shard(s)\n", g->n_shards);
    }
}

/* The float format the plan assumed for an element size. */
static const char *elem_name(size_t bytes)
{
    switch (bytes) {
    case 1: return "fp8";
    case 2: return "bf16";
    case 4: return "fp32";
    default: return "?";
    }
}

static void print_memplan(const kl_memplan *m, FILE *out)
{
    char w[32], mla[32], kda[32], tot[32];
    fprintf(out, "  memory/GPU   TP %u%s, context %" PRIu64 ": weights %s + MLA cache %s (%s) + "
                 "KDA state %s (%s) = %s per GPU (one sequence)\n",
            m->tp, m->expert_parallel ? " (expert parallel)" : "", m->context,
            kl_fmt_bytes(w, sizeof w, m->weights_bytes),
            kl_fmt_bytes(mla, sizeof mla, m->mla_cache_bytes), elem_name(m->cache_elem_bytes),
            kl_fmt_bytes(kda, sizeof kda, m->kda_state_bytes), elem_name(m->state_elem_bytes),
            kl_fmt_bytes(tot, sizeof tot, m->total_bytes));
    char mat[32], vec[32], v32[32], arena[32], pad[32];
    fprintf(out, "               weights: matrices %s + vectors %s (the engines keep the vectors "
                 "as fp32: %s)\n", kl_fmt_bytes(mat, sizeof mat, m->matrix_bytes),
            kl_fmt_bytes(vec, sizeof vec, m->vector_bytes),
            kl_fmt_bytes(v32, sizeof v32, m->vector_f32_bytes));
    if (m->has_gpu_arena)
        fprintf(out, "               GPU engine weight arena %s%s: matrices + fp32 vectors + "
                     "%s alignment\n", kl_fmt_bytes(arena, sizeof arena, m->gpu_arena_bytes),
                m->tp > 1 ? " per rank" : "",
                kl_fmt_bytes(pad, sizeof pad, m->gpu_arena_pad_bytes));
}

static double hash_gbps(const kl_audit_report *r)
{
    return r->hash_s > 0 ? (double)r->hashed_bytes / r->hash_s / 1e9 : 0.0;
}

static void print_hashes(const kl_audit_report *r, FILE *out)
{
    size_t ok = 0, bad = 0, unchecked = 0;
    for (size_t i = 0; i < r->n_hashes; i++) {
        const kl_shard_hash *h = &r->hashes[i];
        char name[1100];
        kl_escape_controls(name, sizeof name, h->file);
        fprintf(out, "    %s  %s%s\n", h->hashed ? h->sha256 : "(unreadable)", name,
                !h->has_expected ? "" : h->match ? "  OK" : "  MISMATCH");
        if (!h->has_expected)
            unchecked++;
        else if (h->match)
            ok++;
        else
            bad++;
    }
    fprintf(out, "  sha256       %zu shard(s), %.3f GB hashed in %.2f s (%.2f GB/s): %zu match, "
                 "%zu mismatch, %zu without expected value\n", r->n_hashes,
            (double)r->hashed_bytes / 1e9, r->hash_s, hash_gbps(r), ok, bad, unchecked);
}

/* Says whether total_size matched; a mismatch is a warning, unless shards are unreadable. */
static void print_total_size(const kl_audit_report *r, FILE *out)
{
    fprintf(out, "  total_size   %" PRIu64, r->total_size);
    if (r->n_bad_shards)
        fprintf(out, " (not compared: %zu shard(s) unreadable)\n", r->n_bad_shards);
    else
        fprintf(out, "%s\n", r->total_size == r->tensor_bytes ? " (matches)" : " (see warnings)");
}

void kl_audit_print_text(const kl_audit_report *r, FILE *out, int verbose)
{
    char dir[1100];
    kl_escape_controls(dir, sizeof dir, r->dir);
    fprintf(out, "kl audit %s\n", dir);
    if (r->config_ok)
        fprintf(out, "  family       %s (model_type %s, %u layers)\n", kl_family_name(r->family),
                r->config.model_type, r->config.num_hidden_layers);
    else
        fprintf(out, "  family       unknown (config.json unusable)\n");
    fprintf(out, "  shards       %zu", r->n_shards);
    if (r->n_bad_shards)
        fprintf(out, " (%zu unreadable)", r->n_bad_shards);
    fprintf(out, ", %.3f GB in files, %" PRIu64 " bytes of headers\n",
            (double)r->file_bytes / 1e9, r->header_bytes);
    fprintf(out, "  tensors      %zu found", r->n_tensors);
    if (r->n_expected_tensors)
        fprintf(out, ", %zu expected by the schema", r->n_expected_tensors);
    fprintf(out, ", %.3f GB of tensor data\n", (double)r->tensor_bytes / 1e9);
    if (r->has_total_size)
        print_total_size(r, out);
    if (r->n_regions)
        print_regions(r, out, verbose);
    if (r->has_memplan)
        print_memplan(&r->memplan, out);
    if (r->n_hashes)
        print_hashes(r, out);
    fprintf(out, "  metadata     checked in %.3f s\n", r->metadata_s);
    size_t shown = 0;
    for (size_t i = 0; i < r->n_findings; i++) {
        if (r->findings[i].severity == KL_SEV_INFO && !verbose)
            continue;
        if (!shown++)
            fprintf(out, "findings:\n");
        print_finding(&r->findings[i], out);
    }
    if (r->n_errors)
        fprintf(out, "result: %zu problem(s), %zu warning(s)\n", r->n_errors, r->n_warnings);
    else
        fprintf(out, "result: clean (%zu warning(s))\n", r->n_warnings);
}

/* ---- JSON ---------------------------------------------------------------------------------- */

static int add_findings(const kl_audit_report *r, cJSON *root)
{
    cJSON *arr = cJSON_AddArrayToObject(root, "findings");
    if (!arr)
        return KL_E_NOMEM;
    for (size_t i = 0; i < r->n_findings; i++) {
        const kl_finding *f = &r->findings[i];
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(arr, o))
            return KL_E_NOMEM;
        cJSON_AddStringToObject(o, "severity", kl_severity_name(f->severity));
        cJSON_AddStringToObject(o, "rule", f->rule);
        cJSON_AddStringToObject(o, "file", f->file);
        cJSON_AddStringToObject(o, "tensor", f->tensor);
        if (f->offset == KL_NO_OFFSET)
            cJSON_AddNullToObject(o, "offset");
        else
            kl_json_add_u64(o, "offset", f->offset);
        cJSON_AddStringToObject(o, "message", f->message);
    }
    return 0;
}

static int add_regions(const kl_audit_report *r, cJSON *root)
{
    cJSON *arr = cJSON_AddArrayToObject(root, "expert_regions");
    if (!arr)
        return KL_E_NOMEM;
    for (size_t i = 0; i < r->n_regions; i++) {
        const kl_expert_region *g = &r->regions[i];
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(arr, o))
            return KL_E_NOMEM;
        cJSON_AddNumberToObject(o, "layer", g->layer);
        cJSON_AddNumberToObject(o, "tensors", g->n_tensors);
        cJSON_AddNumberToObject(o, "shards", g->n_shards);
        cJSON_AddBoolToObject(o, "contiguous", g->contiguous);
        kl_json_add_u64(o, "size_bytes", g->n_bytes);
        if (g->contiguous) {
            cJSON_AddNumberToObject(o, "shard", g->shard);
            kl_json_add_u64(o, "file_offset", g->file_off);
        }
    }
    return 0;
}

static int add_memplan(const kl_memplan *m, cJSON *root)
{
    cJSON *o = cJSON_AddObjectToObject(root, "memory_plan");
    if (!o)
        return KL_E_NOMEM;
    cJSON_AddNumberToObject(o, "tp", m->tp);
    cJSON_AddBoolToObject(o, "expert_parallel", m->expert_parallel);
    kl_json_add_u64(o, "context_tokens", m->context);
    kl_json_add_u64(o, "weights_bytes_per_gpu", m->weights_bytes);
    kl_json_add_u64(o, "replicated_weights_bytes", m->replicated_bytes);
    kl_json_add_u64(o, "mla_cache_bytes_per_gpu", m->mla_cache_bytes);
    cJSON_AddNumberToObject(o, "mla_cache_element_bytes", (double)m->cache_elem_bytes);
    cJSON_AddNumberToObject(o, "kda_state_element_bytes", (double)m->state_elem_bytes);
    kl_json_add_u64(o, "kda_state_bytes_per_gpu", m->kda_state_bytes);
    kl_json_add_u64(o, "total_bytes_per_gpu", m->total_bytes);
    kl_json_add_u64(o, "matrix_bytes_per_gpu", m->matrix_bytes);
    kl_json_add_u64(o, "vector_bytes_per_gpu", m->vector_bytes);
    kl_json_add_u64(o, "vector_f32_bytes_per_gpu", m->vector_f32_bytes);
    if (!m->has_gpu_arena) {   /* a dtype the engines do not hold */
        cJSON_AddNullToObject(o, "gpu_arena_bytes");
        return 0;
    }
    kl_json_add_u64(o, "gpu_arena_bytes", m->gpu_arena_bytes);
    kl_json_add_u64(o, "gpu_arena_pad_bytes", m->gpu_arena_pad_bytes);
    return 0;
}

static int add_hashes(const kl_audit_report *r, cJSON *root)
{
    cJSON *arr = cJSON_AddArrayToObject(root, "hashes");
    if (!arr)
        return KL_E_NOMEM;
    for (size_t i = 0; i < r->n_hashes; i++) {
        const kl_shard_hash *h = &r->hashes[i];
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(arr, o))
            return KL_E_NOMEM;
        cJSON_AddStringToObject(o, "file", h->file);
        kl_json_add_u64(o, "size_bytes", h->size_bytes);
        if (h->hashed)
            cJSON_AddStringToObject(o, "sha256", h->sha256);
        else
            cJSON_AddNullToObject(o, "sha256");
        if (h->has_expected) {
            cJSON_AddStringToObject(o, "expected", h->expected);
            cJSON_AddBoolToObject(o, "match", h->match);
        } else {
            cJSON_AddNullToObject(o, "expected");
            cJSON_AddNullToObject(o, "match");
        }
    }
    cJSON_AddNumberToObject(root, "hash_elapsed_s", r->hash_s);
    kl_json_add_u64(root, "hashed_bytes", r->hashed_bytes);
    cJSON_AddNumberToObject(root, "hash_gbps", hash_gbps(r));
    return 0;
}

int kl_audit_to_json(const kl_audit_report *r, cJSON *root)
{
    cJSON_AddStringToObject(root, "dir", r->dir);
    cJSON_AddStringToObject(root, "family", r->config_ok ? kl_family_name(r->family) : "unknown");
    cJSON_AddNumberToObject(root, "errors", (double)r->n_errors);
    cJSON_AddNumberToObject(root, "warnings", (double)r->n_warnings);
    cJSON_AddNumberToObject(root, "shards", (double)r->n_shards);
    cJSON_AddNumberToObject(root, "unreadable_shards", (double)r->n_bad_shards);
    cJSON_AddNumberToObject(root, "tensors", (double)r->n_tensors);
    cJSON_AddNumberToObject(root, "expected_tensors", (double)r->n_expected_tensors);
    kl_json_add_u64(root, "tensor_bytes", r->tensor_bytes);
    kl_json_add_u64(root, "file_bytes", r->file_bytes);
    kl_json_add_u64(root, "header_bytes", r->header_bytes);
    if (r->has_total_size)
        kl_json_add_u64(root, "total_size", r->total_size);
    else
        cJSON_AddNullToObject(root, "total_size");
    cJSON_AddNumberToObject(root, "metadata_elapsed_s", r->metadata_s);
    if (add_findings(r, root) || add_regions(r, root))
        return KL_E_NOMEM;
    if (r->has_memplan && add_memplan(&r->memplan, root))
        return KL_E_NOMEM;
    if (r->n_hashes && add_hashes(r, root))
        return KL_E_NOMEM;
    return 0;
}
