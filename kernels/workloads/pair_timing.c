/* Times cuMemAlloc_v2 + cuMemFree_v2 pairs of 256 bytes in one thread: 1000 pairs to warm up
 * (the shim opens its file and starts its writer on the first call), then PAIRS (argv[1]) pairs
 * timed with CLOCK_MONOTONIC. Prints the mean nanoseconds per pair. For
 * benches/shim_overhead.sh, which runs it with and without the shim.
 * Build: cc -O2 pair_timing.c -o pair_timing -L<dir> -l:libcuda.so.1 -Wl,-rpath,<dir>
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../cuda_driver.h"

static void pair(void) {
    unsigned long long p = 0;
    if (cuMemAlloc_v2(&p, 256) != 0 || cuMemFree_v2(p) != 0) {
        fprintf(stderr, "alloc/free failed\n");
        exit(4);
    }
}

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    long pairs = atol(argv[1]);
    if (pairs <= 0) return 2;
    for (int i = 0; i < 1000; i++) pair();
    double start = now_ns();
    for (long i = 0; i < pairs; i++) pair();
    printf("%.1f\n", (now_ns() - start) / (double)pairs);
    return 0;
}
