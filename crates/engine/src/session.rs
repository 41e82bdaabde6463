//! Session files: the tokens in the KV, the KV itself and an application blob (the chat
//! keeps its messages there), in a self-describing, versioned, checksummed format.
//!
//! Layout, all integers little-endian:
//!
//! | offset | bytes | field |
//! |---|---|---|
//! | 0 | 8 | magic `MINFSESS` |
//! | 8 | 4 | format version (1) |
//! | 12 | 4 | reserved, 0 |
//! | 16 | 8 | model identity ([`model_identity`]) |
//! | 24 | 4 | n_ctx |
//! | 28 | 4 | KV element type (GGML type id) |
//! | 32 | 4 | layers |
//! | 36 | 4 | K/V values per cell (`n_head_kv * head_dim`) |
//! | 40 | 4 | n_tokens |
//! | 44 | 4 | application blob bytes |
//! | 48 | 4·n_tokens | token ids |
//! | … | blob | application blob |
//! | … | per layer | backend id u16 (cpu 0, metal 1, cuda 2), reserved u16 = 0, K cells `0..n_tokens`, V cells `0..n_tokens` |
//! | end−8 | 8 | FNV-1a 64 of every byte before it |
//!
//! [`Engine::read_session`] verifies a whole file (length, checksum, then that it fits this
//! engine: model, n_ctx, KV type, shape, backends, token ids) and returns it unapplied;
//! [`Engine::apply_session`] then writes the cells. Nothing in the engine changes until
//! everything is verified.

use crate::engine::{Engine, Result};
use minfer_gguf::{GgmlType, GgufModel};
use std::path::{Path, PathBuf};

pub const MAGIC: &[u8; 8] = b"MINFSESS";
pub const VERSION: u32 = 1;
const HEADER: usize = 48;
const LAYER_HEADER: usize = 4;
const CHECKSUM: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("session file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("not a minfer session file (magic {found:02x?}, expected \"MINFSESS\")")]
    Magic { found: Vec<u8> },
    #[error("session format version {found}, this build reads version {VERSION}")]
    Version { found: u32 },
    #[error("session file truncated: {len} bytes, the header says {expected}")]
    Truncated { len: usize, expected: usize },
    #[error("session file has {extra} bytes after its checksum (the header says {expected} bytes in all)")]
    Trailing { extra: usize, expected: usize },
    #[error("session checksum mismatch: stored {stored:#018x}, computed {computed:#018x} (the file is corrupt)")]
    Checksum { stored: u64, computed: u64 },
    #[error("session field {field} is {found}, expected {expected}")]
    Field {
        field: &'static str,
        found: u64,
        expected: u64,
    },
    #[error("session is for another model (identity {saved:#018x}, this model is {this:#018x})")]
    OtherModel { saved: u64, this: u64 },
    #[error("session was saved with n_ctx {saved}, this engine has n_ctx {this}")]
    NCtx { saved: u32, this: usize },
    #[error("session KV type is {saved}, this engine's is {this}")]
    KvType { saved: String, this: GgmlType },
    #[error("session layer {layer} KV was saved on backend {saved} ({saved_name}), this engine keeps it on {this} ({this_name})")]
    Backend {
        layer: usize,
        saved: u16,
        saved_name: &'static str,
        this: u16,
        this_name: &'static str,
    },
    #[error("session holds {n_tokens} tokens, more than n_ctx {n_ctx}")]
    TooManyTokens { n_tokens: usize, n_ctx: usize },
    #[error("session token {index} is id {id}, outside the vocabulary of {vocab}")]
    TokenOutOfRange { index: usize, id: u32, vocab: usize },
    #[error("cannot save a session: {0}")]
    Save(String),
}

/// FNV-1a, 64-bit.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    fnv1a64_from(0xcbf2_9ce4_8422_2325, bytes)
}

fn fnv1a64_from(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// What identifies a model for a session: FNV-1a 64 over every part's header (metadata
/// and tensor table) and, per tensor, its name, size and first and last 4 KiB of data. Two
/// files that differ only in the middle of a tensor share it (a full hash would read the
/// whole model on every save and load).
pub fn model_identity(model: &GgufModel) -> u64 {
    const EDGE: usize = 4096;
    let mut h = fnv1a64(b"minfer-model-identity");
    for (i, part) in model.parts().iter().enumerate() {
        let data_start = model
            .tensors()
            .iter()
            .filter(|t| t.part == i)
            .map(|t| part.tensor_file_offset(&t.info) as usize)
            .min()
            .unwrap_or(part.mapping().len());
        h = fnv1a64_from(h, &part.mapping()[..data_start.min(part.mapping().len())]);
    }
    for t in model.tensors() {
        let bytes = model.parts()[t.part].tensor_bytes(&t.info);
        h = fnv1a64_from(h, t.info.name.as_bytes());
        h = fnv1a64_from(h, &(bytes.len() as u64).to_le_bytes());
        h = fnv1a64_from(h, &bytes[..EDGE.min(bytes.len())]);
        h = fnv1a64_from(h, &bytes[bytes.len().saturating_sub(EDGE)..]);
    }
    h
}

/// Backend names for the ids session files use.
pub fn backend_name(id: u16) -> &'static str {
    match id {
        0 => "cpu",
        1 => "metal",
        2 => "cuda",
        _ => "unknown",
    }
}

/// A verified session, not yet applied.
#[derive(Debug, Clone)]
pub struct Session {
    pub tokens: Vec<u32>,
    pub app: Vec<u8>,
    /// Per layer: K bytes then V bytes of cells `0..tokens.len()`.
    layers: Vec<Vec<u8>>,
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    // Callers check the total length first, so every take is in bounds.
    fn take(&mut self, n: usize) -> &'a [u8] {
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        s
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take(2).try_into().unwrap_or_default())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap_or_default())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().unwrap_or_default())
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SessionError + '_ {
    move |source| SessionError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Engine {
    /// This model's identity as session files record it.
    pub fn model_identity(&self) -> u64 {
        model_identity(self.model())
    }

    /// The session bytes of the current KV; `tokens` are the ids it holds (one per
    /// position, `tokens.len() == n_past`).
    pub fn session_bytes(&mut self, tokens: &[u32], app: &[u8]) -> Result<Vec<u8>> {
        if tokens.len() != self.n_past() {
            return Err(SessionError::Save(format!(
                "{} token ids given for a KV of {} positions",
                tokens.len(),
                self.n_past()
            ))
            .into());
        }
        let identity = self.model_identity();
        if !tokens.is_empty() {
            self.ensure_kv_regions()?;
        }
        let acc = self.kv_access();
        let cb = acc.cell_bytes();
        let n = tokens.len();
        let hp = acc.hp;
        let mut out = Vec::with_capacity(HEADER + 4 * n + app.len() + hp.block_count * 2 * n * cb);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&identity.to_le_bytes());
        for v in [
            acc.n_ctx,
            acc.cache_type.id() as usize,
            hp.block_count,
            hp.head_count_kv * hp.head_dim,
            n,
            app.len(),
        ] {
            let v = u32::try_from(v)
                .map_err(|_| SessionError::Save(format!("{v} does not fit a u32 field")))?;
            out.extend_from_slice(&v.to_le_bytes());
        }
        for t in tokens {
            out.extend_from_slice(&t.to_le_bytes());
        }
        out.extend_from_slice(app);
        let regions = if n == 0 { None } else { acc.regions() };
        for layer in 0..hp.block_count {
            let region = regions.as_ref().map(|r| r[layer]);
            let be_id = region.map_or(minfer_cpu::CPU_ID.0, |r| r.backend.0);
            out.extend_from_slice(&be_id.to_le_bytes());
            out.extend_from_slice(&0u16.to_le_bytes());
            if let Some(r) = region {
                let be = acc
                    .backends
                    .iter_mut()
                    .find(|b| b.id() == r.backend)
                    .ok_or_else(|| SessionError::Save(format!("backend {be_id} is gone")))?;
                for buf in [r.pair.k, r.pair.v] {
                    let at = out.len();
                    out.resize(at + n * cb, 0);
                    be.read(buf, 0, &mut out[at..])?;
                }
            }
        }
        let sum = fnv1a64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        Ok(out)
    }

    /// Writes the session to `path` (through `path.partial`, renamed when complete).
    pub fn save_session(&mut self, path: &Path, tokens: &[u32], app: &[u8]) -> Result<()> {
        let bytes = self.session_bytes(tokens, app)?;
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".partial");
        let tmp = PathBuf::from(tmp);
        std::fs::write(&tmp, &bytes).map_err(io(&tmp))?;
        std::fs::rename(&tmp, path).map_err(io(path))?;
        Ok(())
    }

    /// Verifies session bytes against this engine; changes nothing.
    pub fn read_session(&self, b: &[u8]) -> Result<Session> {
        if b.len() < 8 && MAGIC.starts_with(b) {
            return Err(SessionError::Truncated {
                len: b.len(),
                expected: HEADER + CHECKSUM,
            }
            .into());
        }
        if b.len() < 8 || &b[..8] != MAGIC {
            return Err(SessionError::Magic {
                found: b[..b.len().min(8)].to_vec(),
            }
            .into());
        }
        let mut r = Reader { b, at: 8 };
        if b.len() < HEADER + CHECKSUM {
            return Err(SessionError::Truncated {
                len: b.len(),
                expected: HEADER + CHECKSUM,
            }
            .into());
        }
        let version = r.u32();
        if version != VERSION {
            return Err(SessionError::Version { found: version }.into());
        }
        let reserved = r.u32();
        let identity = r.u64();
        let n_ctx = r.u32();
        let ty_id = r.u32();
        let n_layer = r.u32() as usize;
        let n_embd_kv = r.u32() as usize;
        let n_tokens = r.u32() as usize;
        let app_len = r.u32() as usize;
        // The size the header implies; a row's bytes come from the saved type when it is one
        // (an unknown type id is refused below, after the checksum has had its say).
        let cb = GgmlType::from_id(ty_id)
            .and_then(|t| t.row_bytes(n_embd_kv as u64))
            .unwrap_or(0) as u128;
        let expected = HEADER as u128
            + 4 * n_tokens as u128
            + app_len as u128
            + n_layer as u128 * (LAYER_HEADER as u128 + 2 * n_tokens as u128 * cb)
            + CHECKSUM as u128;
        if (b.len() as u128) < expected {
            return Err(SessionError::Truncated {
                len: b.len(),
                expected: expected.min(usize::MAX as u128) as usize,
            }
            .into());
        }
        let expected = expected as usize;
        if b.len() > expected {
            return Err(SessionError::Trailing {
                extra: b.len() - expected,
                expected,
            }
            .into());
        }
        let stored = u64::from_le_bytes(b[b.len() - 8..].try_into().unwrap_or_default());
        let computed = fnv1a64(&b[..b.len() - 8]);
        if stored != computed {
            return Err(SessionError::Checksum { stored, computed }.into());
        }
        let field = |field, found: u64, expected: u64| -> Result<()> {
            if found != expected {
                return Err(SessionError::Field {
                    field,
                    found,
                    expected,
                }
                .into());
            }
            Ok(())
        };
        field("reserved", reserved as u64, 0)?;
        let this_id = self.model_identity();
        if identity != this_id {
            return Err(SessionError::OtherModel {
                saved: identity,
                this: this_id,
            }
            .into());
        }
        if n_ctx as usize != self.n_ctx() {
            return Err(SessionError::NCtx {
                saved: n_ctx,
                this: self.n_ctx(),
            }
            .into());
        }
        if ty_id != self.cache_type().id() {
            let saved = GgmlType::from_id(ty_id)
                .map_or_else(|| format!("unknown type id {ty_id}"), |t| t.name().into());
            return Err(SessionError::KvType {
                saved,
                this: self.cache_type(),
            }
            .into());
        }
        let hp = self.hparams();
        field("layers", n_layer as u64, hp.block_count as u64)?;
        field(
            "values per cell",
            n_embd_kv as u64,
            (hp.head_count_kv * hp.head_dim) as u64,
        )?;
        if n_tokens > self.n_ctx() {
            return Err(SessionError::TooManyTokens {
                n_tokens,
                n_ctx: self.n_ctx(),
            }
            .into());
        }
        let vocab = hp.vocab_size;
        let mut tokens = Vec::with_capacity(n_tokens);
        for index in 0..n_tokens {
            let id = r.u32();
            if id as usize >= vocab {
                return Err(SessionError::TokenOutOfRange { index, id, vocab }.into());
            }
            tokens.push(id);
        }
        let app = r.take(app_len).to_vec();
        // Backends are fixed per layer at graph build; a fresh engine plans on the CPU.
        let this_be = minfer_cpu::CPU_ID.0;
        let mut layers = Vec::with_capacity(n_layer);
        for layer in 0..n_layer {
            let be = r.u16();
            let reserved = r.u16();
            field("layer reserved", reserved as u64, 0)?;
            let this = self.kv_backend(layer).unwrap_or(this_be);
            if be != this {
                return Err(SessionError::Backend {
                    layer,
                    saved: be,
                    saved_name: backend_name(be),
                    this,
                    this_name: backend_name(this),
                }
                .into());
            }
            layers.push(r.take(2 * n_tokens * cb as usize).to_vec());
        }
        Ok(Session {
            tokens,
            app,
            layers,
        })
    }

    /// The backend id holding a layer's KV, once a graph has planned it.
    fn kv_backend(&self, layer: usize) -> Option<u16> {
        self.kv_region(layer).map(|r| r.backend.0)
    }

    /// Replaces the KV with a verified session's cells.
    pub fn apply_session(&mut self, s: &Session) -> Result<()> {
        let n = s.tokens.len();
        if n == 0 {
            self.kv_clear();
            return Ok(());
        }
        self.ensure_kv_regions()?;
        let acc = self.kv_access();
        let cb = acc.cell_bytes();
        let regions = acc.regions().unwrap_or_default();
        for (r, blob) in regions.iter().zip(&s.layers) {
            let be = acc
                .backends
                .iter_mut()
                .find(|b| b.id() == r.backend)
                .ok_or_else(|| SessionError::Save(format!("backend {} is gone", r.backend)))?;
            be.write(r.pair.k, 0, &blob[..n * cb])?;
            be.write(r.pair.v, 0, &blob[n * cb..])?;
        }
        *acc.n_past = n;
        Ok(())
    }

    /// Reads, verifies and applies a session file; on any error the engine is unchanged.
    pub fn load_session(&mut self, path: &Path) -> Result<Session> {
        let bytes = std::fs::read(path).map_err(io(path))?;
        let s = self.read_session(&bytes)?;
        self.apply_session(&s)?;
        Ok(s)
    }
}
