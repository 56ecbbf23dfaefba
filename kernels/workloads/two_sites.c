/* Allocates device memory from two named functions, so a recording's call stacks can be checked:
 *
 *   load_weights()    3 x cuMemAlloc_v2(300000)   left alive
 *   make_workspace()  2 x cuMemAlloc_v2(100000)   left alive
 *   scratch()         1 x cuMemAlloc_v2(50000)    freed again
 *
 * With an argument, it then dlopen()s that library (kernels/workloads/plugin.c) and calls its
 * plugin_alloc(), which allocates 70000 bytes, left alive: code loaded after recording started.
 *
 * Build with frame pointers and debug information, and without sibling calls (which would
 * remove the callers' frames):
 *   cc -O1 -g -fno-omit-frame-pointer -fno-optimize-sibling-calls two_sites.c -o two_sites \
 *      -L<dir> -l:libcuda.so.1 -Wl,-rpath,<dir> -ldl
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "../cuda_driver.h"

static void check(CUresult rc, const char *what) {
    if (rc != 0) {
        fprintf(stderr, "%s failed: %d\n", what, rc);
        exit(1);
    }
}

__attribute__((noinline)) static CUdeviceptr load_weights(size_t size) {
    CUdeviceptr p = 0;
    check(cuMemAlloc_v2(&p, size), "load_weights");
    return p;
}

__attribute__((noinline)) static CUdeviceptr make_workspace(size_t size) {
    CUdeviceptr p = 0;
    check(cuMemAlloc_v2(&p, size), "make_workspace");
    return p;
}

__attribute__((noinline)) static void scratch(void) {
    CUdeviceptr p = 0;
    check(cuMemAlloc_v2(&p, 50000), "scratch");
    check(cuMemFree_v2(p), "scratch free");
}

/* Loop counts the compiler cannot see, so it does not unroll the loops into distinct call sites. */
static volatile int weights = 3, workspaces = 2;

int main(int argc, char **argv) {
    check(cuInit(0), "cuInit");
    for (int i = 0; i < weights; i++)
        load_weights(300000);
    for (int i = 0; i < workspaces; i++)
        make_workspace(100000);
    scratch();
    if (argc > 1) {
        void *plugin = dlopen(argv[1], RTLD_NOW);
        if (!plugin) {
            fprintf(stderr, "dlopen: %s\n", dlerror());
            return 1;
        }
        CUresult (*plugin_alloc)(void) = (CUresult (*)(void))dlsym(plugin, "plugin_alloc");
        if (!plugin_alloc) {
            fprintf(stderr, "no plugin_alloc\n");
            return 1;
        }
        check(plugin_alloc(), "plugin_alloc");
    }
    return 0;
}
