// The cuBLAS, cuBLASLt and cuDNN functions lockstep calls, each as dyn::<name> resolved on first
// use (lockstep/ops/dynload.hpp). A new call site adds its function here; calling the library's own
// symbol instead fails to link, since the libraries are not linked.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cudnn.h>

#include "lockstep/ops/dynload.hpp"

// cuBLAS
LOCKSTEP_DYN(Cublas, cublasCreate)
LOCKSTEP_DYN(Cublas, cublasDestroy)
LOCKSTEP_DYN(Cublas, cublasSetStream)
LOCKSTEP_DYN(Cublas, cublasSetMathMode)
LOCKSTEP_DYN(Cublas, cublasSgemm)
LOCKSTEP_DYN_AS(Cublas, cublasGemmEx,
                cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                   int, const void*, const void*, cudaDataType, int, const void*,
                                   cudaDataType, int, const void*, void*, cudaDataType, int,
                                   cublasComputeType_t, cublasGemmAlgo_t))
LOCKSTEP_DYN(Cublas, cublasGetStatusName)
LOCKSTEP_DYN(Cublas, cublasGetStatusString)

// cuBLASLt
LOCKSTEP_DYN(CublasLt, cublasLtCreate)
LOCKSTEP_DYN(CublasLt, cublasLtDestroy)
LOCKSTEP_DYN(CublasLt, cublasLtMatmul)
LOCKSTEP_DYN(CublasLt, cublasLtMatmulAlgoGetHeuristic)
LOCKSTEP_DYN(CublasLt, cublasLtMatmulDescCreate)
LOCKSTEP_DYN(CublasLt, cublasLtMatmulDescDestroy)
LOCKSTEP_DYN(CublasLt, cublasLtMatmulDescSetAttribute)
LOCKSTEP_DYN(CublasLt, cublasLtMatmulPreferenceCreate)
LOCKSTEP_DYN(CublasLt, cublasLtMatmulPreferenceDestroy)
LOCKSTEP_DYN(CublasLt, cublasLtMatmulPreferenceSetAttribute)
LOCKSTEP_DYN(CublasLt, cublasLtMatrixLayoutCreate)
LOCKSTEP_DYN(CublasLt, cublasLtMatrixLayoutDestroy)

// cuDNN
LOCKSTEP_DYN(Cudnn, cudnnGetVersion)
LOCKSTEP_DYN(Cudnn, cudnnGetErrorString)
LOCKSTEP_DYN(Cudnn, cudnnCreate)
LOCKSTEP_DYN(Cudnn, cudnnDestroy)
LOCKSTEP_DYN(Cudnn, cudnnSetStream)
LOCKSTEP_DYN(Cudnn, cudnnCreateTensorDescriptor)
LOCKSTEP_DYN(Cudnn, cudnnDestroyTensorDescriptor)
LOCKSTEP_DYN(Cudnn, cudnnSetTensor4dDescriptor)
LOCKSTEP_DYN(Cudnn, cudnnCreateFilterDescriptor)
LOCKSTEP_DYN(Cudnn, cudnnDestroyFilterDescriptor)
LOCKSTEP_DYN(Cudnn, cudnnSetFilter4dDescriptor)
LOCKSTEP_DYN(Cudnn, cudnnCreateConvolutionDescriptor)
LOCKSTEP_DYN(Cudnn, cudnnDestroyConvolutionDescriptor)
LOCKSTEP_DYN(Cudnn, cudnnSetConvolution2dDescriptor)
LOCKSTEP_DYN(Cudnn, cudnnSetConvolutionMathType)
LOCKSTEP_DYN(Cudnn, cudnnFindConvolutionForwardAlgorithm)
LOCKSTEP_DYN(Cudnn, cudnnFindConvolutionBackwardDataAlgorithm)
LOCKSTEP_DYN(Cudnn, cudnnFindConvolutionBackwardFilterAlgorithm)
LOCKSTEP_DYN(Cudnn, cudnnConvolutionForward)
LOCKSTEP_DYN(Cudnn, cudnnConvolutionBackwardData)
LOCKSTEP_DYN(Cudnn, cudnnConvolutionBackwardFilter)
