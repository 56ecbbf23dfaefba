"""A stand-in for the few PyTorch entry points memprof_gpu uses, for tests on machines without
PyTorch or a GPU. `torch.cuda.standin_alloc` / `standin_free` play a tensor's allocation and
release; the snapshot they produce has PyTorch's layout (segments, blocks, device traces).
CUDA is available when STANDIN_CUDA=1."""

from . import cuda  # noqa: F401
