/* Reaches the CUDA driver's memory calls the ways real programs do, and prints one line per call
 * with what the call returned, so a test can compare a recording with what the program saw:
 *
 *   <via> <kind> <ptr> <size> <stream> <aux> <result>     (numbers in decimal)
 *
 * via: "sym"   - linked against libcuda.so.1, calls by symbol (18 calls);
 *      "gpa"   - pointers from cuGetProcAddress / cuGetProcAddress_v2 reached by symbol;
 *      "dlsym" - dlopen("libcuda.so.1") + dlsym(handle, "cuGetProcAddress_v2"), as libcudart does.
 * Then THREADS threads each do PAIRS cuMemAlloc_v2/cuMemFree_v2 pairs of 256 bytes (not printed).
 * With ALLOC_FREE_FORK=N, N forked children, one after the other, each make CHILD_PAIRS
 * cuMemAlloc_v2/cuMemFree_v2 pairs of 12345 bytes and call exit(); with ALLOC_FREE_BUSY also set,
 * a parent thread makes pairs of 256 bytes all the while (it may be inside the shim at each fork)
 * and "busy <pairs>" is printed once the children are done. After each child "child <pid>" is
 * printed; with ALLOC_FREE_SOCKETS=<dir> (where the shim puts its live sockets) also
 * "sockets <child's> <parent's>": whether each process's socket file exists then (1) or not (0),
 * and each child checks that its own socket exists before it exits. With ALLOC_FREE_FORKERS=K
 * (instead of BUSY), K threads each fork N children, all K at the same time (a barrier before
 * each round); with ALLOC_FREE_CHILD_PAIRS=M each child makes M pairs instead of CHILD_PAIRS.
 * With ALLOC_FREE_FORK_FIRST set, one more child is forked (and "child <pid>" printed) before the
 * first CUDA call. With ALLOC_FREE_CHILD_EXEC set, each child, after its pairs, execs this program
 * again (without ALLOC_FREE_FORK*, so the new image makes the main thread's and the workers'
 * calls and no child) instead of calling exit().
 *
 * With ALLOC_FREE_WRITER_MASK set, after the workers it prints "writer_sigblk <hex>": the SigBlk
 * line of /proc/self/task/<tid>/status of the thread named memprof-writer (the shim's writer).
 *
 * Expects FAKE_CUDA_CAPACITY=1048576 so that the 2 MiB request fails with out-of-memory.
 * Build: cc alloc_free.c -o alloc_free -L<dir> -l:libcuda.so.1 -Wl,-rpath,<dir> -ldl -lpthread
 */
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../cuda_driver.h"

#define THREADS 4
#define PAIRS 2000
#define CHILD_PAIRS 3

static void line(const char *via, const char *kind, unsigned long long ptr, unsigned long long size,
                 unsigned long long stream, unsigned long long aux, int result) {
    printf("%s %s %llu %llu %llu %llu %d\n", via, kind, ptr, size, stream, aux, result);
}

static void *must(gpa2_fn gpa, const char *name, int version, unsigned long long flags) {
    void *fn = NULL;
    int status = -1;
    if (gpa(name, &fn, version, flags, &status) != 0 || status != 0 || !fn) {
        fprintf(stderr, "lookup of %s failed\n", name);
        exit(3);
    }
    return fn;
}

/* One alloc + free through the given functions. */
static void pair(const char *via, alloc_fn alloc, free_fn release, size_t size) {
    CUdeviceptr p = 0;
    int r = alloc(&p, size);
    line(via, "alloc", p, size, 0, 0, r);
    r = release(p);
    line(via, "free", p, 0, 0, 0, r);
}

static void *worker(void *arg) {
    (void)arg;
    for (int i = 0; i < PAIRS; i++) {
        CUdeviceptr p = 0;
        if (cuMemAlloc_v2(&p, 256) != 0 || cuMemFree_v2(p) != 0) {
            fprintf(stderr, "thread alloc/free failed\n");
            exit(4);
        }
    }
    return NULL;
}

static volatile int busy_stop;

/* Pairs of 256 bytes until told to stop; returns how many. */
static void *busy(void *arg) {
    long *pairs = arg;
    while (!busy_stop) {
        CUdeviceptr p = 0;
        if (cuMemAlloc_v2(&p, 256) != 0 || cuMemFree_v2(p) != 0) {
            fprintf(stderr, "busy alloc/free failed\n");
            exit(4);
        }
        ++*pairs;
    }
    return NULL;
}

/* A forked child: CHILD_PAIRS (or ALLOC_FREE_CHILD_PAIRS) pairs of 12345 bytes, then exit()
 * (atexit handlers run). With ALLOC_FREE_SOCKETS set, it exits with 9 if its own socket is not
 * there by then. */
static void forked_child(void) {
    /* Another thread of the parent may have been printing when this one forked: its line, still
     * in the copy of stdout's buffer, is the parent's to print, not this child's at exit(). */
    __fpurge(stdout);
    const char *pairs_env = getenv("ALLOC_FREE_CHILD_PAIRS");
    int pairs = pairs_env ? atoi(pairs_env) : CHILD_PAIRS;
    for (int i = 0; i < pairs; i++) {
        CUdeviceptr p = 0;
        if (cuMemAlloc_v2(&p, 12345) != 0 || cuMemFree_v2(p) != 0) exit(8);
    }
    if (getenv("ALLOC_FREE_CHILD_EXEC")) {
        unsetenv("ALLOC_FREE_CHILD_EXEC");
        unsetenv("ALLOC_FREE_FORK");
        unsetenv("ALLOC_FREE_FORKERS");
        unsetenv("ALLOC_FREE_FORK_FIRST");
        char *const args[] = {"alloc_free", NULL};
        execv("/proc/self/exe", args);
        _exit(11);
    }
    const char *sockets = getenv("ALLOC_FREE_SOCKETS");
    if (sockets) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%d.sock", sockets, (int)getpid());
        if (access(path, F_OK) != 0) exit(9);
    }
    exit(0);
}

static int forks_each;
static pthread_barrier_t fork_round;

/* One of ALLOC_FREE_FORKERS threads: forks_each children, each fork at the same time as the other
 * threads' (the barrier); returns non-NULL when a child failed. */
static void *forker(void *arg) {
    for (int i = 0; i < forks_each; i++) {
        pthread_barrier_wait(&fork_round);
        pid_t child = fork();
        if (child == 0) forked_child();
        int status = 0;
        if (child < 0 || waitpid(child, &status, 0) != child || status != 0) return arg;
        printf("child %d\n", (int)child);
    }
    return NULL;
}

/* Prints the signal mask of the thread named memprof-writer; 1 once printed, else 0. */
static int print_writer_mask_once(void) {
    DIR *tasks = opendir("/proc/self/task");
    struct dirent *task;
    char path[512], line[256];
    while (tasks && (task = readdir(tasks))) {
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", task->d_name);
        FILE *comm = fopen(path, "r");
        if (!comm) continue;
        int writer = fgets(line, sizeof line, comm) && !strcmp(line, "memprof-writer\n");
        fclose(comm);
        if (!writer) continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/status", task->d_name);
        FILE *status = fopen(path, "r");
        while (status && fgets(line, sizeof line, status)) {
            if (!strncmp(line, "SigBlk:", 7)) printf("writer_sigblk %s", line + 7 + strspn(line + 7, "\t "));
        }
        if (status) fclose(status);
        closedir(tasks);
        return 1;
    }
    if (tasks) closedir(tasks);
    return 0;
}

/* The writer names itself once it first runs, which on a busy machine can come after every
 * call above: look for up to 10 s, then print "writer_sigblk none". */
static void print_writer_mask(void) {
    for (int tries = 0; tries < 1000; tries++) {
        if (print_writer_mask_once()) return;
        usleep(10000);
    }
    printf("writer_sigblk none\n");
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (getenv("ALLOC_FREE_FORK_FIRST")) {
        pid_t child = fork();
        if (child == 0) forked_child();
        int status = 0;
        if (child < 0 || waitpid(child, &status, 0) != child || status != 0) return 7;
        printf("child %d\n", (int)child);
    }
    if (cuInit(0) != 0) return 2;

    /* By symbol. */
    CUdeviceptr a = 0, big = 0, c = 0;
    int r = cuMemAlloc_v2(&a, 4096);
    line("sym", "alloc", a, 4096, 0, 0, r);
    r = cuMemAlloc_v2(&big, 2u << 20);
    line("sym", "alloc", big, 2u << 20, 0, 0, r);
    size_t free_bytes = 0, total = 0;
    r = cuMemGetInfo_v2(&free_bytes, &total);
    line("sym", "mem_get_info", 0, total, 0, free_bytes, r);
    r = cuMemFree_v2(a);
    line("sym", "free", a, 0, 0, 0, r);
    CUstream stream = (CUstream)0x1234;
    r = cuMemAllocAsync(&c, 8192, stream);
    line("sym", "alloc_async", c, 8192, 0x1234, 0, r);
    r = cuMemFreeAsync(c, stream);
    line("sym", "free_async", c, 0, 0x1234, 0, r);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = 1;
    prop.location.type = 1;
    prop.location.id = 3;
    CUmemGenericAllocationHandle h = 0;
    r = cuMemCreate(&h, 65536, &prop, 0);
    line("sym", "vmm_create", 0, 65536, 0, h, r);
    CUdeviceptr va = 0x7e0000000000ULL;
    r = cuMemMap(va, 65536, 0, h, 0);
    line("sym", "vmm_map", va, 65536, 0, h, r);
    r = cuMemUnmap(va, 65536);
    line("sym", "vmm_unmap", va, 65536, 0, 0, r);
    r = cuMemRelease(h);
    line("sym", "vmm_release", 0, 0, 0, h, r);
    size_t pitch = 0;
    r = cuMemAllocPitch_v2(&c, &pitch, 1000, 4, 4);
    line("sym", "alloc_pitch", c, pitch * 4, 0, pitch, r);
    r = cuMemFree_v2(c);
    line("sym", "free", c, 0, 0, 0, r);
    r = cuMemAllocManaged(&c, 2048, 1);
    line("sym", "alloc_managed", c, 2048, 0, 1, r);
    r = cuMemFree_v2(c);
    line("sym", "free", c, 0, 0, 0, r);
    r = cuMemAllocFromPoolAsync(&c, 1536, (void *)0x42, stream);
    line("sym", "alloc_from_pool", c, 1536, 0x1234, 0x42, r);
    r = cuMemFreeAsync(c, stream);
    line("sym", "free_async", c, 0, 0x1234, 0, r);
    r = cuMemAddressReserve(&va, 1ULL << 30, 0, 0, 0);
    line("sym", "address_reserve", va, 1ULL << 30, 0, 0, r);
    r = cuMemAddressFree(va, 1ULL << 30);
    line("sym", "address_free", va, 1ULL << 30, 0, 0, r);
    /* Pinned host memory. */
    void *host = NULL;
    r = cuMemHostAlloc(&host, 4096, 1);
    line("sym", "host_alloc", (unsigned long long)host, 4096, 0, 1, r);
    r = cuMemFreeHost(host);
    line("sym", "host_free", (unsigned long long)host, 0, 0, 0, r);
    r = cuMemAllocHost_v2(&host, 1000);
    line("sym", "host_alloc", (unsigned long long)host, 1000, 0, 0, r);
    r = cuMemHostRegister_v2(host, 1000, 2);
    line("sym", "host_register", (unsigned long long)host, 1000, 0, 2, r);
    r = cuMemHostUnregister(host);
    line("sym", "host_unregister", (unsigned long long)host, 0, 0, 0, r);
    r = cuMemFreeHost(host);
    line("sym", "host_free", (unsigned long long)host, 0, 0, 0, r);

    /* Through cuGetProcAddress_v2 reached by symbol, as the runtime would once it holds it. */
    gpa2_fn gpa2 = (gpa2_fn)must(cuGetProcAddress_v2, "cuGetProcAddress", 12000, 0);
    pair("gpa", (alloc_fn)must(gpa2, "cuMemAlloc", 12000, 0),
         (free_fn)must(gpa2, "cuMemFree", 12000, 0), 1024);
    alloc_async_fn alloc_ptsz = (alloc_async_fn)must(gpa2, "cuMemAllocAsync", 12000, 2);
    free_async_fn free_ptsz = (free_async_fn)must(gpa2, "cuMemFreeAsync", 12000, 2);
    r = alloc_ptsz(&c, 2048, (CUstream)0x99);
    line("gpa", "alloc_async", c, 2048, 0x99, 0, r);
    r = free_ptsz(c, (CUstream)0x99);
    line("gpa", "free_async", c, 0, 0x99, 0, r);
    /* The 4-argument lookup. */
    void *fn = NULL;
    if (cuGetProcAddress("cuMemAlloc", &fn, 3020, 0) != 0) return 5;
    alloc_fn alloc1 = (alloc_fn)fn;
    if (cuGetProcAddress("cuMemFree", &fn, 3020, 0) != 0) return 5;
    pair("gpa", alloc1, (free_fn)fn, 512);
    /* Pinned host memory through the lookup, as libcudart reaches it. */
    CUresult (*host_alloc)(void **, size_t, unsigned int) =
        (CUresult(*)(void **, size_t, unsigned int))must(gpa2, "cuMemHostAlloc", 12000, 0);
    CUresult (*host_free)(void *) = (CUresult(*)(void *))must(gpa2, "cuMemFreeHost", 12000, 0);
    CUresult (*host_register)(void *, size_t, unsigned int) =
        (CUresult(*)(void *, size_t, unsigned int))must(gpa2, "cuMemHostRegister", 12000, 0);
    CUresult (*host_unregister)(void *) =
        (CUresult(*)(void *))must(gpa2, "cuMemHostUnregister", 12000, 0);
    void *pinned = NULL;
    r = host_alloc(&pinned, 256, 0);
    line("gpa", "host_alloc", (unsigned long long)pinned, 256, 0, 0, r);
    r = host_register(pinned, 256, 1);
    line("gpa", "host_register", (unsigned long long)pinned, 256, 0, 1, r);
    r = host_unregister(pinned);
    line("gpa", "host_unregister", (unsigned long long)pinned, 0, 0, 0, r);
    r = host_free(pinned);
    line("gpa", "host_free", (unsigned long long)pinned, 0, 0, 0, r);

    /* As libcudart does: a handle-scoped dlsym, which LD_PRELOAD alone does not see. */
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) return 6;
    gpa2_fn dl_gpa2 = (gpa2_fn)dlsym(lib, "cuGetProcAddress_v2");
    if (!dl_gpa2) return 6;
    pair("dlsym", (alloc_fn)must(dl_gpa2, "cuMemAlloc", 12000, 0),
         (free_fn)must(dl_gpa2, "cuMemFree", 12000, 0), 3000);

    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&threads[i], NULL, worker, NULL);
    for (int i = 0; i < THREADS; i++) pthread_join(threads[i], NULL);
    printf("threads %d %d\n", THREADS, PAIRS);
    if (getenv("ALLOC_FREE_WRITER_MASK")) print_writer_mask();

    const char *forks = getenv("ALLOC_FREE_FORK");
    const char *forkers_env = getenv("ALLOC_FREE_FORKERS");
    if (forks && forkers_env) {
        int forkers = atoi(forkers_env);
        if (forkers < 1 || forkers > 16) return 7;
        forks_each = atoi(forks);
        pthread_barrier_init(&fork_round, NULL, (unsigned)forkers);
        pthread_t threads[16];
        for (int i = 0; i < forkers; i++) pthread_create(&threads[i], NULL, forker, &fork_round);
        int failed = 0;
        for (int i = 0; i < forkers; i++) {
            void *result = NULL;
            pthread_join(threads[i], &result);
            failed |= result != NULL;
        }
        if (failed) return 7;
    } else if (forks) {
        long busy_pairs = 0;
        pthread_t busy_thread;
        int busy_on = getenv("ALLOC_FREE_BUSY") != NULL;
        if (busy_on) pthread_create(&busy_thread, NULL, busy, &busy_pairs);
        for (int i = 0; i < atoi(forks); i++) {
            pid_t child = fork();
            if (child == 0) forked_child();
            int status = 0;
            if (child < 0 || waitpid(child, &status, 0) != child || status != 0) return 7;
            printf("child %d\n", (int)child);
            const char *sockets = getenv("ALLOC_FREE_SOCKETS");
            if (sockets) {
                char path[2][4096];
                snprintf(path[0], sizeof path[0], "%s/%d.sock", sockets, (int)child);
                snprintf(path[1], sizeof path[1], "%s/%d.sock", sockets, (int)getpid());
                printf("sockets %d %d\n", access(path[0], F_OK) == 0, access(path[1], F_OK) == 0);
            }
        }
        if (busy_on) {
            busy_stop = 1;
            pthread_join(busy_thread, NULL);
            printf("busy %ld\n", busy_pairs);
        }
    }
    return 0;
}
