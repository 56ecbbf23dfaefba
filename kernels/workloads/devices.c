/* Allocates on three devices by switching contexts, as a runtime does, so a recording can name
 * the device of calls that do not say it: retains the primary contexts of devices 0 and 2,
 * allocates 1000 bytes with device 2's current, 2000 and a cuMemGetInfo with device 0's, creates
 * a context on device 1 (current once created) and allocates 3000, clears the current context
 * and allocates 4000 (device unknown), then frees all four. The switch to device 0 goes through
 * cuCtxSetCurrent found by dlsym(dlopen("libcuda.so.1"), ...), as a runtime would find it.
 * Exit 3 when a call fails.
 * Build: cc devices.c -o devices -L<dir> -l:libcuda.so.1 -Wl,-rpath,<dir> -ldl
 */
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>

#include "../cuda_driver.h"

static void ok(CUresult r) {
    if (r != 0) exit(3);
}

int main(void) {
    void *c0 = NULL, *c1 = NULL, *c2 = NULL;
    CUdeviceptr p[4] = {0, 0, 0, 0};
    size_t free_bytes = 0, total = 0;
    ok(cuInit(0));
    ok(cuDevicePrimaryCtxRetain(&c0, 0));
    ok(cuDevicePrimaryCtxRetain(&c2, 2));
    ok(cuCtxSetCurrent(c2));
    ok(cuMemAlloc_v2(&p[0], 1000));
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) return 3;
    CUresult (*set_current)(void *) = (CUresult (*)(void *))dlsym(lib, "cuCtxSetCurrent");
    if (!set_current) return 3;
    ok(set_current(c0));
    ok(cuMemAlloc_v2(&p[1], 2000));
    ok(cuMemGetInfo_v2(&free_bytes, &total));
    ok(cuCtxCreate_v2(&c1, 0, 1));
    ok(cuMemAlloc_v2(&p[2], 3000));
    ok(cuCtxSetCurrent(NULL));
    ok(cuMemAlloc_v2(&p[3], 4000));
    for (int i = 0; i < 4; i++) ok(cuMemFree_v2(p[i]));
    return 0;
}
