//! A GGUF file on disk: memory-mapped, header parsed, tensor data handed out as zero-copy
//! slices of the mapping. Opening touches only the pages the header occupies.

use crate::error::{Error, Result};
use crate::header::{parse_header, Header, TensorInfo};
use memmap2::Mmap;
use std::fs::File;
use std::path::{Path, PathBuf};

#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    header: Header,
}

impl GgufFile {
    /// Maps `path` and parses its header.
    ///
    /// # Errors
    /// I/O failures, and every malformation `parse_header` detects.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref().to_path_buf();
        let io = |source| Error::Io {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            return Err(Error::Truncated {
                offset: 0,
                needed: 4,
                len: 0,
                what: "magic",
            });
        }
        // SAFETY: the mapping is read-only and private to this struct; minfer never writes the
        // file while it is open. A concurrent external truncation could fault, as with any mmap
        // reader (llama.cpp has the same contract); we accept that for zero-copy weights.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let header = parse_header(&map, len)?;
        Ok(GgufFile { path, map, header })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn header(&self) -> &Header {
        &self.header
    }
    pub fn file_len(&self) -> u64 {
        self.map.len() as u64
    }
    /// The whole mapping (page-aligned base), for backends that wrap a part zero-copy.
    pub fn mapping(&self) -> &[u8] {
        &self.map
    }

    /// The bytes of `info` (which must come from this file's header).
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        let start = (self.header.data_offset + info.offset) as usize;
        &self.map[start..start + info.n_bytes as usize]
    }

    /// Absolute file offset of a tensor's data.
    pub fn tensor_file_offset(&self, info: &TensorInfo) -> u64 {
        self.header.data_offset + info.offset
    }
}
