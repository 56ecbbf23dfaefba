/* A fake libnvidia-ml.so.1 for tests on machines without a GPU: the NVML C entry points the
 * memprof sampler reaches through nvml-wrapper, answering from a scenario file named by
 * FAKE_NVML_SCENARIO (format in kernels/README.md). Types and return codes follow nvml.h. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_UNKNOWN 999

#define NVML_VALUE_NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFULL
#define NO_ID 0xFFFFFFFFu
#define MAX_DEVICES 64
#define MAX_PROCESSES 4096

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

/* -1 in a field of the scenario: the query returns NVML_ERROR_NOT_SUPPORTED. */
struct device {
    long long total, used, free, util_gpu, util_mem;
    char uuid[96];
    char name[96];
    int name_supported, uuid_supported;
};

struct process {
    unsigned int device;
    unsigned int pid;
    int graphics;
    int unavailable;
    unsigned long long used;
    unsigned long long step; /* added after every filled compute/graphics list query */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static char driver[80];
static struct device devices[MAX_DEVICES];
static unsigned int device_count;
static struct process processes[MAX_PROCESSES];
static unsigned int process_count;

static int parse_line(char *line) {
    char kind[16];
    int at = 0;
    if (sscanf(line, "%15s %n", kind, &at) != 1 || kind[0] == '#')
        return 0;
    char *rest = line + at;
    rest[strcspn(rest, "\r\n")] = '\0';
    if (strcmp(kind, "driver") == 0) {
        snprintf(driver, sizeof driver, "%s", rest);
        return 0;
    }
    if (strcmp(kind, "device") == 0) {
        if (device_count >= MAX_DEVICES)
            return -1;
        struct device *d = &devices[device_count];
        char uuid[96];
        int name_at = 0;
        if (sscanf(rest, "%lld %lld %lld %lld %lld %95s %n", &d->total, &d->used, &d->free,
                   &d->util_gpu, &d->util_mem, uuid, &name_at) != 6)
            return -1;
        d->uuid_supported = strcmp(uuid, "-") != 0;
        snprintf(d->uuid, sizeof d->uuid, "%s", uuid);
        d->name_supported = strcmp(rest + name_at, "-") != 0 && rest[name_at] != '\0';
        snprintf(d->name, sizeof d->name, "%s", rest + name_at);
        device_count++;
        return 0;
    }
    if (strcmp(kind, "process") == 0) {
        if (process_count >= MAX_PROCESSES)
            return -1;
        struct process *p = &processes[process_count];
        char type[16], used[32];
        p->step = 0;
        int n = sscanf(rest, "%u %u %15s %31s %llu", &p->device, &p->pid, type, used, &p->step);
        if (n < 4)
            return -1;
        p->graphics = strcmp(type, "graphics") == 0;
        p->unavailable = strcmp(used, "na") == 0;
        p->used = p->unavailable ? 0 : strtoull(used, NULL, 10);
        process_count++;
        return 0;
    }
    return -1;
}

/* The scenario file as it was when last read: device, inode, size, modification time. */
static struct stat loaded;

static int load_scenario(void) {
    const char *path = getenv("FAKE_NVML_SCENARIO");
    if (path == NULL)
        return -1;
    if (stat(path, &loaded) != 0)
        return -1;
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    device_count = 0;
    process_count = 0;
    snprintf(driver, sizeof driver, "%s", "550.54.15");
    char line[512];
    int status = 0;
    while (status == 0 && fgets(line, sizeof line, f) != NULL)
        status = parse_line(line);
    fclose(f);
    return status;
}

nvmlReturn_t nvmlInit_v2(void) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t r = NVML_SUCCESS;
    if (initialized == 0 && load_scenario() != 0)
        r = NVML_ERROR_DRIVER_NOT_LOADED;
    else
        initialized++;
    pthread_mutex_unlock(&lock);
    return r;
}

nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t r = initialized > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (initialized > 0)
        initialized--;
    pthread_mutex_unlock(&lock);
    return r;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_string(const char *value, char *out, unsigned int length) {
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    return copy_string(driver, version, length);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (version == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *version = 12040;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = device_count;
    return NVML_SUCCESS;
}

/* A device handle is a pointer to its entry in `devices`. */
static struct device *valid(void *handle) {
    struct device *d = handle;
    if (!initialized || d < devices || d >= devices + device_count)
        return NULL;
    return d;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (index >= device_count || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(void *device, char *name, unsigned int length) {
    struct device *d = valid(device);
    if (d == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->name_supported)
        return NVML_ERROR_NOT_SUPPORTED;
    return copy_string(d->name, name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(void *device, char *uuid, unsigned int length) {
    struct device *d = valid(device);
    if (d == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->uuid_supported)
        return NVML_ERROR_NOT_SUPPORTED;
    return copy_string(d->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *device, nvmlMemory_v2_t *memory) {
    struct device *d = valid(device);
    if (d == NULL || memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* NVML_STRUCT_VERSION(Memory, 2): the struct's size with the version in the top byte. */
    if (memory->version != ((unsigned int)sizeof(nvmlMemory_v2_t) | (2u << 24)))
        return NVML_ERROR_INVALID_ARGUMENT;
    /* The v2 struct has one value for all three figures: all supported, or none. */
    if (d->total < 0 || d->used < 0 || d->free < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    memory->total = (unsigned long long)d->total;
    memory->used = (unsigned long long)d->used;
    memory->free = (unsigned long long)d->free;
    memory->reserved = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(void *device, nvmlUtilization_t *utilization) {
    struct device *d = valid(device);
    if (d == NULL || utilization == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->util_gpu < 0 || d->util_mem < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    utilization->gpu = (unsigned int)d->util_gpu;
    utilization->memory = (unsigned int)d->util_mem;
    return NVML_SUCCESS;
}

/* The count-then-fill protocol of nvml.h: a short (or NULL) buffer gets the count and
 * NVML_ERROR_INSUFFICIENT_SIZE; a filled list advances every listed process by its step. */
static nvmlReturn_t list(void *device, int graphics, unsigned int *count, nvmlProcessInfo_t *infos) {
    struct device *d = valid(device);
    if (d == NULL || count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int index = (unsigned int)(d - devices);
    pthread_mutex_lock(&lock);
    /* A count query reads the scenario again when its file changed (a program replaces it to
     * change what NVML reports while it runs). */
    struct stat now;
    const char *path = getenv("FAKE_NVML_SCENARIO");
    if ((*count == 0 || infos == NULL) && path && stat(path, &now) == 0 &&
        (now.st_ino != loaded.st_ino || now.st_size != loaded.st_size ||
         now.st_mtim.tv_sec != loaded.st_mtim.tv_sec ||
         now.st_mtim.tv_nsec != loaded.st_mtim.tv_nsec))
        load_scenario();
    unsigned int n = 0;
    for (unsigned int i = 0; i < process_count; i++)
        if (processes[i].device == index && processes[i].graphics == graphics)
            n++;
    nvmlReturn_t r = NVML_SUCCESS;
    if (n > *count || (n > 0 && infos == NULL)) {
        r = NVML_ERROR_INSUFFICIENT_SIZE;
    } else {
        unsigned int k = 0;
        for (unsigned int i = 0; i < process_count; i++) {
            struct process *p = &processes[i];
            if (p->device != index || p->graphics != graphics)
                continue;
            infos[k].pid = p->pid;
            infos[k].usedGpuMemory = p->unavailable ? NVML_VALUE_NOT_AVAILABLE : p->used;
            infos[k].gpuInstanceId = NO_ID;
            infos[k].computeInstanceId = NO_ID;
            p->used += p->step;
            k++;
        }
    }
    *count = n;
    pthread_mutex_unlock(&lock);
    return r;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    return list(device, 0, count, infos);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(void *device, unsigned int *count,
                                                      nvmlProcessInfo_t *infos) {
    return list(device, 1, count, infos);
}
