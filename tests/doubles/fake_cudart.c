/*
 * A stand-in for the CUDA runtime, so the device-memory watch (properties/src/device_watch.cpp) is tested on machines
 * without a GPU. The tests point KVCHECK_CUDART at this library; the fake DEVICE plugin (fake_device_cache.c) opens
 * the same file and "allocates device memory" through fake_cuda_malloc, which only moves a process-wide counter.
 *
 * What it imitates of a real device: memory is handed out in 2 MiB pages (each allocation rounds up to whole pages
 * here; a real driver packs small allocations into shared pages, so real growth is smaller than this, never larger),
 * and the first runtime call creates a context that takes 512 MiB, charged to whoever calls first (the harness must
 * read before the plugin's create, or the context would count as the cache's). FAKE_CUDA_NO_DEVICE=1 makes every
 * call fail as a machine with a driver and no GPU does (cudaErrorNoDevice, 100).
 *
 * One device for several processes: a real device's free memory is global, so a process that never loads the plugin
 * (the case process grading a plugin served by `kvcheck serve-plugin`) still sees what the plugin allocates. With
 * FAKE_CUDA_STATE naming a file, the counter lives there (mapped shared; every process that uses the fake with the same
 * file shares it), each process still creating its own context. What a process took stays counted after it ends
 * (a driver would give it back; here it only moves the baseline of later readings, and 141 GiB outlast any test's
 * processes). Without it the counter is the process's own.
 */
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define FAKE_EXPORT __attribute__((visibility("default")))

enum { kSuccess = 0, kErrorMemoryAllocation = 2, kErrorNoDevice = 100 };

static const size_t kTotal = (size_t)141 << 30;       /* an H200's 141 GiB */
static const size_t kContextBytes = (size_t)512 << 20; /* what creating the context takes */
static const size_t kPage = (size_t)2 << 20;
static size_t g_local;          /* the counter without FAKE_CUDA_STATE */
static size_t* g_used = &g_local; /* bytes in use on the device: g_local, or the shared file's first word */
static int g_context;
static int g_attached;

/* Points g_used at the shared counter when FAKE_CUDA_STATE names a file (created zeroed if absent). */
static void attach(void) {
    const char* path = getenv("FAKE_CUDA_STATE");
    int fd;
    void* m;
    if (g_attached) return;
    g_attached = 1;
    if (path == NULL || *path == '\0') return;
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return;
    if (ftruncate(fd, (off_t)sizeof(size_t)) == 0) {
        m = mmap(NULL, sizeof(size_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m != MAP_FAILED) g_used = (size_t*)m;
    }
    close(fd);
}

static void take(size_t bytes) { __atomic_add_fetch(g_used, bytes, __ATOMIC_SEQ_CST); }
static void give_back(size_t bytes) { __atomic_sub_fetch(g_used, bytes, __ATOMIC_SEQ_CST); }

static size_t used_now(void) { return __atomic_load_n(g_used, __ATOMIC_SEQ_CST); }

static int no_device(void) {
    const char* e = getenv("FAKE_CUDA_NO_DEVICE");
    return e != NULL && *e != '\0' && strcmp(e, "0") != 0;
}

static void ensure_context(void) {
    attach();
    if (g_context) return;
    g_context = 1;
    take(kContextBytes);
}

FAKE_EXPORT int cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
FAKE_EXPORT const char* cudaGetErrorString(int error);
FAKE_EXPORT void* fake_cuda_malloc(size_t bytes);
FAKE_EXPORT void fake_cuda_free(void* p);
FAKE_EXPORT size_t fake_cuda_used(void);

int cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    if (no_device()) return kErrorNoDevice;
    ensure_context();
    *free_bytes = kTotal - used_now();
    *total_bytes = kTotal;
    return kSuccess;
}

const char* cudaGetErrorString(int error) {
    switch (error) {
    case kSuccess: return "no error";
    case kErrorMemoryAllocation: return "out of memory";
    case kErrorNoDevice: return "no CUDA-capable device is detected";
    }
    return "unrecognized error code";
}

/* A handle to `bytes` of "device memory" (its size, kept on the host); NULL when the device is full or absent. */
void* fake_cuda_malloc(size_t bytes) {
    const size_t taken = (bytes + kPage - 1) / kPage * kPage;
    size_t* h;
    if (no_device()) return NULL;
    ensure_context();
    if (taken > kTotal - used_now()) return NULL;
    h = (size_t*)malloc(sizeof *h);
    if (h == NULL) return NULL;
    *h = taken;
    take(taken);
    return h;
}

void fake_cuda_free(void* p) {
    size_t* h = (size_t*)p;
    if (h == NULL) return;
    give_back(*h);
    free(h);
}

size_t fake_cuda_used(void) {
    attach();
    return used_now();
}
