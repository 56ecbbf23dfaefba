/* A small driver-level program with a known peak and one out-of-memory failure, for the
 * recording reader's tests (tests/recording.rs holds the figures it must give):
 *
 *   a = alloc 100000; b = alloc 300000; free a; c = alloc 200000      live 500000
 *   cuMemGetInfo                                                       free = capacity - 500000
 *   alloc 600000 -> CUDA_ERROR_OUT_OF_MEMORY (with capacity 1048576)
 *   two 65536-byte handles mapped side by side, one cuMemUnmap of both, released
 *   a 32768-byte handle mapped and left mapped; free b                 live c + the mapping
 *
 * Every memory call must succeed but the failing one (exit 3 otherwise). With the argument
 * "_exit" it ends with _exit(0), "_Exit" with _Exit(0), else by returning from main. With "wait"
 * it stops after the cuMemGetInfo (b and c alive), prints "ready" and waits for a line on stdin,
 * so a client can connect to a preloaded shim's live socket in the middle of the run.
 * Expects FAKE_CUDA_CAPACITY=1048576.
 * Build: cc peak_oom.c -o peak_oom -L<dir> -l:libcuda.so.1 -Wl,-rpath,<dir>
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../cuda_driver.h"

static void ok(CUresult r) {
    if (r != 0) exit(3);
}

static CUmemGenericAllocationHandle create(size_t size) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = 1;
    prop.location.type = 1;
    prop.location.id = 0;
    CUmemGenericAllocationHandle h = 0;
    ok(cuMemCreate(&h, size, &prop, 0));
    return h;
}

int main(int argc, char **argv) {
    ok(cuInit(0));
    size_t free_bytes = 0, total = 0;
    CUdeviceptr a = 0, b = 0, c = 0, d = 0;
    ok(cuMemAlloc_v2(&a, 100000));
    ok(cuMemAlloc_v2(&b, 300000));
    ok(cuMemFree_v2(a));
    ok(cuMemAlloc_v2(&c, 200000));
    ok(cuMemGetInfo_v2(&free_bytes, &total));
    if (argc > 1 && strcmp(argv[1], "wait") == 0) {
        char line[16];
        printf("ready\n");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin)) return 4;
    }
    if (cuMemAlloc_v2(&d, 600000) != 2) return 3;

    CUdeviceptr va = 0x7e0000000000ULL;
    CUmemGenericAllocationHandle h1 = create(65536), h2 = create(65536);
    ok(cuMemMap(va, 65536, 0, h1, 0));
    ok(cuMemMap(va + 65536, 65536, 0, h2, 0));
    ok(cuMemUnmap(va, 131072));
    ok(cuMemRelease(h1));
    ok(cuMemRelease(h2));
    CUmemGenericAllocationHandle h3 = create(32768);
    ok(cuMemMap(0x7f0000000000ULL, 32768, 0, h3, 0));
    ok(cuMemFree_v2(b));

    if (argc > 1 && strcmp(argv[1], "_exit") == 0) _exit(0);
    if (argc > 1 && strcmp(argv[1], "_Exit") == 0) _Exit(0);
    return 0;
}
