/* The GPU series a Triton user's dashboards and perf_analyzer's
 * --collect-metrics read (nv_gpu_utilization, nv_gpu_memory_total_bytes,
 * nv_gpu_memory_used_bytes, nv_gpu_power_usage, nv_gpu_power_limit,
 * nv_energy_consumption, labelled gpu_uuid), for each GPU a local cuda
 * worker serves, read from NVML by a thread of their own once a second.
 *
 * NVML is the driver's library (libnvidia-ml.so.1): it is loaded at run
 * time, after the first scrape that has a local cuda worker, so that squishd
 * neither links nor needs it; without it (no driver, no GPU) the series
 * are absent, as a cpu-only Triton's are. The few calls and their structs
 * are declared here as NVML's API documents them (nvml.h is not part of
 * the CUDA toolkit this project builds against). A worker on another host
 * (cuda:N@host) has no series here: its GPU is not this host's. */
#include "metrics_int.h"

#include <sq.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <string.h>

typedef struct nvml_device *nvml_device_t;
typedef struct {
    unsigned int gpu, memory; /* percent of the last sample period */
} nvml_utilization_t;
typedef struct {
    unsigned long long total, free, used; /* bytes */
} nvml_memory_t;

static struct {
    pthread_once_t once;
    pthread_mutex_t lock; /* last, between the sampler and the scrapes */
    int ok;
    int (*init)(void);
    int (*by_index)(unsigned int, nvml_device_t *);
    int (*uuid)(nvml_device_t, char *, unsigned int);
    int (*utilization)(nvml_device_t, nvml_utilization_t *);
    int (*memory)(nvml_device_t, nvml_memory_t *);
    int (*power)(nvml_device_t, unsigned int *);        /* mW */
    int (*power_limit)(nvml_device_t, unsigned int *);  /* mW */
    int (*energy)(nvml_device_t, unsigned long long *); /* mJ since the driver loaded */
    unsigned long long energy0[64];                     /* at squishd's first scrape */
    int energy0_set[64];
} nv = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

static void nvml_load(void)
{
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        SQ_INFO("no GPU metrics: NVML not loaded (%s)", dlerror());
        return;
    }
    *(void **)&nv.init = dlsym(h, "nvmlInit_v2");
    *(void **)&nv.by_index = dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&nv.uuid = dlsym(h, "nvmlDeviceGetUUID");
    *(void **)&nv.utilization = dlsym(h, "nvmlDeviceGetUtilizationRates");
    *(void **)&nv.memory = dlsym(h, "nvmlDeviceGetMemoryInfo");
    *(void **)&nv.power = dlsym(h, "nvmlDeviceGetPowerUsage");
    *(void **)&nv.power_limit = dlsym(h, "nvmlDeviceGetPowerManagementLimit");
    *(void **)&nv.energy = dlsym(h, "nvmlDeviceGetTotalEnergyConsumption");
    if (nv.init == NULL || nv.by_index == NULL || nv.uuid == NULL || nv.init() != 0) {
        SQ_INFO("no GPU metrics: NVML did not initialize");
        return;
    }
    nv.ok = 1; /* the library stays loaded for squishd's life */
}

/* One family's header and its samples, one per GPU that answered. */
typedef struct {
    const char *name, *type, *help;
} family_t;

static const family_t FAMILIES[] = {
    {"nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)"},
    {"nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes"},
    {"nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes"},
    {"nv_gpu_power_usage", "gauge", "GPU power usage in watts"},
    {"nv_gpu_power_limit", "gauge", "GPU power management limit in watts"},
    {"nv_energy_consumption", "counter", "GPU energy consumption in joules since squishd started"},
};
enum { F_UTIL, F_MEM_TOTAL, F_MEM_USED, F_POWER, F_LIMIT, F_ENERGY, F_COUNT };

/* The last sample of each GPU asked for (sampler thread, under nv.lock). */
static struct {
    int n;
    char uuid[64][96];
    double v[64][F_COUNT];
    int have[64][F_COUNT];
} last;
static atomic_uint_fast64_t wanted; /* bit i: cuda:i, the last scrape's */

/* One sample of every GPU in mask, into last. */
static void sample(uint64_t mask)
{
    char uuid[64][96];
    double v[64][F_COUNT];
    int have[64][F_COUNT];
    memset(have, 0, sizeof(have));
    int n = 0;
    for (int i = 0; i < 64; i++) {
        if (!(mask & ((uint64_t)1 << i)))
            continue;
        nvml_device_t d;
        if (nv.by_index((unsigned)i, &d) != 0 || nv.uuid(d, uuid[n], sizeof(uuid[n])) != 0)
            continue;
        nvml_utilization_t u;
        nvml_memory_t m;
        unsigned int mw;
        unsigned long long mj;
        if (nv.utilization != NULL && nv.utilization(d, &u) == 0) {
            v[n][F_UTIL] = u.gpu / 100.0;
            have[n][F_UTIL] = 1;
        }
        if (nv.memory != NULL && nv.memory(d, &m) == 0) {
            v[n][F_MEM_TOTAL] = (double)m.total;
            v[n][F_MEM_USED] = (double)m.used;
            have[n][F_MEM_TOTAL] = have[n][F_MEM_USED] = 1;
        }
        if (nv.power != NULL && nv.power(d, &mw) == 0) {
            v[n][F_POWER] = mw / 1000.0;
            have[n][F_POWER] = 1;
        }
        if (nv.power_limit != NULL && nv.power_limit(d, &mw) == 0) {
            v[n][F_LIMIT] = mw / 1000.0;
            have[n][F_LIMIT] = 1;
        }
        if (nv.energy != NULL && nv.energy(d, &mj) == 0) {
            if (!nv.energy0_set[i]) {
                nv.energy0[i] = mj;
                nv.energy0_set[i] = 1;
            }
            v[n][F_ENERGY] = (double)(mj - nv.energy0[i]) / 1000.0;
            have[n][F_ENERGY] = 1;
        }
        n++;
    }
    pthread_mutex_lock(&nv.lock);
    last.n = n;
    memcpy(last.uuid, uuid, sizeof(uuid));
    memcpy(last.v, v, sizeof(v));
    memcpy(last.have, have, sizeof(have));
    pthread_mutex_unlock(&nv.lock);
}

/* NVML's calls are the driver's and may take milliseconds (its init
 * hundreds): they run here, once a second, never on an HTTP loop. */
static void *sampler(void *arg)
{
    (void)arg;
    nvml_load();
    for (;;) {
        if (nv.ok)
            sample(atomic_load(&wanted));
        struct timespec second = {1, 0};
        nanosleep(&second, NULL);
    }
    return NULL;
}

static void start_sampler(void)
{
    pthread_t t;
    if (pthread_create(&t, NULL, sampler, NULL) == 0)
        pthread_detach(t);
}

/* A scrape writes the last sample (none until the sampler has one). */
void gw_metrics_write_gpus(gw_metrics_t *ms, sq_buf_t *out)
{
    uint64_t local_cuda = ms != NULL ? atomic_load(&ms->local_cuda) : 0;
    if (local_cuda == 0)
        return;
    atomic_store(&wanted, local_cuda);
    pthread_once(&nv.once, start_sampler);
    pthread_mutex_lock(&nv.lock);
    int n = last.n;
    for (int f = 0; f < F_COUNT; f++) {
        int any = 0;
        for (int k = 0; k < n; k++)
            any |= last.have[k][f];
        if (!any)
            continue;
        sq_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", FAMILIES[f].name, FAMILIES[f].help,
                      FAMILIES[f].name, FAMILIES[f].type);
        for (int k = 0; k < n; k++) {
            if (!last.have[k][f])
                continue;
            char num[48];
            gw__metrics_fmt_double(num, sizeof(num), last.v[k][f]);
            sq_buf_printf(out, "%s{gpu_uuid=\"%s\"} %s\n", FAMILIES[f].name, last.uuid[k], num);
        }
    }
    pthread_mutex_unlock(&nv.lock);
}
