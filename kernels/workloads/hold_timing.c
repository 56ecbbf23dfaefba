/* Holds N (argv[1]) address reservations of 4096 bytes (cuMemAddressReserve: the fake driver
 * tracks at most 4096 live allocations, but any number of reservations; the shim's live state
 * holds either alike), prints "ready", then for SECONDS (argv[2]) times
 * every call of a cuMemAlloc_v2 + cuMemFree_v2 loop (256 bytes, a pair about every 20 us, so
 * the recording stays small) and samples its resident memory.
 * Prints "max_ns=M calls=C rss_start_kb=S rss_max_kb=R": the slowest single call, how many were
 * made, and the resident set at the start of the loop and its largest sample. For
 * benches/live_socket_stall.sh, which hits the shim's live socket while this runs.
 * Build: cc -O2 hold_timing.c -o hold_timing -L<dir> -l:libcuda.so.1 -Wl,-rpath,<dir>
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../cuda_driver.h"

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long rss_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "VmRSS:", 6)) kb = atol(line + 6);
    }
    fclose(f);
    return kb;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    long n = atol(argv[1]);
    double seconds = atof(argv[2]);
    if (n <= 0 || seconds <= 0) return 2;
    CUdeviceptr *held = calloc((size_t)n, sizeof *held);
    if (!held) return 3;
    for (long i = 0; i < n; i++) {
        if (cuMemAddressReserve(&held[i], 4096, 0, 0, 0) != 0) return 3;
    }
    long rss_start = rss_kb(), rss_max = rss_start;
    printf("ready\n");
    fflush(stdout);
    long long end = now_ns() + (long long)(seconds * 1e9), worst = 0;
    long calls = 0;
    while (1) {
        CUdeviceptr p = 0;
        long long t0 = now_ns();
        if (cuMemAlloc_v2(&p, 256) != 0) return 3;
        long long t1 = now_ns();
        if (cuMemFree_v2(p) != 0) return 3;
        long long t2 = now_ns();
        if (t1 - t0 > worst) worst = t1 - t0;
        if (t2 - t1 > worst) worst = t2 - t1;
        calls += 2;
        struct timespec pause = {0, 20000};
        nanosleep(&pause, NULL);
        if ((calls & 511) == 0) {
            long rss = rss_kb();
            if (rss > rss_max) rss_max = rss;
            if (t2 > end) break;
        }
    }
    printf("max_ns=%lld calls=%ld rss_start_kb=%ld rss_max_kb=%ld\n", worst, calls, rss_start,
           rss_max);
    for (long i = 0; i < n; i++) cuMemAddressFree(held[i], 4096);
    free(held);
    return 0;
}
