// emulate/shim/cuda_runtime_api.h — the CUDA runtime API as far as trident's src/ops/cuda
// calls it, on the CPU (runtime.cpp). One emulated device, "emulated GPU (trident CPU shim)",
// of TRIDENT_EMU_GPU_MIB MiB (default 4096) per process. Device memory is host memory
// (mmap), tracked so that copies, memsets, cuBLAS and (with TRIDENT_EMU_DEVICE_POINTERS)
// kernel launches can check that a pointer said to be on the device is; the first
// TRIDENT_EMU_POISON_MIB MiB (default 128) of each cudaMalloc and all of each cudaHostAlloc
// are filled with 0xff bytes (NaN floats) so that reads of memory nobody wrote show up.
// Everything is synchronous: streams and events are handles and nothing more, an "async"
// copy is complete on return. Not modelled: several devices, memory shared between the
// processes of one GPU (each process has the whole device to itself), sticky errors, host
// code touching device memory (it works here; the "cpu-guarded" device checks that).
#pragma once

#include <cstddef>

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
#define cudaHostAllocDefault 0x00u
#define cudaStreamDefault 0x00u
#define cudaStreamNonBlocking 0x01u

struct CUstream_st;
struct CUevent_st;
using cudaStream_t = CUstream_st*;
using cudaEvent_t = CUevent_st*;

// The fields a program is likely to read, with an H100-like shape.
struct cudaDeviceProp {
  char name[256];
  std::size_t totalGlobalMem;
  std::size_t sharedMemPerBlock;
  int regsPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int multiProcessorCount;
  int major;
  int minor;
};

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaMemGetInfo(std::size_t* free, std::size_t* total);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorName(cudaError_t error);
const char* cudaGetErrorString(cudaError_t error);

cudaError_t cudaMalloc(void** p, std::size_t bytes);
cudaError_t cudaFree(void* p);
cudaError_t cudaHostAlloc(void** p, std::size_t bytes, unsigned flags);
cudaError_t cudaMallocHost(void** p, std::size_t bytes);
cudaError_t cudaFreeHost(void* p);

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* p, int value, std::size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaMemcpy2DAsync(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                              std::size_t width, std::size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream);
cudaError_t cudaMemset2DAsync(void* p, std::size_t pitch, int value, std::size_t width,
                              std::size_t height, cudaStream_t stream = nullptr);

cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaEventCreate(cudaEvent_t* event);
#define cudaEventDefault 0x00u
#define cudaEventDisableTiming 0x02u
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
// Every event has completed (nothing runs asynchronously here): cudaSuccess, never NotReady.
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
// Milliseconds between the two records (host clock readings here).
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);

// Stream capture and graphs (trident's runtime.cuda_graphs). While a thread captures a stream
// (any mode is taken as thread-local: trident's), what it queues there (kernel launches from
// that thread, async copies and memsets, cuBLAS and cuBLASLt calls on a handle bound to the
// stream, event records) is recorded, not run: arguments by value, host scalars (alpha,
// beta) and cuBLASLt descriptors as they are at the call, as a GPU bakes them in. The calls
// CUDA refuses during a capture (cudaMalloc, cudaFree, cudaHostAlloc/cudaMallocHost,
// cudaFreeHost, cudaMemcpy, cudaMemset, cudaStreamSynchronize, cudaEventSynchronize,
// cudaEventQuery, cudaDeviceSynchronize, async copies to or from pageable host memory or on
// the legacy stream, a graph launch) return cudaErrorStreamCaptureUnsupported and
// invalidate the capture: cudaStreamEndCapture then returns
// cudaErrorStreamCaptureInvalidated and no graph. A launch of the instantiated graph replays
// the records in order; one that fails then stops the program (a faulting graph).
// Knob (read at each call), for the callers' fallbacks: TRIDENT_EMU_CAPTURE_FAIL = begin
// (cudaStreamBeginCapture refuses), end (cudaStreamEndCapture finds the capture invalidated),
// instantiate (cudaGraphInstantiateWithFlags refuses), cublas (cuBLAS and cuBLASLt calls
// during a capture return CUBLAS_STATUS_NOT_SUPPORTED and invalidate it).
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
struct CUgraph_st;
struct CUgraphExec_st;
using cudaGraph_t = CUgraph_st*;
using cudaGraphExec_t = CUgraphExec_st*;
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status);
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* exec, cudaGraph_t graph,
                                          unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
