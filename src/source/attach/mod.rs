//! Attaching to a running Python job that was not started under memprof: find its Python
//! (`target`), queue a small bootstrap in it (`gdb` for Python 3.8-3.13, `remote_debug` for 3.14
//! and later, the addresses from `symbols`), and talk to the agent it starts (`agent.py`) over a
//! socket in a folder only the job's user can open (`session`). The agent reports PyTorch's own
//! allocator figures and snapshots, and puts the job back as it was on detach.

pub mod feed;
pub mod figures;
pub mod gdb;
pub mod remote_debug;
pub mod session;
pub mod symbols;
pub mod target;
