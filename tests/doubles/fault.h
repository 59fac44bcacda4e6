/* A real memory fault, the way a buggy cache crashes, for the doubles in C and C++: a store to a page mapped without
 * access. Not through a null pointer: the compiler may delete a path it proves undefined, and UBSan
 * (tools/sanitize.sh) would report the null store and exit with status 1 first; the harness must see the signal
 * itself, in every build. */
#pragma once

#include <signal.h>
#include <sys/mman.h>

__attribute__((unused)) static void kvc_double_fault(void) {
    void* page = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) raise(SIGSEGV);
    *(volatile int*)page = 1;
}
