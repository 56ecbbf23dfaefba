// A CUDA program that reaches device memory the ways libraries other than PyTorch do, for the
// GPU check (scripts/gpu-check.sh): cudaMalloc, cudaMallocAsync on a stream (the async pool),
// cudaMallocManaged, and a request larger than the device (an OOM). Prints one line per call
// with what it returned, then the bytes it held at its peak.
#include <cstdio>
#include <cuda_runtime.h>

int main() {
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    void *a = nullptr, *b = nullptr, *c = nullptr, *huge = nullptr;
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    printf("cudaMalloc %d\n", (int)cudaMalloc(&a, 64 << 20));
    printf("cudaMallocAsync %d\n", (int)cudaMallocAsync(&b, 32 << 20, stream));
    cudaStreamSynchronize(stream);
    printf("cudaMallocManaged %d\n", (int)cudaMallocManaged(&c, 16 << 20));
    cudaError_t oom = cudaMalloc(&huge, total + (1ull << 30));
    printf("cudaMalloc(total + 1 GiB) %d (out of memory expected)\n", (int)oom);
    cudaGetLastError();
    printf("peak bytes %llu\n", (unsigned long long)((64ull + 32 + 16) << 20));
    cudaFreeAsync(b, stream);
    cudaStreamSynchronize(stream);
    cudaFree(a);
    cudaFree(c);
    cudaStreamDestroy(stream);
    return 0;
}
