//! Symbolizing a recording's call stacks: each return address to `function` at `file:line`,
//! through the recorded executable mappings and the ELF files they name (DWARF line tables
//! when present, else the symbol table), falling back to `file+0xOFFSET`.
//!
//! The files are read where the recording is read, so a recording symbolizes fully on the
//! machine that made it, while the binaries are unchanged; a file that is gone, rebuilt or
//! unreadable gives `file+0xOFFSET` frames (the offset stays meaningful for the original file).
//! Frames of inlined functions come first, as the innermost.

use super::debug_info::DebugInfo;
use crate::model::Frame;
use crate::source::open::{self, Opened};
use memprof_wire::Mapping;
use rustc_hash::FxHashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// An ELF file of the recorded process, as far as it could be read.
struct ElfFile {
    loader: Option<DebugInfo>,
    /// `(file offset, file size, virtual address)` of each loadable segment.
    segments: Vec<(u64, u64, u64)>,
}

/// Bytes read from the start of a file to find its program headers.
const HEAD_BYTES: u64 = 64 << 10;

/// `(file offset, file size, virtual address)` of each loadable segment of the 64-bit ELF file
/// whose first bytes are `head`.
fn load_segments(head: &[u8]) -> Option<Vec<(u64, u64, u64)>> {
    use object::read::elf::{FileHeader, ProgramHeader};
    let header = object::elf::FileHeader64::<object::Endianness>::parse(head).ok()?;
    let endian = header.endian().ok()?;
    let segments = header.program_headers(endian, head).ok()?;
    Some(
        segments
            .iter()
            .filter(|p| p.p_type(endian) == object::elf::PT_LOAD)
            .map(|p| (p.p_offset(endian), p.p_filesz(endian), p.p_vaddr(endian)))
            .collect(),
    )
}

impl ElfFile {
    /// Reads what it can of `path`; only a regular file is opened (a recording may name any
    /// path, a device or a pipe included).
    /// The file a mapping names, when it is a regular file (see `source::open`); a file
    /// that cannot be read symbolizes to its name and offset.
    fn open(opened: Option<Opened>) -> ElfFile {
        let Some(opened) = opened else {
            return ElfFile {
                loader: None,
                segments: Vec::new(),
            };
        };
        let mut head = Vec::new();
        let read = std::io::Read::read_to_end(
            &mut std::io::Read::take(&opened.file, HEAD_BYTES),
            &mut head,
        );
        let segments = read
            .ok()
            .and_then(|_| load_segments(&head))
            .unwrap_or_default();
        ElfFile {
            loader: DebugInfo::load(&opened),
            segments,
        }
    }

    fn file_address(&self, at: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|&&(offset, size, _)| offset <= at && at - offset < size)
            .map(|&(offset, _, vaddr)| vaddr + (at - offset))
    }
}

/// Symbolizes addresses of one recording; files are opened once each, however they are spelled.
pub struct Symbolizer<'a> {
    mappings: &'a [Mapping],
    /// Each spelling of a path, to its file in `loaded`.
    files: FxHashMap<&'a [u8], usize>,
    /// Each canonical path opened, to its file in `loaded`.
    canonical: FxHashMap<std::path::PathBuf, usize>,
    loaded: Vec<ElfFile>,
}

/// The last path component, for `file+0xOFFSET` frames.
fn base_name(path: &[u8]) -> String {
    let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    String::from_utf8_lossy(name).into_owned()
}

impl<'a> Symbolizer<'a> {
    pub fn new(mappings: &'a [Mapping]) -> Symbolizer<'a> {
        Symbolizer {
            mappings,
            files: FxHashMap::default(),
            canonical: FxHashMap::default(),
            loaded: Vec::new(),
        }
    }

    /// The frames of return address `addr`, innermost (inlined) first; at least one.
    /// The index in `loaded` of the file `path` names: one already loaded by another
    /// spelling, or newly opened (an empty file when it cannot be).
    fn load(&mut self, path: &Path) -> usize {
        let opened = open::regular(path).ok();
        if let Some(&index) = opened
            .as_ref()
            .and_then(|o| self.canonical.get(&o.canonical))
        {
            return index;
        }
        let canonical = opened.as_ref().map(|o| o.canonical.clone());
        self.loaded.push(ElfFile::open(opened));
        let index = self.loaded.len() - 1;
        if let Some(canonical) = canonical {
            self.canonical.insert(canonical, index);
        }
        index
    }

    /// How many files were opened (each canonical path once), for tests.
    #[cfg(test)]
    fn files_loaded(&self) -> usize {
        self.canonical.len()
    }

    pub fn frames(&mut self, addr: u64) -> Vec<Frame> {
        let unknown = || {
            vec![Frame {
                filename: "??".into(),
                line: 0,
                name: format!("{addr:#x}"),
            }]
        };
        // The latest mapping wins: a library loaded where an unloaded one was.
        let Some(mapping) = self
            .mappings
            .iter()
            .rev()
            .find(|m| m.start <= addr && addr - m.start < m.len)
        else {
            return unknown();
        };
        // A damaged mapping's file offset can put the address past any file.
        let Some(at) = (addr - mapping.start).checked_add(mapping.file_offset) else {
            return unknown();
        };
        let path: &'a [u8] = &mapping.path;
        let index = match self.files.get(path) {
            Some(&index) => index,
            None => {
                let index = self.load(Path::new(OsStr::from_bytes(path)));
                self.files.insert(path, index);
                index
            }
        };
        let file = &self.loaded[index];
        let object_name = String::from_utf8_lossy(path).into_owned();
        let fallback = || Frame {
            filename: object_name.clone(),
            line: 0,
            name: format!("{}+{at:#x}", base_name(path)),
        };
        let (Some(loader), Some(svma)) = (&file.loader, file.file_address(at)) else {
            return vec![fallback()];
        };
        // A return address is just after the call: look up the call itself.
        let probe = svma.saturating_sub(1);
        let mut out = Vec::new();
        if let Ok(mut frames) = loader.find_frames(probe) {
            while let Ok(Some(frame)) = frames.next() {
                let Some(name) = frame.function.as_ref().and_then(|f| f.demangle().ok()) else {
                    continue;
                };
                let location = frame.location.as_ref();
                out.push(Frame {
                    filename: location
                        .and_then(|l| l.file)
                        .map_or_else(|| object_name.clone(), str::to_string),
                    line: location.and_then(|l| l.line).map_or(0, i64::from),
                    name: name.into_owned(),
                });
            }
        }
        if out.is_empty() {
            if let Some(symbol) = loader.find_symbol(probe) {
                let name = addr2line::demangle_auto(symbol.into(), None).into_owned();
                let line = loader.find_location(probe);
                out.push(Frame {
                    filename: (line.as_ref())
                        .and_then(|l| l.file)
                        .map_or_else(|| object_name.clone(), str::to_string),
                    line: line.as_ref().and_then(|l| l.line).map_or(0, i64::from),
                    name,
                });
            }
        }
        if out.is_empty() {
            out.push(fallback());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn a_named_function() -> u64 {
        std::hint::black_box(7)
    }

    /// This test binary's executable mappings, read as the shim reads them.
    fn own_mappings() -> Vec<Mapping> {
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        maps.lines()
            .filter_map(|line| {
                let mut f = line.split_ascii_whitespace();
                let (start, end) = f.next()?.split_once('-')?;
                let perms = f.next()?;
                let offset = f.next()?;
                let path = &line[line.find('/')?..];
                let start = u64::from_str_radix(start, 16).ok()?;
                let end = u64::from_str_radix(end, 16).ok()?;
                let file_offset = u64::from_str_radix(offset, 16).ok()?;
                perms.contains('x').then(|| Mapping {
                    start,
                    len: end - start,
                    file_offset,
                    path: path.as_bytes().to_vec(),
                })
            })
            .collect()
    }

    #[test]
    fn addresses_in_this_binary_name_their_function_file_and_line() {
        assert_eq!(a_named_function(), 7);
        let mappings = own_mappings();
        let mut symbols = Symbolizer::new(&mappings);
        // One byte in: the lookup steps back one byte, as for a return address.
        let addr = a_named_function as fn() -> u64 as usize as u64 + 2;
        let frames = symbols.frames(addr);
        let last = frames.last().expect("a frame");
        assert!(last.name.ends_with("a_named_function"), "{frames:?}");
        assert!(last.filename.ends_with("symbols.rs"), "{frames:?}");
        assert!(last.line > 0, "{frames:?}");
    }

    #[test]
    fn unknown_addresses_and_files_fall_back() {
        let gone = [Mapping {
            start: 0x1000,
            len: 0x1000,
            file_offset: 0x3000,
            path: b"/nonexistent/libgone.so".to_vec(),
        }];
        let mut symbols = Symbolizer::new(&gone);
        assert_eq!(
            symbols.frames(0x1010),
            vec![Frame {
                filename: "/nonexistent/libgone.so".into(),
                line: 0,
                name: "libgone.so+0x3010".into(),
            }]
        );
        assert_eq!(symbols.frames(0x10)[0].name, "0x10");
    }

    /// Builds `liba.so` in `dir` with split DWARF (`-gsplit-dwarf`: its skeleton unit names
    /// `DIR/a.dwo`, which holds the functions), `inner` inlined into `outer`; false without gcc.
    fn split_dwarf_library(dir: &Path) -> bool {
        std::fs::write(
            dir.join("a.c"),
            "extern int sink(int);\n\
             static inline __attribute__((always_inline)) int inner(int x) { return sink(x) * 3; }\n\
             int outer(int x) { return inner(x) + 2; }\n",
        )
        .expect("written");
        let gcc = |args: &[&str]| {
            std::process::Command::new("gcc")
                .args(args)
                .current_dir(dir)
                .status()
                .is_ok_and(|s| s.success())
        };
        gcc(&[
            "-c",
            "-g",
            "-gsplit-dwarf",
            "-O2",
            "-fPIC",
            "a.c",
            "-o",
            "a.o",
        ]) && gcc(&["-shared", "a.o", "-o", "liba.so"])
    }

    /// The frame names at each return address inside `outer` of `lib`, mapped at `start`.
    fn names_in_outer(lib: &Path, start: u64) -> Vec<Vec<String>> {
        use object::{Object, ObjectSymbol};
        let bytes = std::fs::read(lib).expect("built");
        let object = object::File::parse(&bytes[..]).expect("an ELF file");
        let outer = object
            .symbols()
            .find(|s| s.name() == Ok("outer"))
            .expect("outer is defined");
        let segments = load_segments(&bytes).expect("program headers");
        let file_offset = |vaddr: u64| {
            let (offset, _, at) = *segments
                .iter()
                .find(|&&(_, size, at)| at <= vaddr && vaddr - at < size)
                .expect("outer is in a segment");
            offset + (vaddr - at)
        };
        let mapping = [Mapping {
            start,
            len: bytes.len() as u64,
            file_offset: 0,
            path: lib.as_os_str().as_encoded_bytes().to_vec(),
        }];
        let mut symbols = Symbolizer::new(&mapping);
        (0..outer.size())
            .map(|k| {
                let frames = symbols.frames(start + file_offset(outer.address() + k) + 1);
                frames.into_iter().map(|f| f.name).collect()
            })
            .collect()
    }

    #[test]
    fn split_dwarf_is_read_from_the_dwo_the_binary_names_and_a_fifo_there_is_not_opened() {
        let dir = tempfile::tempdir().expect("a scratch folder");
        if !split_dwarf_library(dir.path()) {
            eprintln!("SKIPPED: split_dwarf_is_read_from_the_dwo...: no gcc to build a library");
            return;
        }
        let lib = dir.path().join("liba.so");
        let inlined = |names: &[Vec<String>]| {
            names
                .iter()
                .any(|n| n.len() == 2 && n[0] == "inner" && n[1] == "outer")
        };
        // The inlined function is known only from the .dwo.
        let names = names_in_outer(&lib, 0x7000_0000_0000);
        assert!(inlined(&names), "{names:?}");
        // A FIFO where the .dwo was: opened as the files a recording names are, never
        // waiting for a writer; the symbol table still names the function.
        let dwo = dir.path().join("a.dwo");
        std::fs::remove_file(&dwo).expect("removed");
        let c = std::ffi::CString::new(dwo.as_os_str().as_encoded_bytes()).expect("a path");
        // SAFETY: `c` is a NUL-terminated path that lives across the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(names_in_outer(&lib, 0x7000_0000_0000));
        });
        let names = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("symbolizing does not wait on the FIFO");
        assert!(!inlined(&names), "{names:?}");
        assert!(names.iter().all(|n| n == &["outer"]), "{names:?}");
    }

    #[test]
    fn spellings_of_one_file_load_it_once_and_a_fifo_is_not_opened() {
        let mappings = own_mappings();
        let addr = a_named_function as fn() -> u64 as usize as u64 + 2;
        let own = (mappings.iter())
            .find(|m| m.start <= addr && addr - m.start < m.len)
            .expect("this function is mapped");
        let path = String::from_utf8(own.path.clone()).expect("a UTF-8 path");
        let (dir, name) = path.rsplit_once('/').expect("a folder");
        let dir_tmp = tempfile::tempdir().expect("a scratch folder");
        let fifo = dir_tmp.path().join("trace_pipe");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("a path");
        // SAFETY: `c` is a NUL-terminated path that lives across the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // The same mapping under 50 spellings, each at its own addresses, then a FIFO.
        let span = own.start + own.len;
        let mut respelled: Vec<Mapping> = (0..50u64)
            .map(|i| Mapping {
                start: own.start + (i + 1) * span,
                path: format!("{dir}/{}{name}", "./".repeat(i as usize)).into_bytes(),
                ..own.clone()
            })
            .collect();
        respelled.push(Mapping {
            start: 0x1000,
            len: 0x1000,
            file_offset: 0,
            path: fifo.as_os_str().as_encoded_bytes().to_vec(),
        });
        let mut symbols = Symbolizer::new(&respelled);
        for i in 0..50u64 {
            let frames = symbols.frames(addr + (i + 1) * span);
            let last = frames.last().expect("a frame");
            assert!(last.name.ends_with("a_named_function"), "{frames:?}");
        }
        assert_eq!(symbols.files_loaded(), 1, "one file, loaded once");
        // Opened without O_NONBLOCK, this would wait for a writer forever.
        assert!(symbols.frames(0x1010)[0].name.ends_with("trace_pipe+0x10"));
    }
}
