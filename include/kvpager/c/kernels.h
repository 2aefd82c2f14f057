#ifndef KVPAGER_C_KERNELS_H
#define KVPAGER_C_KERNELS_H
/**
 * \file
 * C ABI of libkvpager_kernels (loadable from Python ctypes). Every function returns 0 on success or a
 * non-zero KVPAGER_STATUS_* code; none throws, none aborts on bad input.
 */

#include <stdint.h>

#if defined(_WIN32)
#define KVPAGER_C_API __declspec(dllexport)
#else
#define KVPAGER_C_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/** Status codes of the C ABI. */
enum {
  KVPAGER_STATUS_OK = 0,
  KVPAGER_STATUS_INVALID_ARGUMENT = 1, /**< a null pointer, or a size or count out of range */
  KVPAGER_STATUS_NO_DEVICE = 2,        /**< CUDA not built in, no driver, or no device */
};

/** Library version as major * 10000 + minor * 100 + patch. */
KVPAGER_C_API int32_t kvpager_version(void);

/** 1 if the library was built with the CUDA kernels, 0 otherwise. */
KVPAGER_C_API int32_t kvpager_built_with_cuda(void);

/**
 * Number of usable CUDA devices in *count. Returns KVPAGER_STATUS_NO_DEVICE (and *count = 0) when CUDA is not
 * built in or the runtime reports any error (no driver, no device), KVPAGER_STATUS_INVALID_ARGUMENT for a null
 * pointer.
 */
KVPAGER_C_API int32_t kvpager_cuda_device_count(int32_t* count);

#ifdef __cplusplus
}
#endif

#endif /* KVPAGER_C_KERNELS_H */
