//! One ELF file's debug information for the symbolizer: its DWARF, the split-DWARF companions
//! it names (`.dwo` files, and a `.dwp` package beside it), and its symbol table.
//!
//! A file's DWARF may name other files: a skeleton unit names its `.dwo` by a path the
//! compiler wrote. Every companion is opened through `source::open` as the file itself was
//! (a regular file only, without blocking, by its canonical path, inside `memprof mcp` only
//! under the server's roots); nothing else is opened.

use crate::source::open::{self, Opened};
use addr2line::{LookupContinuation, LookupResult, SplitDwarfLoad};
use gimli::{Reader as _, RunTimeEndian};
use memmap2::Mmap;
use object::{Object, ObjectSection};
use std::borrow::Cow;
use std::ffi::OsStr;
use std::fs::File;
use std::ops::{Deref, Range};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The bytes a section is read from: the mapped file, or the section decompressed.
#[derive(Clone, Debug)]
pub enum Bytes {
    Mapped(Arc<Mmap>),
    Owned(Arc<[u8]>),
}

impl Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(map) => map,
            Bytes::Owned(bytes) => bytes,
        }
    }
}

// SAFETY: both variants deref to memory that an `Arc` owns (a mapping or a heap slice): it
// does not move when the `Bytes` does, and a clone derefs to the same memory.
unsafe impl stable_deref_trait::StableDeref for Bytes {}
// SAFETY: as above; clones share the one `Arc`'s memory.
unsafe impl stable_deref_trait::CloneStableDeref for Bytes {}

/// What the DWARF is read through.
pub type Reader = gimli::EndianReader<RunTimeEndian, Bytes>;

/// A file opened by `source::open`, mapped read-only.
fn map(file: &File) -> Option<Arc<Mmap>> {
    // SAFETY: the mapping is read-only and private to this process; its bytes are read only
    // through `object` and `gimli`, which check every offset as they would in any slice. A
    // file truncated by someone else while mapped makes reads past its new end fault, as for
    // any program that maps a file it reads (addr2line's own loader maps them too).
    unsafe { Mmap::map(file) }.ok().map(Arc::new)
}

/// The section `name` of `object` (parsed from `map`), decompressed when it is compressed;
/// empty when absent or unreadable.
fn section(object: &object::File, map: &Arc<Mmap>, name: Option<&str>) -> Reader {
    let endian = endian_of(object);
    let data = name
        .and_then(|name| object.section_by_name(name))
        .and_then(|s| s.uncompressed_data().ok());
    let empty = || Reader::new(Bytes::Owned(Arc::from(&[][..])), endian);
    match data {
        Some(Cow::Borrowed(slice)) => {
            let start = (slice.as_ptr() as usize).wrapping_sub(map.as_ptr() as usize);
            match start.checked_add(slice.len()) {
                Some(end) if end <= map.len() => {
                    Reader::new(Bytes::Mapped(map.clone()), endian).range(start..end)
                }
                _ => empty(),
            }
        }
        Some(Cow::Owned(bytes)) => Reader::new(Bytes::Owned(bytes.into()), endian),
        None => empty(),
    }
}

fn endian_of(object: &object::File) -> RunTimeEndian {
    match object.is_little_endian() {
        true => RunTimeEndian::Little,
        false => RunTimeEndian::Big,
    }
}

/// An opened file's DWARF, its split-DWARF package and its symbols.
pub struct DebugInfo {
    context: addr2line::Context<Reader>,
    package: Option<gimli::DwarfPackage<Reader>>,
    /// `(address, size, name's place in map)` of each symbol, by address.
    symbols: Vec<(u64, u64, Range<usize>)>,
    map: Arc<Mmap>,
}

impl DebugInfo {
    /// Reads `opened`'s DWARF and symbols; `None` if it is no object file `object` reads.
    pub fn load(opened: &Opened) -> Option<DebugInfo> {
        let map = map(&opened.file)?;
        let object = object::File::parse(&map[..]).ok()?;
        let dwarf =
            gimli::Dwarf::load(|id| Ok::<_, gimli::Error>(section(&object, &map, Some(id.name()))))
                .ok()?;
        let context = addr2line::Context::from_dwarf(dwarf).ok()?;
        let base = map.as_ptr() as usize;
        let symbols = (object.symbol_map().symbols().iter())
            .filter_map(|symbol| {
                let name = symbol.name().as_bytes();
                let start = (name.as_ptr() as usize).checked_sub(base)?;
                let end = start.checked_add(name.len()).filter(|&e| e <= map.len())?;
                Some((symbol.address(), symbol.size(), start..end))
            })
            .collect();
        Some(DebugInfo {
            context,
            package: package(&opened.canonical),
            symbols,
            map,
        })
    }

    /// The frames at `probe`, innermost (inlined) first, loading the split DWARF they need.
    pub fn find_frames(
        &self,
        probe: u64,
    ) -> Result<addr2line::FrameIter<'_, Reader>, gimli::Error> {
        let mut lookup = self.context.find_frames(probe);
        loop {
            match lookup {
                LookupResult::Output(frames) => return frames,
                LookupResult::Load { load, continuation } => {
                    lookup = continuation.resume(self.split_unit(&load));
                }
            }
        }
    }

    /// The file and line of `probe`, from the line tables.
    pub fn find_location(&self, probe: u64) -> Option<addr2line::Location<'_>> {
        self.context.find_location(probe).ok().flatten()
    }

    /// The name of the symbol that holds `probe` (the last one at or before it, when that
    /// one's size is not known).
    pub fn find_symbol(&self, probe: u64) -> Option<&str> {
        let i = match self.symbols.binary_search_by_key(&probe, |&(a, _, _)| a) {
            Ok(i) => i,
            Err(i) => i.checked_sub(1)?,
        };
        let (address, size, name) = &self.symbols[i];
        if *size != 0 && probe.wrapping_sub(*address) >= *size {
            return None;
        }
        std::str::from_utf8(self.map.get(name.clone())?).ok()
    }

    /// The DWARF of a split unit: from the package when it has the unit, else from the `.dwo`
    /// file the skeleton names, when that file is the unit's (its id matches).
    fn split_unit(&self, load: &SplitDwarfLoad<Reader>) -> Option<Arc<gimli::Dwarf<Reader>>> {
        if let Some(package) = &self.package {
            if let Ok(Some(unit)) = package.find_cu(load.dwo_id, &load.parent) {
                return Some(Arc::new(unit));
            }
        }
        let mut path = PathBuf::new();
        if let Some(dir) = &load.comp_dir {
            path.push(OsStr::from_bytes(&dir.to_slice().ok()?));
        }
        path.push(OsStr::from_bytes(&load.path.as_ref()?.to_slice().ok()?));
        let opened = open::regular(&path).ok()?;
        let map = map(&opened.file)?;
        let object = object::File::parse(&map[..]).ok()?;
        let mut dwarf =
            gimli::Dwarf::load(|id| Ok::<_, gimli::Error>(section(&object, &map, id.dwo_name())))
                .ok()?;
        let header = dwarf.units().next().ok()??;
        let unit = dwarf.unit(header).ok()?;
        if unit.dwo_id != Some(load.dwo_id) {
            return None;
        }
        dwarf.make_dwo(&load.parent);
        Some(Arc::new(dwarf))
    }
}

/// The DWARF package beside the file at `canonical` (`lib.so.dwp`, `prog.dwp`), when there is
/// one.
fn package(canonical: &Path) -> Option<gimli::DwarfPackage<Reader>> {
    let mut name = canonical.as_os_str().to_os_string();
    name.push(".dwp");
    let opened = open::regular(Path::new(&name)).ok()?;
    let map = map(&opened.file)?;
    let object = object::File::parse(&map[..]).ok()?;
    let empty = Reader::new(Bytes::Owned(Arc::from(&[][..])), endian_of(&object));
    gimli::DwarfPackage::load(
        |id| Ok::<_, gimli::Error>(section(&object, &map, id.dwo_name())),
        empty,
    )
    .ok()
}
