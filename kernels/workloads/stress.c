/* THREADS threads (argv[1], at most 256) start together and each make PAIRS (argv[2])
 * cuMemAlloc_v2/cuMemFree_v2 pairs of 256 bytes, as fast as they can, through the linked driver:
 * checks that a recording accounts for every event under load. Build like alloc_free.c (with
 * -lpthread).
 */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "../cuda_driver.h"

static long pairs;
/* All threads start together, so they all hold a buffer (or find none left) at once. */
static pthread_barrier_t start;

static void *worker(void *arg) {
    (void)arg;
    pthread_barrier_wait(&start);
    for (long i = 0; i < pairs; i++) {
        unsigned long long p = 0;
        if (cuMemAlloc_v2(&p, 256) != 0 || cuMemFree_v2(p) != 0) {
            fprintf(stderr, "alloc/free failed\n");
            exit(4);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    int threads = atoi(argv[1]);
    pairs = atol(argv[2]);
    if (threads < 1 || threads > 256 || pairs < 1) return 2;
    pthread_t t[256];
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, NULL);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    return 0;
}
