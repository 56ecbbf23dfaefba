/* Another LD_PRELOAD interposer of cuMemAlloc_v2, the classic way: it finds the next definition
 * with dlsym(RTLD_NEXT, ...). With memprof's shim (which exports dlsym) loaded before or after
 * it, RTLD_NEXT must still resolve relative to this library, or the call would recurse.
 * Prints how many calls it saw at exit.
 *
 * Build: cc -shared -fPIC -o libother_preload.so other_preload.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>

typedef int (*alloc_fn)(unsigned long long *, size_t);

static alloc_fn next_alloc;
static int calls;

int cuMemAlloc_v2(unsigned long long *dptr, size_t size) {
    alloc_fn next = __atomic_load_n(&next_alloc, __ATOMIC_ACQUIRE);
    if (!next) {
        next = (alloc_fn)dlsym(RTLD_NEXT, "cuMemAlloc_v2");
        if (!next || next == cuMemAlloc_v2) return 999;
        __atomic_store_n(&next_alloc, next, __ATOMIC_RELEASE);
    }
    __atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED);
    return next(dptr, size);
}

__attribute__((destructor)) static void report(void) {
    fprintf(stderr, "other_preload: %d cuMemAlloc_v2 calls\n", calls);
}
