/* A library linked against the driver, as a Python extension module or a ctypes-loaded library
 * is, for loading with dlopen(RTLD_LOCAL): then libcuda.so.1 is in the library's local scope
 * only, and its driver calls bind to a preloaded interposer's exports. local_calls() makes
 * cuMemAlloc_v2 (4096 bytes), cuMemGetInfo_v2, cuGetProcAddress_v2("cuMemAlloc") and a call
 * through the pointer it hands out (8192 bytes), then cuMemFree_v2 of both, and prints one line
 * per call with its result ("call NAME RESULT [VALUE]"). Returns 0 when every call succeeded,
 * else 100 * (the failing call's number) + its result.
 * Build: cc -O1 -shared -fPIC local_driver.c -o liblocal_driver.so -L<dir> -l:libcuda.so.1 \
 *        -Wl,-rpath,<dir>
 */
#include <stdio.h>

#include "../cuda_driver.h"

static int step(int n, const char *name, CUresult rc, unsigned long long value) {
    printf("call %s %d %llu\n", name, (int)rc, value);
    fflush(stdout);
    return rc == 0 ? 0 : 100 * n + (int)rc;
}

int local_calls(void) {
    CUdeviceptr a = 0, b = 0;
    size_t free_bytes = 0, total = 0;
    void *fn = NULL;
    int status = -1;
    CUresult r;
    int rc;
    r = cuMemAlloc_v2(&a, 4096);
    if ((rc = step(1, "cuMemAlloc_v2", r, a))) return rc;
    r = cuMemGetInfo_v2(&free_bytes, &total);
    if ((rc = step(2, "cuMemGetInfo_v2", r, free_bytes))) return rc;
    r = cuGetProcAddress_v2("cuMemAlloc", &fn, 12000, 0, &status);
    if ((rc = step(3, "cuGetProcAddress_v2", r, (unsigned)status))) return rc;
    if (!fn || status != 0) return 399;
    CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))fn;
    r = alloc(&b, 8192);
    if ((rc = step(4, "looked-up-cuMemAlloc", r, b))) return rc;
    r = cuMemFree_v2(b);
    if ((rc = step(5, "cuMemFree_v2", r, b))) return rc;
    return step(6, "cuMemFree_v2", cuMemFree_v2(a), a);
}
