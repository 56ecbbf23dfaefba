/* Loads the library argv[1] with dlopen(RTLD_NOW | RTLD_LOCAL), the way Python loads extension
 * modules, and calls its local_calls() (see local_driver.c); prints "result N" and exits 0 when
 * N is 0. Not linked against the driver: it reaches the driver only through the library.
 * Build: cc -O1 load_local.c -o load_local -ldl
 */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 3;
    }
    int (*calls)(void) = (int (*)(void))dlsym(lib, "local_calls");
    if (!calls) return 3;
    int result = calls();
    printf("result %d\n", result);
    return result == 0 ? 0 : 1;
}
