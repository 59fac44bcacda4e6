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
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_EXPORT __attribute__((visibility("default")))

enum { kSuccess = 0, kErrorMemoryAllocation = 2, kErrorNoDevice = 100 };

static const size_t kTotal = (size_t)141 << 30;       /* an H200's 141 GiB */
static const size_t kContextBytes = (size_t)512 << 20; /* what creating the context takes */
static const size_t kPage = (size_t)2 << 20;
static size_t g_used;
static int g_context;

static int no_device(void) {
    const char* e = getenv("FAKE_CUDA_NO_DEVICE");
    return e != NULL && *e != '\0' && strcmp(e, "0") != 0;
}

static void ensure_context(void) {
    if (g_context) return;
    g_context = 1;
    g_used += kContextBytes;
}

FAKE_EXPORT int cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
FAKE_EXPORT const char* cudaGetErrorString(int error);
FAKE_EXPORT void* fake_cuda_malloc(size_t bytes);
FAKE_EXPORT void fake_cuda_free(void* p);
FAKE_EXPORT size_t fake_cuda_used(void);

int cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    if (no_device()) return kErrorNoDevice;
    ensure_context();
    *free_bytes = kTotal - g_used;
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
    if (taken > kTotal - g_used) return NULL;
    h = (size_t*)malloc(sizeof *h);
    if (h == NULL) return NULL;
    *h = taken;
    g_used += taken;
    return h;
}

void fake_cuda_free(void* p) {
    size_t* h = (size_t*)p;
    if (h == NULL) return;
    g_used -= *h;
    free(h);
}

size_t fake_cuda_used(void) { return g_used; }
