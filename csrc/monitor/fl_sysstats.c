/* fl_sysstats.c - host statistics from /proc and getrusage(); GPU statistics from NVML
 * (dlopen'ed, declared here from NVML's documented C API) or from nvidia-smi's CSV. */
#include "monitor/fl_sysstats.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/fl_dl.h"
#include "base/fl_error.h"
#include "base/fl_time.h"

/* ---- host ---- */

static double cpu_seconds(void) {
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return (double)usage.ru_utime.tv_sec + (double)usage.ru_utime.tv_usec * 1e-6 +
           (double)usage.ru_stime.tv_sec + (double)usage.ru_stime.tv_usec * 1e-6;
}

void fl_host_sampler_init(fl_host_sampler *sampler) {
    sampler->last_cpu_s = cpu_seconds();
    sampler->last_wall_s = fl_monotonic();
}

/* MemAvailable from /proc/meminfo in bytes, or -1. */
static double mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "re");
    if (f == NULL)
        return -1;
    char line[256];
    double kib = -1;
    while (fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "MemAvailable: %lf kB", &kib) == 1)
            break;
    fclose(f);
    return kib < 0 ? -1 : kib * 1024;
}

int fl_host_sample(fl_host_sampler *sampler, fl_host_stats *out) {
    FILE *f = fopen("/proc/self/statm", "re");
    long pages_total = 0, pages_resident = 0;
    int parsed = f != NULL && fscanf(f, "%ld %ld", &pages_total, &pages_resident) == 2;
    if (f != NULL)
        fclose(f);
    if (!parsed)
        return fl_error_set(FL_ESYS, "cannot read /proc/self/statm");
    out->rss_bytes = (double)pages_resident * (double)sysconf(_SC_PAGESIZE);
    double cpu = cpu_seconds(), wall = fl_monotonic();
    double elapsed = wall - sampler->last_wall_s;
    /* under 10 ms the rusage tick (typically 1-4 ms) makes the ratio noise */
    out->cpu_percent = elapsed >= 0.01 ? 100.0 * (cpu - sampler->last_cpu_s) / elapsed : -1;
    sampler->last_cpu_s = cpu;
    sampler->last_wall_s = wall;
    out->mem_available_bytes = mem_available();
    return FL_OK;
}

/* ---- GPUs ---- */

/* The slice of NVML's API we use (nvml.h, stable since CUDA 5): return codes are ints,
 * 0 is NVML_SUCCESS; devices are opaque pointers. */
typedef void *nvml_device;
typedef struct nvml_memory {
    unsigned long long total, free, used;
} nvml_memory;
typedef struct nvml_utilization {
    unsigned int gpu, memory;
} nvml_utilization;

typedef struct nvml_api {
    void *library;
    int (*init)(void);
    int (*shutdown)(void);
    int (*device_count)(unsigned int *);
    int (*device_handle)(unsigned int, nvml_device *);
    int (*memory_info)(nvml_device, nvml_memory *);
    int (*utilization)(nvml_device, nvml_utilization *);
    const char *(*error_string)(int);
} nvml_api;

struct fl_gpu {
    fl_gpu_source source;
    nvml_api nvml;
    char smi_command[512];
    char reason[1024]; /* room for both failure messages */
};

/* Loads and starts NVML; on failure returns -1 with why in `why`. */
static int nvml_load(nvml_api *api, const char *library, char *why, size_t why_len) {
    api->library = fl_dl_open(library, "NVML");
    if (api->library == NULL) {
        snprintf(why, why_len, "%s", fl_error_detail());
        fl_error_clear();
        return -1;
    }
    /* dlsym returns void*; POSIX guarantees it converts to function pointers */
#define NVML_SYMBOL(field, name) *(void **)&api->field = dlsym(api->library, name)
    NVML_SYMBOL(init, "nvmlInit_v2");
    NVML_SYMBOL(shutdown, "nvmlShutdown");
    NVML_SYMBOL(device_count, "nvmlDeviceGetCount_v2");
    NVML_SYMBOL(device_handle, "nvmlDeviceGetHandleByIndex_v2");
    NVML_SYMBOL(memory_info, "nvmlDeviceGetMemoryInfo");
    NVML_SYMBOL(utilization, "nvmlDeviceGetUtilizationRates");
    NVML_SYMBOL(error_string, "nvmlErrorString");
#undef NVML_SYMBOL
    if (!api->init || !api->shutdown || !api->device_count || !api->device_handle ||
        !api->memory_info || !api->utilization) {
        snprintf(why, why_len, "NVML (%s) lacks the _v2 entry points", library);
    } else {
        int rc = api->init();
        if (rc == 0)
            return 0;
        snprintf(why, why_len, "NVML (%s) failed to start: %s (%d)", library,
                 api->error_string ? api->error_string(rc) : "error", rc);
    }
    dlclose(api->library);
    api->library = NULL;
    return -1;
}

/* Runs nvidia-smi and parses "used, total, util" lines (MiB, MiB, %). Returns the number
 * of GPUs read, or -1 when the command failed or printed nothing usable. */
static int smi_read(const char *command, fl_gpu_stats *out, int max) {
    char line[512];
    snprintf(line, sizeof line,
             "%s --query-gpu=memory.used,memory.total,utilization.gpu "
             "--format=csv,noheader,nounits 2>/dev/null",
             command);
    FILE *pipe = popen(line, "re");
    if (pipe == NULL)
        return -1;
    int count = 0;
    while (fgets(line, sizeof line, pipe) != NULL && count < max) {
        double used, total, util;
        if (sscanf(line, " %lf , %lf , %lf", &used, &total, &util) != 3)
            continue; /* "[N/A]" or a warning line */
        out[count] = (fl_gpu_stats){count, used * 1048576.0, total * 1048576.0, util};
        count++;
    }
    int status = pclose(pipe);
    return status == 0 && count > 0 ? count : -1;
}

int fl_gpu_open(const char *nvml_library, const char *smi_command, fl_gpu **out) {
    fl_gpu *gpu = *out = calloc(1, sizeof *gpu);
    if (gpu == NULL)
        return FL_ENOMEM;
    char nvml_why[320];
    if (nvml_load(&gpu->nvml, nvml_library ? nvml_library : "libnvidia-ml.so.1", nvml_why,
                  sizeof nvml_why) == 0) {
        gpu->source = FL_GPU_NVML;
        snprintf(gpu->reason, sizeof gpu->reason, "GPUs read through NVML");
        return FL_OK;
    }
    snprintf(gpu->smi_command, sizeof gpu->smi_command, "%s",
             smi_command ? smi_command : "timeout 5 nvidia-smi");
    fl_gpu_stats probe[1];
    if (smi_read(gpu->smi_command, probe, 1) > 0) {
        gpu->source = FL_GPU_SMI;
        snprintf(gpu->reason, sizeof gpu->reason, "GPUs read with nvidia-smi (%s)", nvml_why);
        return FL_OK;
    }
    snprintf(gpu->reason, sizeof gpu->reason,
             "no GPU metrics: %s; and `%s` reported no GPU; sampling host metrics only",
             nvml_why, gpu->smi_command);
    return FL_OK;
}

fl_gpu_source fl_gpu_source_of(const fl_gpu *gpu) { return gpu->source; }

const char *fl_gpu_reason(const fl_gpu *gpu) { return gpu->reason; }

static int nvml_read(nvml_api *api, fl_gpu_stats *out, int max) {
    unsigned int devices = 0;
    if (api->device_count(&devices) != 0)
        return -1;
    int count = 0;
    for (unsigned int i = 0; i < devices && count < max; i++) {
        nvml_device device;
        nvml_memory memory;
        nvml_utilization util = {0, 0};
        if (api->device_handle(i, &device) != 0 || api->memory_info(device, &memory) != 0)
            continue;
        api->utilization(device, &util); /* unsupported on some parts: then 0 */
        out[count++] = (fl_gpu_stats){(int)i, (double)memory.used, (double)memory.total,
                                      (double)util.gpu};
    }
    return count;
}

int fl_gpu_sample(fl_gpu *gpu, fl_gpu_stats *out, int max, int *count) {
    *count = 0;
    int n = 0;
    if (gpu->source == FL_GPU_NVML)
        n = nvml_read(&gpu->nvml, out, max);
    else if (gpu->source == FL_GPU_SMI)
        n = smi_read(gpu->smi_command, out, max);
    if (n < 0)
        return fl_error_set(FL_ESYS, "reading GPU statistics failed");
    *count = n;
    return FL_OK;
}

void fl_gpu_close(fl_gpu *gpu) {
    if (gpu == NULL)
        return;
    if (gpu->nvml.library != NULL) {
        gpu->nvml.shutdown();
        dlclose(gpu->nvml.library);
    }
    free(gpu);
}
