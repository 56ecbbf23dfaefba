/* A program whose device memory is held by a library playing NCCL (kernels/fake_nccl), for the
 * live split by library (tests/agent.rs, tests/attach_shim.rs):
 *
 *   fakeNcclCommInit: two 8 MiB device buffers and 3 MiB of pinned host memory (libfakenccl.so)
 *   cuMemAlloc 1 MiB from main (the program itself)
 *   prints "ready", waits for a line on stdin
 *   fakeNcclShrink: one 8 MiB buffer freed; prints "shrunk", waits for a line, returns
 *
 * Every call must succeed (exit 3 otherwise). Build with frame pointers, as libfakenccl.so:
 *   cc -fno-omit-frame-pointer nccl_hold.c -o nccl_hold -L<dir> -l:libcuda.so.1 -lfakenccl \
 *      -Wl,-rpath,<dir>
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "../cuda_driver.h"

int fakeNcclCommInit(int count, size_t bytes, size_t host);
int fakeNcclShrink(void);

#define MIB ((size_t)1 << 20)

static void ok(int r) {
    if (r != 0) exit(3);
}

static void wait_line(const char *say) {
    char line[16];
    printf("%s\n", say);
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) exit(4);
}

int main(void) {
    CUdeviceptr own = 0;
    ok(cuInit(0));
    ok(fakeNcclCommInit(2, 8 * MIB, 3 * MIB));
    ok(cuMemAlloc_v2(&own, MIB));
    wait_line("ready");
    ok(fakeNcclShrink());
    wait_line("shrunk");
    return 0;
}
