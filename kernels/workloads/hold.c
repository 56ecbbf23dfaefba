/* Holds many allocations while a client attaches: makes N (argv[1]) cuMemAlloc_v2 calls of 4096
 * bytes, prints "ready", waits for a line on stdin, frees them all and exits. A live client that
 * connects while it waits must see all N alive in its first sample. Build like peak_oom.c.
 */
#include <stdio.h>
#include <stdlib.h>

#include "../cuda_driver.h"

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 0;
    if (n <= 0) return 2;
    CUdeviceptr *held = calloc((size_t)n, sizeof *held);
    if (!held) return 3;
    if (cuInit(0) != 0) return 3;
    for (long i = 0; i < n; i++) {
        if (cuMemAlloc_v2(&held[i], 4096) != 0) return 3;
    }
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 4;
    for (long i = 0; i < n; i++) {
        if (cuMemFree_v2(held[i]) != 0) return 3;
    }
    free(held);
    return 0;
}
