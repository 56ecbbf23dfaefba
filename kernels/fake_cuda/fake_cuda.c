/* A fake CUDA driver (libcuda.so.1) for testing memprof without a GPU.
 *
 * Device pointers are numbers from a bump allocator (nothing is backed by memory), so programs
 * must not dereference them. Capacity comes from FAKE_CUDA_CAPACITY (bytes, default 1 GiB); an
 * allocation past it returns CUDA_ERROR_OUT_OF_MEMORY (2). cuGetProcAddress(_v2) returns this
 * library's own functions, as the real driver does. Unlike the real driver it stays usable in a
 * forked child (fork handlers hold its lock across fork), so that tests can record one. With
 * FAKE_CUDA_FORK_CALL set, its child fork handler (registered by its constructor, so before those
 * of a preloaded library) calls cuMemGetInfo_v2 as found by dlsym(RTLD_DEFAULT), which a preloaded
 * interposer is.
 *
 * Pinned host memory (cuMemHostAlloc, cuMemAllocHost_v2) is real memory, so programs may use it:
 * a bump allocator over 64 MiB mapped at a fixed address (0x500000000000), so that addresses are
 * the same in every run; cuMemFreeHost gives nothing back. cuMemHostRegister_v2 and
 * cuMemHostUnregister check their arguments only. None of it counts against the device capacity.
 *
 * Build it like the real driver, with -Bsymbolic, so its own references (the table that
 * cuGetProcAddress hands out) cannot be interposed:
 *   cc -shared -fPIC -Wl,-Bsymbolic -Wl,-soname,libcuda.so.1 -o libcuda.so.1 fake_cuda.c
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../cuda_driver.h"

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_FOUND = 500,
};

#define MAX_LIVE 4096
#define ALIGN 512ULL

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long next_address = 0x700000000000ULL;
static unsigned long long next_handle = 1;
static unsigned long long used;
static unsigned long long capacity;
static int capacity_read;

/* The lock is never held across fork by a thread the child does not have. */
static void fork_prepare(void) { pthread_mutex_lock(&lock); }
static void fork_release(void) { pthread_mutex_unlock(&lock); }
static void fork_call(void) {
    CUresult (*get_info)(size_t *, size_t *) =
        (CUresult(*)(size_t *, size_t *))dlsym(RTLD_DEFAULT, "cuMemGetInfo_v2");
    size_t free_bytes = 0, total = 0;
    if (!get_info || get_info(&free_bytes, &total) != 0) _exit(10);
}
__attribute__((constructor)) static void fork_handlers(void) {
    pthread_atfork(fork_prepare, fork_release, fork_release);
    if (getenv("FAKE_CUDA_FORK_CALL")) pthread_atfork(NULL, NULL, fork_call);
}

/* Live allocations and physical handles: key (pointer or handle) -> size. */
static struct { unsigned long long key, size; } live[MAX_LIVE];

static unsigned long long cap(void) {
    if (!capacity_read) {
        const char *env = getenv("FAKE_CUDA_CAPACITY");
        capacity = env ? strtoull(env, NULL, 10) : (1ULL << 30);
        capacity_read = 1;
    }
    return capacity;
}

static CUresult take(unsigned long long size, unsigned long long *key, int handle) {
    CUresult result = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    if (used + size <= cap()) {
        for (int i = 0; i < MAX_LIVE; i++) {
            if (live[i].key == 0) {
                unsigned long long k;
                if (handle) {
                    k = next_handle++;
                } else {
                    k = next_address;
                    next_address += (size + ALIGN - 1) / ALIGN * ALIGN + ALIGN;
                }
                live[i].key = k;
                live[i].size = size;
                used += size;
                *key = k;
                result = CUDA_SUCCESS;
                break;
            }
        }
    }
    pthread_mutex_unlock(&lock);
    return result;
}

static CUresult give(unsigned long long key) {
    CUresult result = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_LIVE && key; i++) {
        if (live[i].key == key) {
            used -= live[i].size;
            live[i].key = 0;
            result = CUDA_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return result;
}

CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_SUCCESS; }

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
    if (!dptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    return take(size, dptr, 0);
}

static unsigned long long env_number(const char *name, unsigned long long fallback);

/* FAKE_CUDA_FREE_DELAY_US: how long cuMemFree_v2 takes before it frees (0: no wait), as a real
 * one waits for the device; read once. */
static long long free_delay_us = -1;

CUresult cuMemFree_v2(CUdeviceptr dptr) {
    long long delay = __atomic_load_n(&free_delay_us, __ATOMIC_RELAXED);
    if (delay < 0) {
        delay = (long long)env_number("FAKE_CUDA_FREE_DELAY_US", 0);
        __atomic_store_n(&free_delay_us, delay, __ATOMIC_RELAXED);
    }
    if (delay > 0) usleep((useconds_t)delay);
    return give(dptr);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream stream) {
    (void)stream;
    return cuMemAlloc_v2(dptr, size);
}
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream stream) {
    return cuMemAllocAsync(dptr, size, stream);
}
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) { (void)stream; return give(dptr); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) { return cuMemFreeAsync(dptr, stream); }

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                            unsigned int element) {
    (void)element;
    if (!dptr || !pitch || width == 0 || height == 0) return CUDA_ERROR_INVALID_VALUE;
    size_t row = (width + ALIGN - 1) / ALIGN * ALIGN;
    CUresult r = take(row * height, dptr, 0);
    if (r == CUDA_SUCCESS) *pitch = row;
    return r;
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags) {
    (void)flags;
    return cuMemAlloc_v2(dptr, size);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, void *pool, CUstream stream) {
    (void)pool;
    return cuMemAllocAsync(dptr, size, stream);
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, void *pool, CUstream stream) {
    return cuMemAllocFromPoolAsync(dptr, size, pool, stream);
}

/* Address space only: never counts against the capacity. */
static unsigned long long next_va = 0x600000000000ULL;
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
    (void)alignment; (void)addr; (void)flags;
    if (!ptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    *ptr = next_va;
    next_va += (size + ALIGN - 1) / ALIGN * ALIGN;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    return ptr && size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags) {
    (void)prop; (void)flags;
    if (!handle || size == 0) return CUDA_ERROR_INVALID_VALUE;
    return take(size, handle, 1);
}
CUresult cuMemRelease(CUmemGenericAllocationHandle handle) { return give(handle); }
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
    (void)offset; (void)flags; (void)handle;
    return ptr && size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    return ptr && size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    *total = cap();
    *free_bytes = cap() - used;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

#define HOST_ARENA 0x500000000000ULL
#define HOST_ARENA_LEN (64ULL << 20)
static char *host_arena;
static unsigned long long host_used;

CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
    (void)flags;
    if (!pp || size == 0) return CUDA_ERROR_INVALID_VALUE;
    CUresult result = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    if (!host_arena) {
        void *at = mmap((void *)HOST_ARENA, HOST_ARENA_LEN, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
        if (at != MAP_FAILED) host_arena = at;
    }
    unsigned long long rounded = (size + ALIGN - 1) / ALIGN * ALIGN;
    if (host_arena && host_used + rounded <= HOST_ARENA_LEN) {
        *pp = host_arena + host_used;
        host_used += rounded;
        result = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return result;
}
CUresult cuMemAllocHost_v2(void **pp, size_t size) { return cuMemHostAlloc(pp, size, 0); }
CUresult cuMemFreeHost(void *p) { return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags) {
    (void)flags;
    return p && size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuMemHostUnregister(void *p) { return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }

/* Base name -> function, as the driver's table; `ptsz` for the per-thread-stream variant. */
static void *lookup(const char *symbol, int version, unsigned long long flags) {
    int ptsz = (flags & 2) != 0;
    if (!strcmp(symbol, "cuInit")) return (void *)cuInit;
    if (!strcmp(symbol, "cuMemAlloc") && version >= 3020) return (void *)cuMemAlloc_v2;
    if (!strcmp(symbol, "cuMemFree") && version >= 3020) return (void *)cuMemFree_v2;
    if (!strcmp(symbol, "cuMemGetInfo") && version >= 3020) return (void *)cuMemGetInfo_v2;
    if (!strcmp(symbol, "cuMemAllocAsync"))
        return ptsz ? (void *)cuMemAllocAsync_ptsz : (void *)cuMemAllocAsync;
    if (!strcmp(symbol, "cuMemFreeAsync"))
        return ptsz ? (void *)cuMemFreeAsync_ptsz : (void *)cuMemFreeAsync;
    if (!strcmp(symbol, "cuMemAllocPitch") && version >= 3020) return (void *)cuMemAllocPitch_v2;
    if (!strcmp(symbol, "cuMemAllocManaged")) return (void *)cuMemAllocManaged;
    if (!strcmp(symbol, "cuMemAllocFromPoolAsync"))
        return ptsz ? (void *)cuMemAllocFromPoolAsync_ptsz : (void *)cuMemAllocFromPoolAsync;
    if (!strcmp(symbol, "cuMemAddressReserve")) return (void *)cuMemAddressReserve;
    if (!strcmp(symbol, "cuMemAddressFree")) return (void *)cuMemAddressFree;
    if (!strcmp(symbol, "cuMemCreate")) return (void *)cuMemCreate;
    if (!strcmp(symbol, "cuMemRelease")) return (void *)cuMemRelease;
    if (!strcmp(symbol, "cuMemMap")) return (void *)cuMemMap;
    if (!strcmp(symbol, "cuMemUnmap")) return (void *)cuMemUnmap;
    if (!strcmp(symbol, "cuMemHostAlloc")) return (void *)cuMemHostAlloc;
    if (!strcmp(symbol, "cuMemAllocHost") && version >= 3020) return (void *)cuMemAllocHost_v2;
    if (!strcmp(symbol, "cuMemFreeHost")) return (void *)cuMemFreeHost;
    if (!strcmp(symbol, "cuMemHostRegister") && version >= 6050)
        return (void *)cuMemHostRegister_v2;
    if (!strcmp(symbol, "cuMemHostUnregister")) return (void *)cuMemHostUnregister;
    if (!strcmp(symbol, "cuGetProcAddress"))
        return version >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
    return NULL;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    *pfn = lookup(symbol, version, flags);
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags,
                             int *status) {
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    *pfn = lookup(symbol, version, flags);
    if (status) *status = *pfn ? 0 : 1; /* CU_GET_PROC_ADDRESS_SUCCESS / SYMBOL_NOT_FOUND */
    return CUDA_SUCCESS;
}

/* Device, context and version queries, for `memprof probe`: one device (ordinal 0) named
 * "Fake CUDA Device", driver version FAKE_CUDA_DRIVER_VERSION (default 12040), VMM granularity
 * FAKE_CUDA_GRANULARITY bytes (default 2 MiB, minimum and recommended alike). Built with
 * -DFAKE_CUDA_OLD_DRIVER it lacks cuMemGetAllocationGranularity, as drivers before CUDA 10.2 do.
 * Contexts, also for the shim's device attribution: the handle of device N's context is
 * 0x100 + N, for any N >= 0 (the workloads use several devices; the count says one, for probe).
 * Reached by symbol only; the lookup table above does not list them. */
#define FAKE_CUDA_ERROR_INVALID_DEVICE 101
#define FAKE_CUDA_ERROR_INVALID_CONTEXT 201

static int fake_primary_retained;
#define FAKE_CONTEXT_BASE 0x100
#define FAKE_MAX_DEVICES 1024

static unsigned long long env_number(const char *name, unsigned long long fallback) {
    const char *env = getenv(name);
    return env ? strtoull(env, NULL, 10) : fallback;
}

CUresult cuDriverGetVersion(int *version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = (int)env_number("FAKE_CUDA_DRIVER_VERSION", 12040);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = 1;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal != 0) return FAKE_CUDA_ERROR_INVALID_DEVICE;
    *device = 0;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int length, CUdevice device) {
    static const char fake_name[] = "Fake CUDA Device";
    if (device != 0) return FAKE_CUDA_ERROR_INVALID_DEVICE;
    if (!name || length <= 0) return CUDA_ERROR_INVALID_VALUE;
    size_t n = (size_t)length - 1 < sizeof fake_name - 1 ? (size_t)length - 1 : sizeof fake_name - 1;
    memcpy(name, fake_name, n);
    name[n] = '\0';
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device) {
    if (!context || device < 0) return CUDA_ERROR_INVALID_VALUE;
    if (device >= FAKE_MAX_DEVICES) return FAKE_CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    fake_primary_retained++;
    pthread_mutex_unlock(&lock);
    *context = (CUcontext)(uintptr_t)(FAKE_CONTEXT_BASE + device);
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext *context, unsigned int flags, CUdevice device) {
    (void)flags;
    return cuDevicePrimaryCtxRetain(context, device);
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
    if (device < 0 || device >= FAKE_MAX_DEVICES) return FAKE_CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    CUresult r = fake_primary_retained > 0 ? CUDA_SUCCESS : FAKE_CUDA_ERROR_INVALID_CONTEXT;
    if (fake_primary_retained > 0) fake_primary_retained--;
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuCtxSetCurrent(CUcontext context) {
    uintptr_t handle = (uintptr_t)context;
    int known = handle >= FAKE_CONTEXT_BASE && handle < FAKE_CONTEXT_BASE + FAKE_MAX_DEVICES;
    return context == NULL || known ? CUDA_SUCCESS : FAKE_CUDA_ERROR_INVALID_CONTEXT;
}

#ifndef FAKE_CUDA_OLD_DRIVER
/* Pinned memory (type 1) on a device (location type 1) only. */
CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       int option) {
    if (!granularity || !prop || option < 0 || option > 1) return CUDA_ERROR_INVALID_VALUE;
    if (prop->type != 1 || prop->location.type != 1) return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.id != 0) return FAKE_CUDA_ERROR_INVALID_DEVICE;
    *granularity = (size_t)env_number("FAKE_CUDA_GRANULARITY", 2ULL << 20);
    return CUDA_SUCCESS;
}
#endif
