/* A free in one thread while another thread allocates: thread A frees an allocation through a
 * cuMemFree_v2 that the fake driver makes slow (run with FAKE_CUDA_FREE_DELAY_US, e.g. 600000),
 * and the main thread allocates 300 ms after A said it was about to call it, so during the call.
 * The shim stamps a free when its call starts: the recording has A's free before the main
 * thread's allocation. Build like stress.c (with -lpthread).
 */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <time.h>

#include "../cuda_driver.h"

static unsigned long long first;
static int freeing;

static void *freer(void *arg) {
    (void)arg;
    __atomic_store_n(&freeing, 1, __ATOMIC_RELEASE);
    if (cuMemFree_v2(first) != 0) exit(4);
    return NULL;
}

int main(void) {
    unsigned long long second = 0;
    if (cuMemAlloc_v2(&first, 256) != 0) return 3;
    pthread_t t;
    if (pthread_create(&t, NULL, freer, NULL) != 0) return 3;
    while (!__atomic_load_n(&freeing, __ATOMIC_ACQUIRE)) {
    }
    struct timespec wait = {0, 300 * 1000 * 1000};
    nanosleep(&wait, NULL);
    if (cuMemAlloc_v2(&second, 512) != 0) return 3;
    pthread_join(t, NULL);
    return 0;
}
