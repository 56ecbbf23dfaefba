/* A library playing NCCL for the ledger test (tests/ledger.rs): it asks the CUDA driver for
 * device buffers and pinned host memory, as NCCL's communicators and proxies do, so that the
 * ledger can name it as the library holding memory outside PyTorch.
 *
 *   cc -shared -fPIC -fno-omit-frame-pointer -o libfakenccl.so fake_nccl.c \
 *      -L<dir> -l:libcuda.so.1 -Wl,-rpath,<dir>
 *
 * Built with frame pointers, so that the shim's stack walk finds its frames. */
#include <stddef.h>

#include "../cuda_driver.h"

static CUdeviceptr buffers[8];
static int buffer_count;
static void *proxy;

/* Allocates `count` device buffers of `bytes` each and `host` bytes of pinned host memory;
 * returns 0 or the first failing CUresult. */
int fakeNcclCommInit(int count, size_t bytes, size_t host) {
    for (int i = 0; i < count && buffer_count < 8; i++) {
        CUresult r = cuMemAlloc_v2(&buffers[buffer_count], bytes);
        if (r != 0) return (int)r;
        buffer_count++;
    }
    return (int)cuMemHostAlloc(&proxy, host, 0);
}

/* Frees the last device buffer, as a communicator shrinking its buffers would. */
int fakeNcclShrink(void) {
    if (buffer_count == 0) return 1;
    buffer_count--;
    return (int)cuMemFree_v2(buffers[buffer_count]);
}
