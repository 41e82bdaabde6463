//! Session files: the sequences in the KV (their token ids and cells), and an application
//! blob (the chat keeps its messages there), in a self-describing, versioned, checksummed
//! format.
//!
//! Layout (format version 2), all integers little-endian:
//!
//! | offset | bytes | field |
//! |---|---|---|
//! | 0 | 8 | magic `MINFSESS` |
//! | 8 | 4 | format version (2) |
//! | 12 | 4 | reserved, 0 |
//! | 16 | 8 | model identity ([`model_identity`]) |
//! | 24 | 4 | n_ctx |
//! | 28 | 4 | KV element type (GGML type id) |
//! | 32 | 4 | layers |
//! | 36 | 4 | K/V values per cell (`n_head_kv * head_dim`) |
//! | 40 | 4 | sequences |
//! | 44 | 4 | application blob bytes |
//! | 48 | blob | application blob |
//! | … | 4 per layer | backend id u16 (cpu 0, metal 1, cuda 2), reserved u16 = 0 |
//! | … | per sequence | id u32, n_tokens u32, token ids 4·n_tokens, then per layer the K rows then the V rows of its positions `0..n_tokens` |
//! | end−8 | 8 | FNV-1a 64 of every byte before it |
//!
//! Version 1 (one sequence, cells `0..n` stored raw) is refused by its version number.
//! [`Engine::read_session`] verifies a whole file (length, checksum, then that it fits this
//! engine: model, n_ctx, KV type, shape, backends, token ids) and returns it unapplied;
//! [`Engine::apply_session`] (into the default sequence) and [`Engine::apply_session_all`]
//! (every sequence, under its saved id) then write the cells. Nothing in the engine changes
//! until everything is verified.

use crate::engine::{Engine, Result};
use crate::kvcells::{KvCells, SeqId};
use minfer_gguf::{GgmlType, GgufModel};
use std::path::Path;

pub const MAGIC: &[u8; 8] = b"MINFSESS";
pub const VERSION: u32 = 2;
const HEADER: usize = 48;
const LAYER_HEADER: usize = 4;
const SEQ_HEADER: usize = 8;
const CHECKSUM: usize = 8;

pub use crate::error::SessionError;

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
pub fn backend_name(id: u16) -> String {
    crate::backends::name_of(minfer_graph::BackendId(id))
}

/// One saved sequence: its id, token ids (positions `0..tokens.len()`) and per layer its K
/// rows then V rows.
#[derive(Debug, Clone)]
pub struct SavedSeq {
    pub id: u32,
    pub tokens: Vec<u32>,
    layers: Vec<Vec<u8>>,
}

/// A verified session, not yet applied.
#[derive(Debug, Clone)]
pub struct Session {
    pub app: Vec<u8>,
    pub seqs: Vec<SavedSeq>,
}

impl Session {
    /// The first sequence's token ids (the one-sequence API's view; empty without one).
    pub fn tokens(&self) -> &[u32] {
        self.seqs.first().map_or(&[], |s| &s.tokens)
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// Callers check the declared length first, so every take is in bounds.
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

/// The header fields of a file whose length and checksum were verified.
struct FileHeader {
    reserved: u32,
    identity: u64,
    n_ctx: u32,
    ty_id: u32,
    n_layer: usize,
    n_embd_kv: usize,
    n_seqs: usize,
    app_len: usize,
}

/// Checks what needs no engine: magic, version, the length the header declares, the
/// checksum.
fn verify_file(b: &[u8]) -> std::result::Result<FileHeader, SessionError> {
    if b.len() < 8 && MAGIC.starts_with(b) {
        return Err(SessionError::Truncated {
            len: b.len(),
            expected: HEADER + CHECKSUM,
        });
    }
    if b.len() < 8 || &b[..8] != MAGIC {
        return Err(SessionError::Magic {
            found: b[..b.len().min(8)].to_vec(),
        });
    }
    if b.len() >= 12 {
        let version = u32::from_le_bytes(b[8..12].try_into().unwrap_or_default());
        if version != VERSION {
            return Err(SessionError::Version {
                found: version,
                reads: VERSION,
            });
        }
    }
    if b.len() < HEADER + CHECKSUM {
        return Err(SessionError::Truncated {
            len: b.len(),
            expected: HEADER + CHECKSUM,
        });
    }
    let stored = u64::from_le_bytes(b[b.len() - 8..].try_into().unwrap_or_default());
    let computed = fnv1a64(&b[..b.len() - 8]);
    let mut r = Reader { b, at: 12 };
    let h = FileHeader {
        reserved: r.u32(),
        identity: r.u64(),
        n_ctx: r.u32(),
        ty_id: r.u32(),
        n_layer: r.u32() as usize,
        n_embd_kv: r.u32() as usize,
        n_seqs: r.u32() as usize,
        app_len: r.u32() as usize,
    };
    // Walk the declared sizes before trusting any of them: a short file is truncated,
    // a long one has trailing bytes, both before the checksum is consulted.
    let cb = GgmlType::from_id(h.ty_id)
        .and_then(|t| t.row_bytes(h.n_embd_kv as u64))
        .unwrap_or(0) as usize;
    let expected = declared_len(b, h.app_len, h.n_layer, h.n_seqs, cb);
    if (b.len() as u128) < expected {
        return Err(SessionError::Truncated {
            len: b.len(),
            expected: expected.min(usize::MAX as u128) as usize,
        });
    }
    if (b.len() as u128) > expected {
        let expected = expected as usize;
        return Err(SessionError::Trailing {
            extra: b.len() - expected,
            expected,
        });
    }
    if stored != computed {
        return Err(SessionError::Checksum { stored, computed });
    }
    Ok(h)
}

/// The application blob of a session file verified as a file (magic, version, length,
/// checksum) but not against any engine: what a chat reads back when the saved KV does not
/// fit (another n_ctx, model…) and the messages are re-rendered.
pub fn app_blob(b: &[u8]) -> std::result::Result<&[u8], SessionError> {
    let h = verify_file(b)?;
    if h.reserved != 0 {
        return Err(SessionError::Field {
            field: "reserved",
            found: h.reserved as u64,
            expected: 0,
        });
    }
    Ok(&b[HEADER..HEADER + h.app_len])
}

impl Engine {
    /// This model's identity as session files record it.
    pub fn model_identity(&self) -> u64 {
        model_identity(self.model())
    }

    /// The session bytes of the default sequence; `tokens` are the ids it holds (one per
    /// position, `tokens.len() == n_past`).
    pub fn session_bytes(&mut self, tokens: &[u32], app: &[u8]) -> Result<Vec<u8>> {
        let seq = self.default_seq();
        self.session_bytes_of(&[(seq, tokens)], app)
    }

    /// The session bytes of several sequences, each with the token ids it holds.
    pub fn session_bytes_of(&mut self, seqs: &[(SeqId, &[u32])], app: &[u8]) -> Result<Vec<u8>> {
        for (i, (seq, tokens)) in seqs.iter().enumerate() {
            let held = self.cells().n_positions(*seq)?;
            let next = self.cells().next_pos(*seq)?;
            if tokens.len() != held || held != next {
                return Err(SessionError::Save(format!(
                    "sequence {seq}: {} token ids given for a KV of {held} positions{}",
                    tokens.len(),
                    if held != next {
                        " with gaps (shift it first)"
                    } else {
                        ""
                    }
                ))
                .into());
            }
            if seqs[..i].iter().any(|o| o.0 == *seq) {
                return Err(SessionError::DuplicateSeq { seq: seq.0 }.into());
            }
        }
        let identity = self.model_identity();
        if seqs.iter().any(|s| !s.1.is_empty()) {
            self.runner.ensure_kv_regions()?;
        }
        let cb = self.kv_layout().cell_bytes;
        let hp = self.hparams().clone();
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&identity.to_le_bytes());
        for v in [
            self.n_ctx(),
            self.cache_type().id() as usize,
            hp.block_count,
            hp.head_count_kv * hp.head_dim,
            seqs.len(),
            app.len(),
        ] {
            out.extend_from_slice(&u32_field(v)?.to_le_bytes());
        }
        out.extend_from_slice(app);
        let regions: Vec<Option<minfer_graph::KvRegion>> = (0..hp.block_count)
            .map(|l| self.runner.kv_region(l))
            .collect();
        for (l, r) in regions.iter().enumerate() {
            let id = r.map_or(self.kv_backend_id(l), |r| r.backend.0);
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&0u16.to_le_bytes());
        }
        for (seq, tokens) in seqs {
            out.extend_from_slice(&seq.0.to_le_bytes());
            out.extend_from_slice(&u32_field(tokens.len())?.to_le_bytes());
            for t in tokens.iter() {
                out.extend_from_slice(&t.to_le_bytes());
            }
            let runs = self.cells().runs(*seq)?.to_vec();
            for r in &regions {
                let Some(r) = r else { continue };
                let be = self
                    .runner
                    .backends_mut()
                    .iter_mut()
                    .find(|b| b.id() == r.backend)
                    .ok_or_else(|| SessionError::Save(format!("backend {} is gone", r.backend)))?;
                for buf in [r.pair.k, r.pair.v] {
                    for run in &runs {
                        let at = out.len();
                        out.resize(at + run.len * cb, 0);
                        be.read(buf, run.cell * cb, &mut out[at..])?;
                    }
                }
            }
        }
        let sum = fnv1a64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        Ok(out)
    }

    /// The backend id a fresh engine keeps `layer`'s KV regions on (the one that runs its KV
    /// stores: the block's backend under a layer plan, else the first holding the weights).
    fn kv_backend_id(&self, layer: usize) -> u16 {
        if let Some(plan) = self.runner.placement().layers() {
            return plan.home(Some(layer)).0;
        }
        self.runner
            .backends()
            .iter()
            .find(|b| self.runner.placement().holds(b.id()))
            .map_or(0, |b| b.id().0)
    }

    /// Writes the default sequence's session to `path` (through `path.partial`, renamed when
    /// complete, so an interrupted save never leaves a broken file under the name).
    pub fn save_session(&mut self, path: &Path, tokens: &[u32], app: &[u8]) -> Result<()> {
        let bytes = self.session_bytes(tokens, app)?;
        write_atomic(path, &bytes)
    }

    /// Writes several sequences' session to `path` (atomically, as [`Engine::save_session`]).
    pub fn save_session_of(
        &mut self,
        path: &Path,
        seqs: &[(SeqId, &[u32])],
        app: &[u8],
    ) -> Result<()> {
        let bytes = self.session_bytes_of(seqs, app)?;
        write_atomic(path, &bytes)
    }

    /// Verifies session bytes against this engine; changes nothing.
    pub fn read_session(&self, b: &[u8]) -> Result<Session> {
        let FileHeader {
            reserved,
            identity,
            n_ctx,
            ty_id,
            n_layer,
            n_embd_kv,
            n_seqs,
            app_len,
        } = verify_file(b)?;
        let mut r = Reader { b, at: HEADER };
        let cb = GgmlType::from_id(ty_id)
            .and_then(|t| t.row_bytes(n_embd_kv as u64))
            .unwrap_or(0) as usize;
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
        let app = r.take(app_len).to_vec();
        for layer in 0..n_layer {
            let be = r.u16();
            let reserved = r.u16();
            field("layer reserved", reserved as u64, 0)?;
            let this = self
                .runner
                .kv_region(layer)
                .map_or_else(|| self.kv_backend_id(layer), |r| r.backend.0);
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
        }
        let vocab = hp.vocab_size;
        let mut seqs: Vec<SavedSeq> = Vec::with_capacity(n_seqs);
        let mut index = 0;
        for _ in 0..n_seqs {
            let id = r.u32();
            let n_tokens = r.u32() as usize;
            if seqs.iter().any(|s| s.id == id) {
                return Err(SessionError::DuplicateSeq { seq: id }.into());
            }
            if n_tokens > self.n_ctx() {
                return Err(SessionError::TooManyTokens {
                    n_tokens,
                    n_ctx: self.n_ctx(),
                }
                .into());
            }
            let mut tokens = Vec::with_capacity(n_tokens);
            for _ in 0..n_tokens {
                let t = r.u32();
                if t as usize >= vocab {
                    return Err(SessionError::TokenOutOfRange {
                        index,
                        id: t,
                        vocab,
                    }
                    .into());
                }
                tokens.push(t);
                index += 1;
            }
            let layers = (0..n_layer)
                .map(|_| r.take(2 * n_tokens * cb).to_vec())
                .collect();
            seqs.push(SavedSeq { id, tokens, layers });
        }
        let needed: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        if needed > self.n_ctx() {
            return Err(SessionError::NoRoom {
                needed,
                free: self.n_ctx(),
            }
            .into());
        }
        Ok(Session { app, seqs })
    }

    /// Replaces the default sequence with a verified session's first sequence.
    pub fn apply_session(&mut self, s: &Session) -> Result<()> {
        let seq = self.default_seq();
        let Some(saved) = s.seqs.first() else {
            self.kv_clear();
            return Ok(());
        };
        self.apply_saved(saved, seq)
    }

    /// Replaces `seq` with the session's sequence saved under id `saved`.
    pub fn apply_session_seq(&mut self, s: &Session, saved: u32, seq: SeqId) -> Result<()> {
        let sv = s
            .seqs
            .iter()
            .find(|x| x.id == saved)
            .ok_or(SessionError::NoSuchSeq { seq: saved })?;
        self.apply_saved(sv, seq)
    }

    /// Replaces every sequence with the session's, under their saved ids (the default
    /// sequence stays, empty unless the session has it).
    pub fn apply_session_all(&mut self, s: &Session) -> Result<()> {
        let needed: usize = s.seqs.iter().map(|x| x.tokens.len()).sum();
        if needed > self.kv.cells().n_cells() {
            return Err(SessionError::NoRoom {
                needed,
                free: self.kv.cells().n_cells(),
            }
            .into());
        }
        let mut cells =
            KvCells::with_placement(self.kv.cells().n_cells(), self.kv.cells().placement());
        cells.create_with_id(self.kv.default_seq())?;
        for sv in &s.seqs {
            if !cells.contains(SeqId(sv.id)) {
                cells.create_with_id(SeqId(sv.id))?;
            }
        }
        let before = self.kv.replace_cells(cells);
        for sv in &s.seqs {
            if let Err(e) = self.apply_saved(sv, SeqId(sv.id)) {
                self.kv.replace_cells(before);
                return Err(e);
            }
        }
        Ok(())
    }

    fn apply_saved(&mut self, sv: &SavedSeq, seq: SeqId) -> Result<()> {
        let n = sv.tokens.len();
        let mut next = self.kv.cells().clone();
        next.clear(seq)?;
        if n == 0 {
            self.kv.replace_cells(next);
            return Ok(());
        }
        let free = next.n_free();
        if n > free {
            return Err(SessionError::NoRoom { needed: n, free }.into());
        }
        let cells = next.reserve(&[(seq, 0, n)])?.remove(0);
        self.runner.ensure_kv_regions()?;
        let cb = self.kv_layout().cell_bytes;
        for (layer, blob) in sv.layers.iter().enumerate() {
            let Some(r) = self.runner.kv_region(layer) else {
                continue;
            };
            let be = self
                .runner
                .backends_mut()
                .iter_mut()
                .find(|b| b.id() == r.backend)
                .ok_or_else(|| SessionError::Save(format!("backend {} is gone", r.backend)))?;
            for (k, buf) in [r.pair.k, r.pair.v].into_iter().enumerate() {
                let rows = &blob[k * n * cb..(k + 1) * n * cb];
                for (row, &c) in rows.chunks_exact(cb).zip(&cells) {
                    be.write(buf, c * cb, row)?;
                }
            }
        }
        self.kv.replace_cells(next);
        Ok(())
    }

    /// Reads, verifies and applies a session file into the default sequence; on any error
    /// the engine is unchanged.
    pub fn load_session(&mut self, path: &Path) -> Result<Session> {
        let bytes = std::fs::read(path).map_err(io(path))?;
        let s = self.read_session(&bytes)?;
        self.apply_session(&s)?;
        Ok(s)
    }
}

fn u32_field(v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| SessionError::Save(format!("{v} does not fit a u32 field")).into())
}

/// The crash-safe protocol every user file shares (`minfer_gguf::atomic`: temporary,
/// fsync, rename, directory fsync), with its error as a session I/O error.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    minfer_gguf::atomic::write_bytes(path, bytes).map_err(|e| match e {
        minfer_gguf::Error::Io { path, source } => SessionError::Io { path, source }.into(),
        other => SessionError::Save(other.to_string()).into(),
    })
}

/// The file length the header and sequence headers declare (u128: no field can overflow it).
fn declared_len(b: &[u8], app_len: usize, n_layer: usize, n_seqs: usize, cb: usize) -> u128 {
    let mut at = HEADER as u128 + app_len as u128 + (n_layer * LAYER_HEADER) as u128;
    for _ in 0..n_seqs {
        let o = at as usize;
        // A sequence header past the end: the file is at least this long plus the header.
        if at + SEQ_HEADER as u128 + CHECKSUM as u128 > b.len() as u128 {
            return at + SEQ_HEADER as u128 + CHECKSUM as u128;
        }
        let n = u32::from_le_bytes(b[o + 4..o + 8].try_into().unwrap_or_default()) as u128;
        at += SEQ_HEADER as u128 + 4 * n + n_layer as u128 * 2 * n * cb as u128;
    }
    at + CHECKSUM as u128
}
