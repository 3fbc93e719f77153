// emulate/shim/cuda_runtime.h — the CUDA runtime header: the API (cuda_runtime_api.h) and the
// device side the kernels need (emu.hpp).
#pragma once
#include "cuda_runtime_api.h"
#include "emu.hpp"
