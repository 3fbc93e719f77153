// ops/cuda/probe/cudnn_probe.cpp — trident_cudnn_probe [B T NH HS]: loads cuDNN as trident does
// (libcudnn.so.9 or TRIDENT_CUDNN_LIBRARY), builds the causal bf16 attention graphs of
// cudnn_attention.cpp for that shape (default 8 1024 12 64, GPT-2 small) and prints each step,
// ending with the first failing call and cuDNN's message; then the graphs of the bf16-I/O
// entry points (CudaOps::attention_forward_bf16: the caller's bf16 tensors on GPT's fused
// qkv strides, "ok   forward bf16 fused qkv", "ok   backward bf16 fused qkv"). Without a GPU it
// gets as far as cuDNN goes without a handle. Exit status 0 when both plans of the packed
// graphs were made (what CudaOps::attention_forward uses), 1 otherwise.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "../cudnn_attention.hpp"

int main(int argc, char** argv) {
  int shape[4] = {8, 1024, 12, 64};
  if (argc != 1 && argc != 5) {
    std::fprintf(stderr, "usage: trident_cudnn_probe [B T NH HS]\n");
    return 2;
  }
  for (int i = 1; i < argc; i++) shape[i - 1] = std::atoi(argv[i]);
  const std::string report =
      trident::ops::cuda::CudnnAttention::probe(shape[0], shape[1], shape[2], shape[3]);
  std::fputs(report.c_str(), stdout);
  const bool both = report.find("ok   forward\n") != std::string::npos &&
                    report.find("ok   backward\n") != std::string::npos;
  return both ? 0 : 1;
}
