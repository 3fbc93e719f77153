// trident/ops/cuda.hpp — host-callable entry points of the CUDA backend (ops/cuda): device
// discovery and selection, the backend's factory (whose memory() is the rank's one device
// arena, a trident::DeviceMemory) and copies between host and device ordered on a CUDA Ops
// object's stream. Only built when TRIDENT_CUDA is on. No CUDA header is needed to include
// this one.
// defines: trident::ops::cuda_device_count, cuda_select_device, make_cuda_ops,
//          cuda_default_arena_bytes, cuda_upload, cuda_download, cuda_synchronize
//
// Streams: a CUDA Ops object owns one stream; every op it runs is queued there, in call
// order, and returns before the GPU has finished (sum_squares, which returns a number, waits).
// Host code reads results through ops.memory()->to_host or cuda_download (or after
// cuda_synchronize). A fault inside a kernel is reported by the next call that waits.
#pragma once

#include <cstddef>
#include <memory>

#include "trident/ops/ops.hpp"

namespace trident::ops {

// Number of CUDA devices visible to this process (0 when none or no driver).
int cuda_device_count();

// Makes device (local_rank % cuda_device_count()) current for the calling thread and returns
// it. local_rank is the rank within this node (the caller computes it, e.g. with
// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)). When local_size (the ranks on this node; 0 =
// unknown) exceeds the devices, ranks share GPUs: allowed, with a warning. An Error when no
// device is visible or local_rank < 0.
int cuda_select_device(int local_rank, int local_size = 0);

// The CUDA backend on the calling thread's current device. Every pointer it is given must be
// device memory of that device, including the token and target arrays: in practice blocks of
// its memory() (Buffer<T>(n, ops->memory())). memory() is ONE cudaMalloc made here, of
// arena_bytes, or when 0 of cuda_default_arena_bytes(ranks_per_device); the backend takes its
// own blocks from it too (cuBLAS workspace, and op scratch that grows in the first step to what
// the largest op needs), so leave some room besides the model. No other device memory is
// allocated afterwards; never managed memory. An Error naming the sizes when the arena cannot
// be allocated or is full; an Error when no device is visible. The Ops object must outlive
// every Buffer made from its memory() (destroying it frees the whole arena).
std::unique_ptr<Ops> make_cuda_ops(Precision precision = Precision::fp32,
                                   std::size_t arena_bytes = 0, int ranks_per_device = 1);

// The arena make_cuda_ops takes when asked for 0 bytes, on the current device as it is now:
// 85% of the GPU's memory divided by ranks_per_device (clamped to >= 1: the ranks of this node
// sharing the GPU), and at most 90% of what cudaMemGetInfo says is free now. Ranks sharing a
// GPU build their arenas one after another; sizing from the total keeps their shares equal.
std::size_t cuda_default_arena_bytes(int ranks_per_device = 1);

// Copies of `bytes` between host and device memory, queued on the stream of `ops` (which must
// be a CUDA Ops) after everything queued before; both return when the copy is complete, so
// the host buffer may be reused or read at once.
void cuda_upload(Ops& ops, void* device_dst, const void* host_src, std::size_t bytes);
void cuda_download(Ops& ops, void* host_dst, const void* device_src, std::size_t bytes);
// Waits for everything queued on the stream of `ops`; a kernel fault becomes an Error here.
void cuda_synchronize(Ops& ops);

}  // namespace trident::ops
