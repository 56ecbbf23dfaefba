/* The workload of scripts/try-without-gpu.sh: a made-up training job on the fake driver that
 * runs out of memory, so a newcomer sees a recording with named call sites and an OOM.
 *
 *   load_weights()     4 x cuMemAlloc_v2(64 MiB)      left alive
 *   each step:
 *     forward()        3 x cuMemAlloc_v2(32 MiB)      activations, freed by backward(); each
 *                      after a cuMemGetInfo_v2, so the recording knows the free memory then
 *     keep_history()   1 x cuMemAlloc_v2(16 MiB)      never freed: grows every step
 *
 * With FAKE_CUDA_CAPACITY=536870912 (512 MiB) the weights take 256 MiB, each step 96 MiB of
 * activations on top of the history, and the third activation of step 12 does not fit
 * (256 + 11 x 16 + 3 x 32 = 528 MiB): the program prints where it stopped and exits 1, as a
 * training job that died would.
 *
 * Build with frame pointers and debug information, and without sibling calls, so each
 * allocating function keeps a frame and `memprof analyze` names it with file and line:
 *   cc -O1 -g -fno-omit-frame-pointer -fno-optimize-sibling-calls try_train.c -o try_train \
 *      -L<dir> -l:libcuda.so.1 -Wl,-rpath,<dir>
 */
#include <stdio.h>
#include <stdlib.h>

#include "../cuda_driver.h"

#define MIB (1024ULL * 1024ULL)
#define STEPS 20

static void check(CUresult rc, const char *what) {
    if (rc != 0) {
        fprintf(stderr, "%s failed: %d\n", what, rc);
        exit(2);
    }
}

__attribute__((noinline)) static CUdeviceptr load_weights(void) {
    CUdeviceptr p = 0;
    check(cuMemAlloc_v2(&p, 64 * MIB), "load_weights");
    return p;
}

/* Allocates one activation; returns CUDA's result so the caller can stop on an OOM, and the
 * free memory just before the allocation in *free_bytes. */
__attribute__((noinline)) static CUresult forward(CUdeviceptr *p, size_t *free_bytes) {
    size_t total = 0;
    check(cuMemGetInfo_v2(free_bytes, &total), "cuMemGetInfo_v2");
    return cuMemAlloc_v2(p, 32 * MIB);
}

__attribute__((noinline)) static void backward(CUdeviceptr *acts, int n) {
    for (int i = 0; i < n; i++)
        check(cuMemFree_v2(acts[i]), "backward");
}

/* The bug the demo is about: a buffer kept from every step and never freed. */
__attribute__((noinline)) static void keep_history(void) {
    CUdeviceptr p = 0;
    check(cuMemAlloc_v2(&p, 16 * MIB), "keep_history");
}

/* Counts the compiler cannot see, so it does not unroll the loops into distinct call sites. */
static volatile int weights = 4, layers = 3;

int main(void) {
    check(cuInit(0), "cuInit");
    for (int i = 0; i < weights; i++)
        load_weights();
    for (int step = 1; step <= STEPS; step++) {
        CUdeviceptr acts[8];
        for (int l = 0; l < layers; l++) {
            size_t free_bytes = 0;
            if (forward(&acts[l], &free_bytes) != 0) {
                printf("step %d: out of memory in forward (32 MiB asked for, %zu MiB free)\n",
                       step, (size_t)(free_bytes / MIB));
                return 1;
            }
        }
        backward(acts, layers);
        keep_history();
        printf("step %d done\n", step);
    }
    return 0;
}
