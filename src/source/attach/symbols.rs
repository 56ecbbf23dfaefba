//! Where a function of a running process lives: the ELF file that a /proc/PID/maps line names,
//! its dynamic symbol table, and the address it is loaded at. memprof resolves the few functions
//! the injector calls itself, so gdb never loads a symbol table while the job is stopped (PyTorch
//! maps libraries of gigabytes; reading theirs would stop the job for seconds).

use object::read::elf::{ElfFile64, FileHeader, ProgramHeader};
use object::{Endianness, Object, ObjectSymbol};
use std::path::{Path, PathBuf};

/// One mapping of a file: `(start address, file offset, path)`, from a /proc/PID/maps line.
fn mapping(line: &str) -> Option<(u64, u64, &str)> {
    let mut fields = line.split_whitespace();
    let range = fields.next()?;
    let _perms = fields.next()?;
    let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let _device = fields.next()?;
    let _inode = fields.next()?;
    let path = fields.next()?;
    let start = u64::from_str_radix(range.split('-').next()?, 16).ok()?;
    path.starts_with('/').then_some((start, offset, path))
}

/// The first mapped file whose name `wanted` accepts, and where its file offset 0 is mapped.
pub fn find_file(maps: &str, wanted: impl Fn(&str) -> bool) -> Option<(&str, u64)> {
    maps.lines()
        .filter_map(mapping)
        .find(|&(_, offset, path)| offset == 0 && wanted(path.rsplit('/').next().unwrap_or(path)))
        .map(|(start, _, path)| (path, start))
}

/// The addresses, in the process, of `names` in the ELF file `data` whose offset 0 is mapped at
/// `start`. Err names the first one missing.
pub fn resolve(data: &[u8], start: u64, names: &[&str]) -> Result<Vec<u64>, String> {
    let file = ElfFile64::<Endianness>::parse(data).map_err(|e| format!("not ELF ({e})"))?;
    let endian = file.endian();
    // The virtual address the file's offset 0 is loaded at, in the file's own terms.
    let base = file
        .elf_header()
        .program_headers(endian, data)
        .map_err(|e| format!("no program headers ({e})"))?
        .iter()
        .find(|p| p.p_type(endian) == object::elf::PT_LOAD && p.p_offset(endian) == 0)
        .map(|p| p.p_vaddr(endian))
        .ok_or("no loadable segment at offset 0")?;
    let bias = start.wrapping_sub(base);
    names
        .iter()
        .map(|name| {
            file.dynamic_symbols()
                .find(|s| s.name() == Ok(name) && s.is_definition())
                .map(|s| bias.wrapping_add(s.address()))
                .ok_or_else(|| format!("no symbol {name}"))
        })
        .collect()
}

/// The addresses in process `pid` of the functions the injector calls: `Py_AddPendingCall` and
/// `PyRun_SimpleString` (from libpython, or the executable when Python is linked into it) and
/// libc's `mmap`. Files are read through /proc/PID/root, so a job in a container resolves too.
pub struct Functions {
    pub add_pending_call: u64,
    pub run_simple_string: u64,
    pub mmap: u64,
}

impl Functions {
    pub fn of(pid: u32) -> Result<Functions, String> {
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        let maps = std::fs::read_to_string(proc_dir.join("maps"))
            .map_err(|e| format!("cannot read /proc/{pid}/maps ({e})"))?;
        let exe = std::fs::read_link(proc_dir.join("exe"))
            .map_err(|e| format!("cannot read /proc/{pid}/exe ({e})"))?;
        let exe_name = exe.file_name().map(|n| n.to_string_lossy().into_owned());
        let python = find_file(&maps, |name| name.starts_with("libpython"))
            .or_else(|| find_file(&maps, |name| Some(name) == exe_name.as_deref()))
            .ok_or("cannot find Python's code in its memory map")?;
        let libc = find_file(&maps, |name| {
            name.starts_with("libc.so") || name.starts_with("libc-") || name.starts_with("ld-musl")
        })
        .ok_or("cannot find libc in its memory map")?;
        let read = |(path, start): (&str, u64)| -> Result<(Vec<u8>, u64), String> {
            let inside = proc_dir.join("root").join(path.trim_start_matches('/'));
            let data = std::fs::read(&inside)
                .or_else(|_| std::fs::read(Path::new(path)))
                .map_err(|e| format!("cannot read {path} ({e})"))?;
            Ok((data, start))
        };
        let (data, start) = read(python)?;
        let py = resolve(&data, start, &["Py_AddPendingCall", "PyRun_SimpleString"])
            .map_err(|e| format!("{}: {e}", python.0))?;
        let (data, start) = read(libc)?;
        let c = resolve(&data, start, &["mmap"]).map_err(|e| format!("{}: {e}", libc.0))?;
        Ok(Functions {
            add_pending_call: py[0],
            run_simple_string: py[1],
            mmap: c[0],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_mapping_at_offset_zero() {
        let maps = "\
55d0-55e0 r--p 00000000 08:01 7 /usr/bin/python3.11
7f10-7f20 r-xp 00028000 08:01 9 /usr/lib/x86_64-linux-gnu/libc.so.6
7f00-7f10 r--p 00000000 08:01 9 /usr/lib/x86_64-linux-gnu/libc.so.6
7f30-7f40 rw-p 00000000 00:00 0 
7f50-7f60 r--p 00000000 08:01 3 [vdso]
";
        assert_eq!(
            find_file(maps, |n| n.starts_with("libc.so")),
            Some(("/usr/lib/x86_64-linux-gnu/libc.so.6", 0x7f00))
        );
        assert_eq!(
            find_file(maps, |n| n == "python3.11"),
            Some(("/usr/bin/python3.11", 0x55d0))
        );
        assert_eq!(find_file(maps, |n| n.starts_with("libpython")), None);
    }

    /// This test process's own libc: the address resolved from the file and its mapping is
    /// where the dynamic linker put `mmap`.
    #[test]
    fn resolves_a_function_where_the_dynamic_linker_put_it() {
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let Some((path, start)) = find_file(&maps, |n| n.starts_with("libc.so")) else {
            eprintln!("SKIPPED: resolves_a_function: this test binary maps no libc.so");
            return;
        };
        let data = std::fs::read(path).expect("libc");
        let found = resolve(&data, start, &["mmap", "getpid"]).expect("resolved");
        assert_eq!(found[0], libc::mmap as *const () as u64);
        assert_eq!(found[1], libc::getpid as *const () as u64);
        assert_eq!(
            resolve(&data, start, &["no_such_function_here"]),
            Err("no symbol no_such_function_here".to_owned())
        );
    }
}
