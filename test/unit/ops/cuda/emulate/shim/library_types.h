// emulate/shim/library_types.h — what the real cuDNN headers (cudnn_graph.h, which train.sh
// lets cudnn_attention.cpp include so that the stand-in runs the real loader and fallback)
// need beyond the runtime shim: libraryPropertyType, and cudaGraph_t (cudnnBackend*CudaGraph).
// The real library_types.h would redefine cublas_v2.h's cudaDataType here.
#pragma once

typedef enum libraryPropertyType_t { MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL } libraryPropertyType;
typedef struct CUgraph_st* cudaGraph_t;
