// emulate/shim: the CUDA runtime header, as far as the kernels need it.
#pragma once
#include "emu.hpp"
