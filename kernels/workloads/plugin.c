/* A library two_sites.c loads with dlopen after recording started: plugin_alloc() allocates
 * 70000 bytes of device memory and leaves them alive.
 * Build: cc -O1 -g -fno-omit-frame-pointer -fno-optimize-sibling-calls -shared -fPIC plugin.c \
 *        -o libplugin.so -L<dir> -l:libcuda.so.1
 */
#include "../cuda_driver.h"

__attribute__((noinline)) static CUresult plugin_buffer(CUdeviceptr *p) {
    CUresult rc = cuMemAlloc_v2(p, 70000);
    return rc == 0 ? 0 : rc;
}

CUresult plugin_alloc(void) {
    CUdeviceptr p = 0;
    CUresult rc = plugin_buffer(&p);
    return rc == 0 ? 0 : rc;
}
