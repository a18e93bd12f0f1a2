// Dry-run memory prediction: llama.cpp loads the model and creates the
// context without allocating (no_alloc), then reports what it would allocate
// per buffer type through llama_get_memory_breakdown (C++ only, in
// llama-ext.h), the mechanism llama.cpp's own --fit uses.
#include "llama-ext.h"
#include "ggml-backend.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

extern "C" {

typedef void (*ngl_tune_buft_cb)(void * user, const char * buft, int is_host, uint64_t model, uint64_t context,
                                 uint64_t compute);

// Returns 0 on success, 1 when the model cannot be loaded, 2 when the context
// cannot be created. `cpu_patterns` (n_cpu_patterns regular expressions)
// keep the tensors they match in the CPU buffer type, as llama.cpp's -ot.
// `type_kv` is the ggml type of both KV caches.
int ngl_tune_predict(const char * path, int32_t n_gpu_layers, uint32_t n_ctx, uint32_t n_batch, uint32_t n_ubatch,
                     int32_t flash_attn, int32_t op_offload, int32_t type_kv, const char * const * cpu_patterns,
                     uint32_t n_cpu_patterns, ngl_tune_buft_cb cb, void * user) {
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers       = n_gpu_layers;
    std::vector<llama_model_tensor_buft_override> overrides;
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (n_cpu_patterns > 0 && cpu != nullptr) {
        for (uint32_t i = 0; i < n_cpu_patterns; i++) {
            overrides.push_back({ cpu_patterns[i], ggml_backend_dev_buffer_type(cpu) });
        }
        overrides.push_back({ nullptr, nullptr });
        mp.tensor_buft_overrides = overrides.data();
    }
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
    cp.type_k               = (ggml_type) type_kv;
    cp.type_v               = (ggml_type) type_kv;
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
