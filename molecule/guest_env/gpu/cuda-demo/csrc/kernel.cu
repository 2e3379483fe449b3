#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

__global__ void add_one_kernel(float *x, int64_t n) {
    int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i < n) {
        x[i] += 1.0f;
    }
}

void add_one(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat && x.is_contiguous(), "a contiguous CUDA float tensor");
    int64_t n = x.numel();
    int threads = 256;
    int blocks = static_cast<int>((n + threads - 1) / threads);
    add_one_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}
