// The placement and the dry run, in one place: how a trial's placement
// (whole layers, per-device split, tensors kept on the CPU) becomes
// llama.cpp's model parameters, for the trial's real load and for the
// dry run alike. The dry run loads the model and creates the context
// without allocating (no_alloc), then reports what it would allocate per
// buffer type through llama_get_memory_breakdown (C++ only, in
// llama-ext.h), the mechanism llama.cpp's own --fit uses.
//
// Also llama.cpp's RPC backend (ggml-rpc.h): registering remote devices as
// common/arg.cpp's add_rpc_devices does, and serving this machine's devices.
#include "llama-ext.h"
#include "ggml-backend.h"
#include "ggml-backend-impl.h"
#include "ggml-rpc.h"
#include "mtmd.h"

#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

// llama.cpp's thread rule (common/common.cpp, C++ linkage): the cores
// useful for math (performance cores only on hybrid Intel CPUs).
int32_t common_cpu_get_num_math();

// A served device with a memory size of its own (`rpc-server --mem`): the
// device ggml-rpc's server is given reports the size as its total and the
// size less what its clients hold as free, and an allocation past it fails
// as a card's does (the client's load then fails with llama.cpp's "failed
// to allocate" line). Everything else is the real device's: the wrapper
// shares its context, so the real device's functions serve it unchanged.
// ggml-rpc's server allocates every buffer through the default buffer
// type of the backend it created (rpc_server::alloc_buffer), reads memory
// through that backend's device (rpc_server::get_device_memory), and frees
// buffers through ggml_backend_buffer_free, so those three are wrapped.
namespace {

struct limited_device {
    ggml_backend_device        dev;   // first: a ggml_backend_dev_t is a pointer to it
    ggml_backend_dev_t         real;
    ggml_backend_buffer_type   buft;
    ggml_backend_buffer_type_t real_buft;
    size_t                     limit;
    size_t                     held;
};

struct held_buffer {
    limited_device * owner;
    size_t           size;
    void (*free_buffer)(ggml_backend_buffer_t);
};

std::mutex                                  g_mutex;
std::vector<limited_device *>               g_devices;
std::map<ggml_backend_buffer_t, held_buffer> g_buffers;

limited_device * owner_of_buft(ggml_backend_buffer_type_t buft) {
    for (auto * d : g_devices) {
        if (&d->buft == buft) {
            return d;
        }
    }
    return nullptr;
}

void limited_memory(ggml_backend_dev_t dev, size_t * free, size_t * total) {
    auto * d = reinterpret_cast<limited_device *>(dev);
    size_t real_free = 0, real_total = 0;
    d->real->iface.get_memory(d->real, &real_free, &real_total);
    std::lock_guard<std::mutex> lock(g_mutex);
    size_t left = d->held < d->limit ? d->limit - d->held : 0;
    *free  = left < real_free ? left : real_free;
    *total = d->limit;
}

void limited_props(ggml_backend_dev_t dev, struct ggml_backend_dev_props * props) {
    auto * d = reinterpret_cast<limited_device *>(dev);
    d->real->iface.get_props(d->real, props);
    limited_memory(dev, &props->memory_free, &props->memory_total);
}

ggml_backend_t limited_init(ggml_backend_dev_t dev, const char * params) {
    auto * d = reinterpret_cast<limited_device *>(dev);
    ggml_backend_t backend = d->real->iface.init_backend(d->real, params);
    if (backend != nullptr) {
        // The server reads memory and the default buffer type through this.
        backend->device = dev;
    }
    return backend;
}

ggml_backend_buffer_type_t limited_buffer_type(ggml_backend_dev_t dev) {
    return &reinterpret_cast<limited_device *>(dev)->buft;
}

bool limited_supports_buft(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft) {
    auto * d = reinterpret_cast<limited_device *>(dev);
    return d->real->iface.supports_buft(d->real, buft == &d->buft ? d->real_buft : buft);
}

void limited_free(ggml_backend_buffer_t buffer) {
    held_buffer h{};
    {
        std::lock_guard<std::mutex> lock(g_mutex);
        auto it = g_buffers.find(buffer);
        if (it == g_buffers.end()) {
            return;
        }
        h = it->second;
        g_buffers.erase(it);
        h.owner->held -= h.size < h.owner->held ? h.size : h.owner->held;
    }
    h.free_buffer(buffer);
}

ggml_backend_buffer_t limited_alloc(ggml_backend_buffer_type_t buft, size_t size) {
    limited_device * d = owner_of_buft(buft);
    {
        std::lock_guard<std::mutex> lock(g_mutex);
        if (d->held + size > d->limit) {
            fprintf(stderr,
                    "ngl-tune rpc-server: %s: allocating %.2f MiB failed: out of memory (%.2f of %.2f MiB held)\n",
                    d->real->iface.get_name(d->real), size / 1048576.0, d->held / 1048576.0, d->limit / 1048576.0);
            return nullptr;
        }
        d->held += size;
    }
    ggml_backend_buffer_t buffer = d->real_buft->iface.alloc_buffer(d->real_buft, size);
    std::lock_guard<std::mutex> lock(g_mutex);
    if (buffer == nullptr) {
        d->held -= size;
        return nullptr;
    }
    g_buffers[buffer] = held_buffer{ d, size, buffer->iface.free_buffer };
    buffer->iface.free_buffer = limited_free;
    return buffer;
}

// `real` with `limit` bytes of memory; lives as long as the process.
ggml_backend_dev_t limited(ggml_backend_dev_t real, size_t limit) {
    auto * d      = new limited_device{};
    d->real       = real;
    d->limit      = limit;
    d->dev        = *real;
    d->dev.iface.get_memory      = limited_memory;
    d->dev.iface.get_props       = limited_props;
    d->dev.iface.init_backend    = limited_init;
    d->dev.iface.get_buffer_type = limited_buffer_type;
    d->dev.iface.supports_buft   = limited_supports_buft;
    d->real_buft                 = real->iface.get_buffer_type(real);
    d->buft                      = *d->real_buft;
    d->buft.iface.alloc_buffer   = limited_alloc;
    d->buft.iface.alloc_buffer_n = nullptr;
    d->buft.device               = &d->dev;
    std::lock_guard<std::mutex> lock(g_mutex);
    g_devices.push_back(d);
    return &d->dev;
}

}  // namespace

extern "C" {

typedef void (*ngl_tune_buft_cb)(void * user, const char * buft, int is_host, uint64_t model, uint64_t context,
                                 uint64_t compute);

// Where a model's parts go. `tensor_split` (n_split proportions, one per
// offload device in llama.cpp's device order; none: llama.cpp's default by
// free memory) and `split_mode`/`main_gpu` are llama.cpp's -ts, -sm, -mg.
// `cpu_patterns` (n_cpu_patterns regular expressions) keep the tensors they
// match in the CPU buffer type, as llama.cpp's -ot PATTERN=CPU. `devices`
// (n_devices names, as --list-devices gives them) are the offload devices
// in the order they take layers, as llama.cpp's --device; `tensor_split`
// then follows that order. None: every device in llama.cpp's order.
typedef struct ngl_tune_placement {
    int32_t              n_gpu_layers;
    int32_t              split_mode;
    int32_t              main_gpu;
    const float *        tensor_split;
    uint32_t             n_split;
    const char * const * cpu_patterns;
    uint32_t             n_cpu_patterns;
    const char * const * devices;
    uint32_t             n_devices;
    int32_t              load_mtp;  // load the MTP (NextN) blocks, as --spec-type draft-mtp does
} ngl_tune_placement;

}  // extern "C"

namespace {

// The model parameters of a placement; `overrides`, `split` and `devs` own
// what the parameters point to and must outlive the load. False (and a line
// on the log) when a device name is not one of llama.cpp's offload devices,
// as common/arg.cpp's parse_device_list refuses it.
bool make_params(const ngl_tune_placement * p, std::vector<llama_model_tensor_buft_override> & overrides,
                 std::vector<float> & split, std::vector<ggml_backend_dev_t> & devs, llama_model_params & out) {
    llama_model_params mp = llama_model_default_params();
    if (p->n_devices > 0) {
        for (uint32_t i = 0; i < p->n_devices; i++) {
            ggml_backend_dev_t dev = ggml_backend_dev_by_name(p->devices[i]);
            if (dev == nullptr || ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
                fprintf(stderr, "invalid device: %s\n", p->devices[i]);
                return false;
            }
            devs.push_back(dev);
        }
        devs.push_back(nullptr);
        mp.devices = devs.data();
    }
    mp.n_gpu_layers       = p->n_gpu_layers;
    mp.load_mtp           = p->load_mtp != 0;
    mp.split_mode         = (llama_split_mode) p->split_mode;
    mp.main_gpu           = p->main_gpu;
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (p->n_cpu_patterns > 0 && cpu != nullptr) {
        for (uint32_t i = 0; i < p->n_cpu_patterns; i++) {
            overrides.push_back({ p->cpu_patterns[i], ggml_backend_dev_buffer_type(cpu) });
        }
        overrides.push_back({ nullptr, nullptr });
        mp.tensor_buft_overrides = overrides.data();
    }
    if (p->n_split > 0) {
        split.assign(llama_max_devices(), 0.0f);
        for (uint32_t i = 0; i < p->n_split && i < split.size(); i++) {
            split[i] = p->tensor_split[i];
        }
        mp.tensor_split = split.data();
    }
    out = mp;
    return true;
}

}  // namespace

extern "C" {

// Loads the model for a trial (allocating, memory-mapped as llama.cpp's
// default). nullptr when llama.cpp cannot load it; its log says why.
llama_model * ngl_tune_load_model(const char * path, const ngl_tune_placement * p) {
    std::vector<llama_model_tensor_buft_override> overrides;
    std::vector<float>                            split;
    std::vector<ggml_backend_dev_t>               devs;  // llama.cpp copies the list
    llama_model_params                            mp;
    if (!make_params(p, overrides, split, devs, mp)) {
        return nullptr;
    }
    // The override patterns are kept by the model for its life: copy them
    // where they live as long as the process (one trial).
    for (auto & o : overrides) {
        if (o.pattern != nullptr) {
            o.pattern = strdup(o.pattern);
        }
    }
    return llama_model_load_from_file(path, mp);
}

// Returns 0 on success, 1 when the model cannot be loaded, 2 when the context
// cannot be created. `type_kv` is the ggml type of both KV caches;
// `n_outputs_max` and `n_outputs_per_seq` the outputs the context is sized
// for (0: llama.cpp's default, a whole batch), as llama-server sizes a
// target's and a draft's beside it.
int ngl_tune_predict(const char * path, const ngl_tune_placement * p, uint32_t n_ctx, uint32_t n_batch,
                     uint32_t n_ubatch, int32_t flash_attn, int32_t op_offload, int32_t type_kv,
                     uint32_t n_outputs_max, uint32_t n_outputs_per_seq, ngl_tune_buft_cb cb, void * user) {
    std::vector<llama_model_tensor_buft_override> overrides;
    std::vector<float>                            split;
    std::vector<ggml_backend_dev_t>               devs;
    llama_model_params                            mp;
    if (!make_params(p, overrides, split, devs, mp)) {
        return 1;
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
    if (n_outputs_max > 0) {
        cp.n_outputs_max         = n_outputs_max;
        cp.n_outputs_max_per_seq = n_outputs_per_seq;
    }
    llama_context * ctx     = llama_init_from_model(model, cp);
    if (ctx == nullptr) {
        llama_model_free(model);
        return 2;
    }
    // Each buffer type's bytes of `c`; its weights left out where they are the model's, already counted.
    auto report = [&](llama_context * c, bool shared_weights) {
        for (const auto & kv : llama_get_memory_breakdown(c)) {
            ggml_backend_buffer_type_t buft = kv.first;
            cb(user, ggml_backend_buft_name(buft), ggml_backend_buft_is_host(buft) ? 1 : 0,
               shared_weights ? 0 : kv.second.model, kv.second.context, kv.second.compute);
        }
    };
    report(ctx, false);
    if (p->load_mtp != 0) {
        // The MTP context llama-server creates beside the model's for
        // draft-mtp (common_speculative_init_from_params), priced as
        // common_fit_params prices its extra model: the context follows
        // the model's whole n_ctx, one output a sequence, f16 cache (the
        // draft's -ctkd/-ctvd default), and its weights are the model's
        // own (shares_model), so only its cache and compute buffers add.
        llama_context_params mcp  = cp;
        mcp.ctx_type              = LLAMA_CONTEXT_TYPE_MTP;
        mcp.n_rs_seq              = 0;
        mcp.n_outputs_max         = 1;
        mcp.n_outputs_max_per_seq = 1;
        mcp.type_k                = GGML_TYPE_F16;
        mcp.type_v                = GGML_TYPE_F16;
        llama_context * mtp       = llama_init_from_model(model, mcp);
        if (mtp == nullptr) {
            llama_free(ctx);
            llama_model_free(model);
            return 2;
        }
        report(mtp, true);
        llama_free(mtp);
    }
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}

typedef void (*ngl_tune_mmproj_cb)(void * user, const char * buft, int is_host, uint64_t bytes);

// What a multimodal projector (--mmproj) would allocate per buffer type:
// its weights and its image encoder's compute buffers, reserved for the
// largest image as llama-server's warmup reserves them, without allocating
// (mtmd_get_memory_usage, the dry run llama.cpp's own tools use). `use_gpu`
// is llama.cpp's --mmproj-offload: the first GPU, as llama-server picks it.
// Returns 0 on success, 1 when mtmd cannot read the projector (its log says why).
// mtmd's estimate for a projector loaded as llama-server loads it
// (warmed up for the largest image), on the first GPU where `use_gpu`.
static mtmd_memory_usage mmproj_usage(const char * path, int use_gpu, int32_t flash_attn, uint32_t n_threads) {
    mtmd_context_params p = mtmd_context_params_default();
    p.use_gpu             = use_gpu != 0;
    p.flash_attn_type     = (llama_flash_attn_type) flash_attn;
    p.n_threads           = (int) n_threads;
    p.warmup              = true;
    p.print_timings       = false;
    return mtmd_get_memory_usage(path, p);
}

int ngl_tune_mmproj_memory(const char * path, int use_gpu, int32_t flash_attn, uint32_t n_threads,
                           ngl_tune_mmproj_cb cb, void * user) {
    const mtmd_memory_usage m = mmproj_usage(path, use_gpu, flash_attn, n_threads);
    if (m.backend_mem_usage.empty()) {
        return 1;
    }
    for (const auto & kv : m.backend_mem_usage) {
        ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(kv.first);
        cb(user, ggml_backend_buft_name(buft), ggml_backend_buft_is_host(buft) ? 1 : 0, (uint64_t) kv.second);
    }
    return 0;
}

// What llama-server adds to its fit target for a projector
// (tools/server/server-context.cpp, load_model, with --mmproj and fit on):
// mtmd's estimate per device, added at that device's index in ggml's
// registry where the target list has one. `pad` holds `n` entries (one per
// device index); they are left as given for devices the projector does not
// use. Returns 0 on success, 1 when mtmd cannot price the projector (the
// server then adds nothing either).
int ngl_tune_mmproj_fit_pad(const char * path, int use_gpu, int32_t flash_attn, uint64_t * pad, size_t n) {
    const mtmd_memory_usage m = mmproj_usage(path, use_gpu, flash_attn, 1);
    if (m.backend_mem_usage.empty()) {
        return 1;
    }
    for (const auto & kv : m.backend_mem_usage) {
        for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
            if (ggml_backend_dev_get(i) == kv.first) {
                if (i < n) {
                    pad[i] += (uint64_t) kv.second;
                }
                break;
            }
        }
    }
    return 0;
}

// The RPC protocol version this build speaks: major << 16 | minor << 8 | patch.
uint32_t ngl_tune_rpc_protocol(void) {
    return (RPC_PROTO_MAJOR_VERSION << 16) | (RPC_PROTO_MINOR_VERSION << 8) | RPC_PROTO_PATCH_VERSION;
}

// Registers the devices of one RPC server (host:port), as llama.cpp's
// --rpc does. Returns how many it has; 0 when it has none. The caller has
// checked that the server answers: ggml aborts on a server it cannot reach.
int ngl_tune_add_rpc(const char * endpoint) {
    ggml_backend_reg_t reg = ggml_backend_rpc_add_server(endpoint);
    if (reg == nullptr) {
        return 0;
    }
    ggml_backend_register(reg);
    return (int) ggml_backend_reg_dev_count(reg);
}

// Serves the named devices (llama.cpp's device names; with none, as
// llama.cpp's rpc-server: every local GPU, else the CPU) over llama.cpp's RPC protocol on host:port until the
// process ends. `mem_limit` (bytes; 0: none) is each served device's
// memory size, as above. Returns -1 when a name is not a device; otherwise
// returns only when the server could not start (its reason on stderr).
int ngl_tune_rpc_serve(const char * endpoint, const char * cache_dir, uint32_t n_threads, const char * const * names,
                       uint32_t n_names, uint64_t mem_limit) {
    std::vector<ggml_backend_dev_t> devices;
    for (uint32_t i = 0; i < n_names; i++) {
        ggml_backend_dev_t dev = ggml_backend_dev_by_name(names[i]);
        if (dev == nullptr) {
            return -1;
        }
        devices.push_back(dev);
    }
    for (size_t i = 0; n_names == 0 && i < ggml_backend_dev_count(); i++) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_GPU &&
            strcmp(ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev)), "RPC") != 0) {
            devices.push_back(dev);
        }
    }
    if (devices.empty()) {
        devices.push_back(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU));
    }
    for (size_t i = 0; mem_limit > 0 && i < devices.size(); i++) {
        devices[i] = limited(devices[i], (size_t) mem_limit);
    }
    ggml_backend_rpc_start_server(endpoint, cache_dir, n_threads, devices.size(), devices.data());
    return 1;
}

// The threads llama.cpp's tools use without -t (common_params' default).
int ngl_tune_math_threads() {
    return common_cpu_get_num_math();
}

}  // extern "C"
