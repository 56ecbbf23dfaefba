/* Reaches the driver only the way libcudart (and cudarc) do: libcuda.so.1 is not linked but
 * dlopen'ed RTLD_LOCAL, so none of its symbols are in the global scope, and every function is
 * found through dlsym(handle, ...) or cuGetProcAddress_v2. Prints one line per call, in the
 * format of alloc_free.c, with via "rt" (through cuGetProcAddress) or "dl" (dlsym'ed directly).
 *
 * Build: cc runtime_style.c -o runtime_style -ldl   (run with LD_LIBRARY_PATH=<fake driver dir>)
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "../cuda_driver.h"

static void line(const char *via, const char *kind, unsigned long long ptr, unsigned long long size,
                 unsigned long long stream, int result) {
    printf("%s %s %llu %llu %llu 0 %d\n", via, kind, ptr, size, stream, result);
}

static void *must(gpa2_fn gpa, const char *name, int version, unsigned long long flags) {
    void *fn = NULL;
    int status = -1;
    if (gpa(name, &fn, version, flags, &status) != 0 || status != 0 || !fn) {
        fprintf(stderr, "lookup of %s failed\n", name);
        exit(3);
    }
    return fn;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    gpa2_fn first = (gpa2_fn)dlsym(lib, "cuGetProcAddress_v2");
    if (!first) return 2;
    /* The runtime asks the driver for cuGetProcAddress itself and uses that from then on. */
    gpa2_fn gpa = (gpa2_fn)must(first, "cuGetProcAddress", 12000, 0);
    alloc_fn alloc = (alloc_fn)must(gpa, "cuMemAlloc", 12000, 0);
    free_fn release = (free_fn)must(gpa, "cuMemFree", 12000, 0);
    CUdeviceptr p = 0;
    int r = alloc(&p, 5000);
    line("rt", "alloc", p, 5000, 0, r);
    r = release(p);
    line("rt", "free", p, 0, 0, r);
    alloc_async_fn alloc_async = (alloc_async_fn)must(gpa, "cuMemAllocAsync", 12000, 0);
    free_async_fn free_async = (free_async_fn)must(gpa, "cuMemFreeAsync", 12000, 0);
    r = alloc_async(&p, 6000, (void *)7);
    line("rt", "alloc_async", p, 6000, 7, r);
    r = free_async(p, (void *)7);
    line("rt", "free_async", p, 0, 7, r);

    typedef CUresult (*pool_alloc_fn)(CUdeviceptr *, size_t, void *, void *);
    pool_alloc_fn pool_alloc = (pool_alloc_fn)must(gpa, "cuMemAllocFromPoolAsync", 12000, 2);
    free_async_fn free_async_ptsz = (free_async_fn)must(gpa, "cuMemFreeAsync", 12000, 2);
    r = pool_alloc(&p, 9000, NULL, (void *)8);
    line("rt", "alloc_from_pool", p, 9000, 8, r);
    r = free_async_ptsz(p, (void *)8);
    line("rt", "free_async", p, 0, 8, r);

    typedef CUresult (*reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    typedef CUresult (*address_free_fn)(CUdeviceptr, size_t);
    reserve_fn reserve = (reserve_fn)dlsym(lib, "cuMemAddressReserve");
    address_free_fn address_free = (address_free_fn)dlsym(lib, "cuMemAddressFree");
    if (!reserve || !address_free) return 4;
    CUdeviceptr va = 0;
    r = reserve(&va, 1 << 21, 0, 0, 0);
    line("dl", "address_reserve", va, 1 << 21, 0, r);
    r = address_free(va, 1 << 21);
    line("dl", "address_free", va, 1 << 21, 0, r);

    alloc_fn dl_alloc = (alloc_fn)dlsym(lib, "cuMemAlloc_v2");
    free_fn dl_free = (free_fn)dlsym(lib, "cuMemFree_v2");
    if (!dl_alloc || !dl_free) return 4;
    r = dl_alloc(&p, 768);
    line("dl", "alloc", p, 768, 0, r);
    r = dl_free(p);
    line("dl", "free", p, 0, 0, r);
    return 0;
}
