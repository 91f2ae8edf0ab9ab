/* fl_sysstats.h - what the monitor samples: this process's memory and CPU use, the host's
 * available memory, and every NVIDIA GPU's memory and utilization.
 *
 * GPUs are read through NVML, loaded at run time with dlopen (no build-time dependency),
 * else by parsing nvidia-smi's CSV output, else not at all; fl_gpu_reason() says which and
 * why. Nothing here needs Python; sampling a GPU can block for a few milliseconds.
 */
#ifndef FL_SYSSTATS_H
#define FL_SYSSTATS_H

#include <stddef.h>

typedef struct fl_host_stats {
    double rss_bytes;           /* resident memory of this process */
    double cpu_percent;         /* since the previous sample (200 = two cores); -1 if < 10 ms */
    double mem_available_bytes; /* MemAvailable of the host; -1 when unknown */
} fl_host_stats;

typedef struct fl_host_sampler {
    double last_cpu_s, last_wall_s;
} fl_host_sampler;

/* Starts CPU accounting from now. Never fails. */
void fl_host_sampler_init(fl_host_sampler *sampler);

/* Fills *out (cpu_percent since the last call or init). Returns 0 or FL_ESYS. */
int fl_host_sample(fl_host_sampler *sampler, fl_host_stats *out);

typedef enum fl_gpu_source { FL_GPU_NONE = 0, FL_GPU_NVML = 1, FL_GPU_SMI = 2 } fl_gpu_source;

typedef struct fl_gpu_stats {
    int index;
    double memory_used_bytes, memory_total_bytes, utilization_percent;
} fl_gpu_stats;

typedef struct fl_gpu fl_gpu;

/* Finds a way to read GPUs: NVML from `nvml_library` (NULL: "libnvidia-ml.so.1"), else the
 * command `smi_command` (NULL: "nvidia-smi") run with the query arguments, else none.
 * Sets *out (never NULL on success) and returns 0, or FL_ENOMEM. */
int fl_gpu_open(const char *nvml_library, const char *smi_command, fl_gpu **out);

/* Which source was found, and a sentence on why (what was tried and what failed). */
fl_gpu_source fl_gpu_source_of(const fl_gpu *gpu);
const char *fl_gpu_reason(const fl_gpu *gpu);

/* Reads up to `max` GPUs into out and sets *count. Returns 0 or FL_ESYS (detail: why). */
int fl_gpu_sample(fl_gpu *gpu, fl_gpu_stats *out, int max, int *count);

/* Shuts NVML down and frees. NULL is a no-op. */
void fl_gpu_close(fl_gpu *gpu);

#endif
