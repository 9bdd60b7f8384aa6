# CUDA C sources of fastgnn, shipped as package data (fastgnn.kernels_cuda) and
# compiled lazily at first use by fastgnn.backends.cuda.loader.
