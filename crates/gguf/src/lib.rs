//! The GGUF file format and GGML weight types.
//!
//! - [`GgufFile`] maps one file and parses its header ([`parse_header`] is the pure parser);
//!   [`GgufModel`] opens one file or a split set as one tensor index.
//! - [`GgufWriter`] writes GGUF v3; [`split`] splits and merges models as llama-gguf-split does.
//! - [`GgmlType`] names every ggml type id; [`quants`] holds block layouts, reference
//!   dequantization/quantization and scalar reference dot products for the supported ones.
//!
//! ```no_run
//! let model = minfer_gguf::GgufModel::open("model.gguf")?;
//! let arch = model.metadata().get_str("general.architecture");
//! let (info, bytes) = model.tensor_data("token_embd.weight")?;
//! # Ok::<(), minfer_gguf::Error>(())
//! ```

pub mod atomic;
pub mod error;
pub mod file;
pub mod header;
pub mod metadata;
pub mod model;
pub mod quants;
pub mod split;
pub mod string_array;
pub mod types;
pub mod value;
pub mod writer;

pub use atomic::{partial_path, AtomicFile, Staged};
pub use error::{Error, Result};
pub use file::GgufFile;
pub use header::{parse_header, Header, Metadata, TensorInfo};
pub use model::{GgufModel, ModelTensor};
pub use string_array::StringArray;
pub use types::{GgmlType, TypeId};
pub use value::{Array, Value, ValueType};
pub use writer::{stage_streaming, write_streaming, GgufWriter, TensorPlan, WriterTensor};
