/* A stand-in for libcudart, for testing libcclz_nccl's CUDA path on a
 * machine without a GPU: cudaMalloc hands out "device memory" that the host
 * cannot touch (a PROT_NONE view of a memfd), so any host access to it by
 * cclz faults at once, while the stand-in NCCL (nccl.c) and cudaMemcpy reach
 * the same pages through a second, writable view. cudaPointerGetAttributes
 * tells such pointers from host memory as the real runtime does.
 *
 * Only what libcclz_nccl and the fallback test call is here. */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "standin.h"

struct region {
  char* dev;    /* the address handed out: PROT_NONE */
  char* view;   /* the same pages, readable and writable */
  size_t size;  /* mapped bytes (whole pages) */
};

enum { kMaxRegions = 256 };
static struct region g_regions[kMaxRegions];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static const struct region* find(const void* p) {
  const char* c = (const char*)p;
  for (int i = 0; i < kMaxRegions; ++i) {
    if (g_regions[i].dev != NULL && c >= g_regions[i].dev && c < g_regions[i].dev + g_regions[i].size) return &g_regions[i];
  }
  return NULL;
}

void* cclz_standin_view(const void* p) {
  pthread_mutex_lock(&g_mu);
  const struct region* r = find(p);
  void* v = r != NULL ? r->view + ((const char*)p - r->dev) : NULL;
  pthread_mutex_unlock(&g_mu);
  return v;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == NULL) return cudaErrorInvalidValue;
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (ptr == NULL) return cudaErrorInvalidValue;
  *ptr = NULL;
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  const size_t pages = (size + page - 1) / page, bytes = (pages == 0 ? 1 : pages) * page;
  const int fd = memfd_create("cclz-standin-device", MFD_CLOEXEC);
  if (fd < 0) return cudaErrorMemoryAllocation;
  cudaError_t err = cudaErrorMemoryAllocation;
  if (ftruncate(fd, (off_t)bytes) == 0) {
    void* dev = mmap(NULL, bytes, PROT_NONE, MAP_SHARED, fd, 0);
    void* view = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    pthread_mutex_lock(&g_mu);
    int slot = -1;
    for (int i = 0; i < kMaxRegions && slot < 0; ++i) {
      if (g_regions[i].dev == NULL) slot = i;
    }
    if (dev != MAP_FAILED && view != MAP_FAILED && slot >= 0) {
      g_regions[slot] = (struct region){(char*)dev, (char*)view, bytes};
      *ptr = dev;
      err = cudaSuccess;
    } else {
      if (dev != MAP_FAILED) munmap(dev, bytes);
      if (view != MAP_FAILED) munmap(view, bytes);
    }
    pthread_mutex_unlock(&g_mu);
  }
  close(fd);
  return err;
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == NULL) return cudaSuccess;
  pthread_mutex_lock(&g_mu);
  struct region* r = (struct region*)find(ptr);
  cudaError_t err = cudaErrorInvalidValue;
  if (r != NULL && r->dev == (char*)ptr) {
    munmap(r->dev, r->size);
    munmap(r->view, r->size);
    memset(r, 0, sizeof *r);
    err = cudaSuccess;
  }
  pthread_mutex_unlock(&g_mu);
  return err;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  (void)kind; /* as with cudaMemcpyDefault: the pointers say where they live */
  void* d = cclz_standin_view(dst);
  const void* s = cclz_standin_view(src);
  if (count > 0) memmove(d != NULL ? d : dst, s != NULL ? s : src, count);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attributes, const void* ptr) {
  if (attributes == NULL) return cudaErrorInvalidValue;
  memset(attributes, 0, sizeof *attributes);
  if (cclz_standin_view(ptr) != NULL) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->device = 0;
    attributes->devicePointer = (void*)ptr;
  } else {
    attributes->type = cudaMemoryTypeUnregistered; /* what CUDA 11+ says of plain host memory */
    attributes->device = -2;
  }
  return cudaSuccess;
}
