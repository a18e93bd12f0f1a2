// Dry-run memory prediction: llama.cpp loads the model and creates the
// context without allocating (no_alloc), then reports what it would allocate
// per buffer type through llama_get_memory_breakdown (C++ only, in
// llama-ext.h), the mechanism llama.cpp's own --fit uses.
#include "llama-ext.h"
#include "ggml-backend.h"

#include <cstddef>
#include <cstdint>

extern "C" {

typedef void (*ngl_tune_buft_cb)(void * user, const char * buft, int is_host, uint64_t model, uint64_t context,
                                 uint64_t compute);

// Returns 0 on success, 1 when the model cannot be loaded, 2 when the context
// cannot be created.
int ngl_tune_predict(const char * path, int32_t n_gpu_layers, uint32_t n_ctx, uint32_t n_batch, uint32_t n_ubatch,
                     int32_t flash_attn, int32_t op_offload, ngl_tune_buft_cb cb, void * user) {
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers       = n_gpu_layers;
    mp.no_alloc           = true;
    mp.load_mode          = LLAMA_LOAD_MODE_NONE;  // as common_fit_params: map nothing, read nothing
    llama_model * model   = llama_model_load_from_file(path, mp);
    if (model == nullptr) {
        return 1;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx                = n_ctx;
    cp.n_batch              = n_batch;
    cp.n_ubatch             = n_ubatch;
    cp.flash_attn_type      = (llama_flash_attn_type) flash_attn;
    cp.op_offload           = op_offload != 0;
    llama_context * ctx     = llama_init_from_model(model, cp);
    if (ctx == nullptr) {
        llama_model_free(model);
        return 2;
    }
    const llama_memory_breakdown mb = llama_get_memory_breakdown(ctx);
    for (const auto & kv : mb) {
        ggml_backend_buffer_type_t buft = kv.first;
        cb(user, ggml_backend_buft_name(buft), ggml_backend_buft_is_host(buft) ? 1 : 0, kv.second.model,
           kv.second.context, kv.second.compute);
    }
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
}
