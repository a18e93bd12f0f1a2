// Speculative decoding measured as llama-server runs it: the target
// loaded with the trial's own placement (ngl_tune_load_model, as every
// trial) and its context from llama-server's parameters
// (common_context_params_to_llama); the draft loaded by
// common_speculative_init_from_params from the parameters llama-server
// derives for it (common_base_params_to_speculative: its own -ngld and
// cache types, its context sized as the target's); and generation
// through common_speculative_* as tools/server does for one slot: draft,
// verify the last token and the draft in one batch, accept what the
// target's sampler agrees with, trim the rest from both contexts.
//
// Each repetition starts back at the depth (the text's first n_depth
// tokens, read once into both contexts) and generates n_gen tokens
// greedily, without the draft and with it, in the Thue-Morse order (AB BA
// BA AB ...), so a steady drift adds to both sides alike. Greedy decoding
// makes both runs' tokens the same where the loop is right (but for a
// near tie a batch's kernels break the other way): the shared prefix is kept.
#include "common.h"
#include "llama-ext.h"
#include "llama.h"
#include "sampling.h"
#include "speculative.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

extern "C" {

#define NGL_TUNE_SPEC_MAX_REPS 32

struct ngl_tune_placement;
llama_model * ngl_tune_load_model(const char * path, const ngl_tune_placement * p);

// The target's context as llama-server creates it (one slot).
typedef struct {
    uint32_t n_ctx;
    uint32_t n_batch;
    uint32_t n_ubatch;
    int32_t  n_threads;
    int32_t  flash_attn;  // llama_flash_attn_type
    int32_t  op_offload;
    int32_t  type_kv;     // ggml type of both caches
} ngl_tune_spec_context;

// The draft as llama-server's flags set it.
typedef struct {
    const char * path;        // -md; null: the model's own MTP heads (--spec-type draft-mtp)
    int32_t      n_gpu_layers;  // -ngld (-1: auto, every layer)
    int32_t      n_max;       // --spec-draft-n-max
    int32_t      type_kv;     // -ctkd / -ctvd
} ngl_tune_spec_draft;

typedef struct {
    uint32_t n_reps;                            // repetitions run
    uint64_t plain_ns[NGL_TUNE_SPEC_MAX_REPS];  // each repetition's generation without the draft
    uint64_t spec_ns[NGL_TUNE_SPEC_MAX_REPS];   // and with it
    uint32_t n_gen;                             // tokens generated a repetition (each side)
    uint32_t n_depth;                           // tokens in the context before generating
    uint64_t n_drafted;                         // draft tokens proposed, every repetition
    uint64_t n_accepted;                        // of them accepted by the target
    uint64_t n_rounds;                          // target batches that verified a draft
    uint32_t same_prefix;                       // the fewest leading tokens both runs of a repetition shared
    char     error[512];                        // why it failed (a return other than 0)
} ngl_tune_spec_result;

// Per buffer type of the target's (which = 0) and the draft's (which = 1)
// context: its weights, KV cache and compute buffers (llama_get_memory_breakdown).
typedef void (*ngl_tune_spec_mem_cb)(void * user, int which, const char * buft, int is_host, uint64_t model,
                                     uint64_t context, uint64_t compute);

}  // extern "C"

namespace {

using clock_type = std::chrono::steady_clock;

uint64_t since(clock_type::time_point t0) {
    return (uint64_t) std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - t0).count();
}

// Decodes `toks` at positions from `pos` into the target, n_batch at a
// time, each batch handed to the speculator (which replays it into the
// draft's context) when `spec` is given.
bool read_text(llama_context * ctx, common_speculative * spec, const std::vector<llama_token> & toks, int pos) {
    const int n_batch = (int) llama_n_batch(ctx);
    common_batch batch(ctx);
    for (size_t i = 0; i < toks.size(); i += n_batch) {
        batch.clear();
        for (size_t j = i; j < toks.size() && j < i + n_batch; j++) {
            batch.add(toks[j], pos + (int) j, 0, false);
        }
        if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch.get()) != 0) {
            return false;
        }
        if (spec != nullptr && !common_speculative_process(spec, batch)) {
            return false;
        }
    }
    return true;
}

// Drops what follows `from` (a rejected draft, a repetition's tokens);
// false where the memory cannot.
bool trim(llama_context * ctx, int from) {
    return ctx == nullptr || llama_memory_seq_rm(llama_get_memory(ctx), 0, from, -1);
}

// Bit count of `i`: pairs in the Thue-Morse order run the plain side first where even.
int ones(uint32_t i) {
    int n = 0;
    for (; i != 0; i &= i - 1) {
        n++;
    }
    return n;
}

// n_gen tokens one at a time after `last` at position `pos`.
bool gen_plain(common_params & params, llama_context * ctx, llama_model * model, llama_token last, int pos, int n_gen,
               std::vector<llama_token> & out) {
    common_sampler_ptr smpl(common_sampler_init(model, params.sampling));
    common_batch batch(ctx);
    out.clear();
    while ((int) out.size() < n_gen) {
        batch.clear();
        batch.add(last, pos++, 0, true);
        if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch.get()) != 0) {
            return false;
        }
        last = common_sampler_sample(smpl.get(), ctx, -1);
        common_sampler_accept(smpl.get(), last, true);
        out.push_back(last);
    }
    return true;
}

struct spec_counts {
    uint64_t drafted = 0, accepted = 0, rounds = 0;
};

// n_gen tokens (at least) after `last` at position `pos`, drafting as
// llama-server's slot does: a draft of at most --spec-draft-n-max, the
// last token and the draft verified in one batch, the agreed prefix
// accepted and the rest trimmed from both contexts.
bool gen_spec(common_params & params, llama_context * ctx, llama_context * ctx_dft, common_speculative * spec,
              llama_model * model, std::vector<llama_token> prompt, llama_token last, int n_gen,
              std::vector<llama_token> & out, spec_counts & n) {
    common_sampler_ptr smpl(common_sampler_init(model, params.sampling));
    common_batch batch(ctx);
    llama_tokens draft;
    out.clear();
    common_speculative_begin(spec, 0, prompt);
    int pos = (int) prompt.size();
    while ((int) out.size() < n_gen) {
        const int n_draft_max = std::max(0, std::min((int) llama_n_ctx(ctx) - pos - 2, n_gen - (int) out.size() - 1));
        draft.clear();
        // No room left: no draft (llama.cpp caps a draft only by a limit above 0).
        common_speculative_get_draft_params(spec, 0) = { n_draft_max > 0, n_draft_max, pos, last, &prompt, &draft };
        common_speculative_draft(spec);
        if (!trim(ctx_dft, pos)) {
            return false;
        }
        batch.clear();
        batch.add(last, pos, 0, true);
        for (size_t i = 0; i < draft.size(); i++) {
            batch.add(draft[i], pos + 1 + (int) i, 0, true);
        }
        if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch.get()) != 0) {
            return false;
        }
        if (!common_speculative_process(spec, batch)) {
            return false;
        }
        const auto ids = common_sampler_sample_and_accept_n(smpl.get(), ctx, draft);
        common_speculative_accept(spec, 0, (uint16_t) (ids.size() - 1));
        if (!draft.empty()) {
            n.rounds++;
            n.drafted += draft.size();
            n.accepted += ids.size() - 1;
        }
        for (auto id : ids) {
            prompt.push_back(last);
            last = id;
            out.push_back(id);
        }
        pos += (int) ids.size();
        if (!trim(ctx, pos) || !trim(ctx_dft, pos)) {
            return false;
        }
    }
    out.resize(n_gen);
    return true;
}

void breakdown(llama_context * ctx, int which, ngl_tune_spec_mem_cb cb, void * user, bool shared_weights) {
    if (ctx == nullptr || cb == nullptr) {
        return;
    }
    for (const auto & kv : llama_get_memory_breakdown(ctx)) {
        ggml_backend_buffer_type_t buft = kv.first;
        cb(user, which, ggml_backend_buft_name(buft), ggml_backend_buft_is_host(buft) ? 1 : 0,
           shared_weights ? 0 : kv.second.model, kv.second.context, kv.second.compute);
    }
}

int fail(ngl_tune_spec_result * r, int code, const std::string & why) {
    snprintf(r->error, sizeof(r->error), "%s", why.c_str());
    return code;
}

}  // namespace

extern "C" {

// Loads the target at placement `p` with context `c` and the draft `d`
// beside it (none where `d` is null: the plain runs alone, each
// repetition one), and generates over `text`: 0 on success; 3 where a model or
// context cannot be loaded (llama.cpp's log says why), 4 where the draft
// does not suit the target, 5 where decoding fails, 6 where the text or
// the context is shorter than the depth and the tokens to generate.
static int spec_bench(const char * path, const ngl_tune_placement * p, const ngl_tune_spec_context * c,
                      const ngl_tune_spec_draft * d, const char * text, uint32_t n_depth, uint32_t n_gen,
                      uint32_t n_reps, ngl_tune_spec_mem_cb cb, void * user, ngl_tune_spec_result * r) {
    common_params params;
    params.n_ctx                           = (int32_t) c->n_ctx;
    params.n_parallel                      = 1;
    params.n_batch                         = (int32_t) c->n_batch;
    params.n_ubatch                        = (int32_t) c->n_ubatch;
    params.cpuparams.n_threads             = c->n_threads;
    params.cpuparams_batch.n_threads       = c->n_threads;
    params.flash_attn_type                 = (llama_flash_attn_type) c->flash_attn;
    params.no_op_offload                   = c->op_offload == 0;
    params.cache_type_k                    = (ggml_type) c->type_kv;
    params.cache_type_v                    = (ggml_type) c->type_kv;
    params.sampling.temp                   = 0.0f;  // greedy: both sides generate the same tokens
    const bool mtp = d != nullptr && d->path == nullptr;
    if (d != nullptr) {
        params.speculative.types = { mtp ? COMMON_SPECULATIVE_TYPE_DRAFT_MTP : COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE };
        if (!mtp) {
            params.speculative.draft.mparams.path = d->path;
        }
        params.speculative.draft.n_gpu_layers  = d->n_gpu_layers;
        params.speculative.draft.n_max         = d->n_max;
        params.speculative.draft.cache_type_k  = (ggml_type) d->type_kv;
        params.speculative.draft.cache_type_v  = (ggml_type) d->type_kv;
        params.speculative.draft.cpuparams.n_threads       = c->n_threads;
        params.speculative.draft.cpuparams_batch.n_threads = c->n_threads;
    }
    const auto limits = common_speculative_get_output_limits(params.n_batch, params.n_parallel,
                                                             common_speculative_n_max(&params.speculative));
    params.n_outputs_max         = limits.total;
    params.n_outputs_max_per_seq = limits.per_seq;

    llama_model_ptr model(ngl_tune_load_model(path, p));
    if (!model) {
        return fail(r, 3, "llama.cpp could not load the target model");
    }
    llama_context_ptr ctx_ptr(llama_init_from_model(model.get(), common_context_params_to_llama(params)));
    llama_context *   ctx = ctx_ptr.get();
    if (ctx == nullptr) {
        return fail(r, 3, "llama.cpp could not create the target's context");
    }
    common_speculative_init_result_ptr spec_init;
    llama_context *                    ctx_dft = nullptr;
    common_speculative_ptr             spec;
    if (d != nullptr) {
        common_params params_dft = common_base_params_to_speculative(params);
        spec_init                = common_speculative_init_from_params(params_dft, model.get(), ctx);
        ctx_dft                  = spec_init ? spec_init->context() : nullptr;
        if (ctx_dft == nullptr) {
            return fail(r, 3, mtp ? "llama.cpp could not create the MTP context (the model has no MTP blocks?)"
                                  : "llama.cpp could not load the draft model or its context");
        }
        if (!mtp && !common_speculative_are_compatible(model.get(), spec_init->model())) {
            return fail(r, 4, "the draft's vocabulary does not match the target's (llama.cpp's check)");
        }
        // A rejected draft is dropped from both caches position by position.
        if (common_context_can_seq_rm(ctx) != COMMON_CONTEXT_SEQ_RM_TYPE_PART ||
            common_context_can_seq_rm(ctx_dft) != COMMON_CONTEXT_SEQ_RM_TYPE_PART) {
            return fail(r, 4, "the target's or the draft's memory cannot drop a rejected draft (recurrent): not measured");
        }
        params.speculative.draft.ctx_tgt = ctx;
        params.speculative.draft.ctx_dft = ctx_dft;
        spec.reset(common_speculative_init(params.speculative, 1));
        if (!spec) {
            return fail(r, 4, "llama.cpp started no speculative decoding for this draft");
        }
    }
    breakdown(ctx, 0, cb, user, false);
    // The MTP context runs on the model's own weights: its cache and compute alone add.
    breakdown(ctx_dft, 1, cb, user, mtp);

    std::vector<llama_token> toks = common_tokenize(ctx, text, true, false);
    if (toks.size() < (size_t) n_depth + 1 || n_depth + n_gen + 2 > llama_n_ctx(ctx)) {
        return fail(r, 6, "the text or the context is shorter than the depth and the tokens to generate");
    }
    toks.resize(n_depth + 1);
    const llama_token last = toks.back();
    toks.pop_back();
    if (!read_text(ctx, spec.get(), toks, 0)) {
        return fail(r, 5, "decoding the text to the depth failed");
    }
    r->n_gen   = n_gen;
    r->n_depth = n_depth;
    r->same_prefix = n_gen;
    spec_counts counts;
    std::vector<llama_token> plain, drafted;
    for (uint32_t i = 0; i < n_reps && i < NGL_TUNE_SPEC_MAX_REPS; i++) {
        const bool plain_first = ones(i) % 2 == 0;
        for (int side = 0; side < (spec ? 2 : 1); side++) {
            const bool is_plain = !spec || (side == 0) == plain_first;
            if (!trim(ctx, (int) n_depth) || !trim(ctx_dft, (int) n_depth)) {
                return fail(r, 5, "the cache could not be trimmed back to the depth");
            }
            if (mtp) {
                // The plain side runs as the model without MTP: no NextN rows out of the target.
                llama_set_embeddings_nextn(ctx, !is_plain, false);
            }
            if (!is_plain) {
                // The speculator keeps state from its last batch (MTP: the
                // target's hidden row it drafts from next, which it pairs
                // with a batch's first token): read the depth's last tokens
                // again, twice, untimed, so each repetition drafts from the
                // depth with the same cache as every other.
                const int back = (int) std::min<uint32_t>(8, n_depth);
                const std::vector<llama_token> tail(toks.end() - back, toks.end());
                for (int pass = 0; pass < 2; pass++) {
                    if (!trim(ctx, (int) n_depth - back) || !trim(ctx_dft, (int) n_depth - back) ||
                        !read_text(ctx, spec.get(), tail, (int) n_depth - back)) {
                        return fail(r, 5, "reading the depth's last tokens again failed");
                    }
                }
            }
            const auto t0 = clock_type::now();
            bool ok = is_plain ? gen_plain(params, ctx, model.get(), last, (int) n_depth, (int) n_gen, plain)
                               : gen_spec(params, ctx, ctx_dft, spec.get(), model.get(), toks, last, (int) n_gen, drafted,
                                          counts);
            if (!ok) {
                return fail(r, 5, "decoding failed while generating");
            }
            (is_plain ? r->plain_ns : r->spec_ns)[i] = since(t0);
        }
        uint32_t k = 0;
        while (k < plain.size() && k < drafted.size() && plain[k] == drafted[k]) {
            k++;
        }
        if (spec) {
            r->same_prefix = std::min(r->same_prefix, k);
        }
        r->n_reps = i + 1;
    }
    r->n_drafted  = counts.drafted;
    r->n_accepted = counts.accepted;
    r->n_rounds   = counts.rounds;
    return 0;
}

// llama.cpp's speculative code throws where a draft does not suit (its
// constructors): an exception must not unwind into Rust.
int ngl_tune_spec_bench(const char * path, const ngl_tune_placement * p, const ngl_tune_spec_context * c,
                        const ngl_tune_spec_draft * d, const char * text, uint32_t n_depth, uint32_t n_gen,
                        uint32_t n_reps, ngl_tune_spec_mem_cb cb, void * user, ngl_tune_spec_result * r) {
    memset(r, 0, sizeof(*r));
    try {
        return spec_bench(path, p, c, d, text, n_depth, n_gen, n_reps, cb, user, r);
    } catch (const std::exception & e) {
        return fail(r, 4, std::string("llama.cpp refused the draft: ") + e.what());
    }
}

}  // extern "C"

extern "C" {

// Whether llama.cpp would draft for `target` with `draft`
// (common_speculative_are_compatible, both read vocabulary only): 1 yes,
// 0 no, -1 where either cannot be read (llama.cpp's log says why).
int ngl_tune_spec_compatible(const char * target, const char * draft) {
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only         = true;
    llama_model_ptr tgt(llama_model_load_from_file(target, mp));
    llama_model_ptr dft(llama_model_load_from_file(draft, mp));
    if (!tgt || !dft) {
        return -1;
    }
    return common_speculative_are_compatible(tgt.get(), dft.get()) ? 1 : 0;
}

}  // extern "C"
