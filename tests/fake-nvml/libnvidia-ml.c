/*
 * A test double of NVIDIA's NVML (libnvidia-ml.so.1), for machines without
 * an NVIDIA GPU: it lets the NVML path of ngl-tune (nvml-wrapper's loading,
 * device queries, the memory sampler and its per-process figures, the
 * memory policy and the prediction gap) run end to end. Its numbers are not
 * a GPU's: one device, 16 GiB, 512 MiB used by "others", and every process
 * running `ngl-tune __trial` listed as a compute process holding its
 * resident memory (with llvmpipe, llama.cpp's device buffers live there).
 * FAKE_NVML_GPU_UTIL=N makes the GPU N% busy with another program (pid 1).
 * It draws a steady 150 W: its energy counter (mJ) is 150 W times the time
 * the machine has been up (CLOCK_MONOTONIC, to the microsecond), so every
 * process reads the same counter, and it only grows.
 *
 * Only the entry points ngl-tune calls exist; nvml-wrapper resolves the
 * rest lazily and never calls them. Built by tests/devices.rs with `cc`.
 */
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
enum { NVML_SUCCESS = 0, NVML_ERROR_INVALID_ARGUMENT = 2, NVML_ERROR_INSUFFICIENT_SIZE = 7 };

typedef struct nvmlDevice_st *nvmlDevice_t;
static int the_device;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

static const unsigned long long TOTAL = 16ULL << 30;
static const unsigned long long OTHERS = 512ULL << 20;

static nvmlReturn_t copy(char *dst, unsigned int len, const char *src) {
    if (!dst || strlen(src) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, src);
    return NVML_SUCCESS;
}

static int valid(nvmlDevice_t d) { return d == (nvmlDevice_t)&the_device; }

/* Workers: processes whose command line holds the argument "__trial". */
static int is_worker(const char *pid) {
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%s/cmdline", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    for (size_t i = 0; i < n;) {
        if (strcmp(buf + i, "__trial") == 0) return 1;
        i += strlen(buf + i) + 1;
    }
    return 0;
}

static unsigned long long rss_bytes(const char *pid) {
    char path[64], line[256];
    unsigned long long kib = 0;
    snprintf(path, sizeof path, "/proc/%s/status", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %llu kB", &kib) == 1) break;
    fclose(f);
    return kib << 10;
}

/* Fills up to `cap` entries (none when infos is NULL); returns how many exist. */
static unsigned int workers(nvmlProcessInfo_t *infos, unsigned int cap, unsigned long long *sum) {
    DIR *d = opendir("/proc");
    struct dirent *e;
    unsigned int n = 0;
    *sum = 0;
    if (!d) return 0;
    while ((e = readdir(d))) {
        if (!isdigit((unsigned char)e->d_name[0]) || !is_worker(e->d_name)) continue;
        unsigned long long b = rss_bytes(e->d_name);
        *sum += b;
        if (infos && n < cap) {
            infos[n].pid = (unsigned int)atoi(e->d_name);
            infos[n].usedGpuMemory = b;
            infos[n].gpuInstanceId = 0xFFFFFFFF;
            infos[n].computeInstanceId = 0xFFFFFFFF;
        }
        n++;
    }
    closedir(d);
    /* With FAKE_NVML_GPU_UTIL set, another program (pid 1) computes on the GPU. */
    if (getenv("FAKE_NVML_GPU_UTIL")) {
        if (infos && n < cap) {
            infos[n].pid = 1;
            infos[n].usedGpuMemory = OTHERS;
            infos[n].gpuInstanceId = 0xFFFFFFFF;
            infos[n].computeInstanceId = 0xFFFFFFFF;
        }
        n++;
    }
    return n;
}

nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }
const char *nvmlErrorString(nvmlReturn_t r) { return r == NVML_SUCCESS ? "Success" : "fake NVML error"; }

nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len) { return copy(v, len, "999.99.01-fake"); }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    *n = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (i != 0 || !d) return NVML_ERROR_INVALID_ARGUMENT;
    *d = (nvmlDevice_t)&the_device;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) {
    return valid(d) ? copy(name, len, "Fake NVML GPU (ngl-tune test double)") : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
    return valid(d) ? copy(uuid, len, "GPU-00000000-0000-0000-0000-0000fa4e0001") : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    unsigned long long sum;
    if (!valid(d) || !m) return NVML_ERROR_INVALID_ARGUMENT;
    workers(NULL, 0, &sum);
    m->total = TOTAL;
    m->reserved = 0;
    m->used = OTHERS + sum;
    m->free = TOTAL - m->used;
    return NVML_SUCCESS;
}

static nvmlReturn_t uint_out(nvmlDevice_t d, unsigned int *out, unsigned int v) {
    if (!valid(d) || !out) return NVML_ERROR_INVALID_ARGUMENT;
    *out = v;
    return NVML_SUCCESS;
}

static const unsigned int POWER_MW = 150000;

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) { return uint_out(d, mw, POWER_MW); }

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *mj) {
    struct timespec t;
    if (!valid(d) || !mj) return NVML_ERROR_INVALID_ARGUMENT;
    clock_gettime(CLOCK_MONOTONIC, &t);
    /* Counted in microseconds (150 W is 0.15 mJ a microsecond): a test of a few milliseconds is read to 0.1%. */
    *mj = ((unsigned long long)t.tv_sec * 1000000ULL + (unsigned long long)t.tv_nsec / 1000ULL) * (POWER_MW / 1000) / 1000ULL;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryBusWidth(nvmlDevice_t d, unsigned int *w) { return uint_out(d, w, 256); }
nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t d, int type, unsigned int *mhz) {
    (void)type;
    return uint_out(d, mhz, 8000);
}
nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t d, unsigned int *g) { return uint_out(d, g, 3); }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t d, unsigned int *g) { return uint_out(d, g, 4); }
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t d, unsigned int *w) { return uint_out(d, w, 8); }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t d, unsigned int *w) { return uint_out(d, w, 16); }

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

/* Utilization as the test asks for it (FAKE_NVML_GPU_UTIL, percent), else idle. */
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    if (!valid(d) || !u) return NVML_ERROR_INVALID_ARGUMENT;
    const char *env = getenv("FAKE_NVML_GPU_UTIL");
    u->gpu = env ? (unsigned int)atoi(env) : 0;
    u->memory = u->gpu;
    return NVML_SUCCESS;
}

/* NVML's two-call protocol: too small a buffer says how many exist. */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
    unsigned long long sum;
    if (!valid(d) || !count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = workers(infos, *count, &sum);
    int fits = n <= *count;
    *count = n;
    return fits ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
    (void)infos;
    if (!valid(d) || !count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}
