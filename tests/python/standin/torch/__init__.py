"""A stand-in for the few PyTorch entry points memprof uses, for tests on machines without
PyTorch or a GPU. `torch.cuda.standin_alloc` / `standin_free` play a tensor's allocation and
release; the snapshot they produce has PyTorch's layout (segments, blocks, device traces), and
the functions memprof calls have PyTorch's signatures: `torch.cuda.memory._record_memory_history`,
`_snapshot`, `_dump_snapshot`, `torch.cuda.memory_stats`, and
`torch._C._cuda_attach_out_of_memory_observer`. `torch.cuda.is_available()` is true when
STANDIN_CUDA=1; CUDA is initialized (`torch.cuda.is_initialized()`) by `torch.cuda.init()` or the
first allocation, as in PyTorch."""

__version__ = "2.5.0+standin"

from . import _C  # noqa: F401,E402
from . import cuda  # noqa: F401,E402
