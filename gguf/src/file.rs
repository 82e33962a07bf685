//! Parsing a whole GGUF file: header, metadata, tensor infos, data section.

use std::collections::HashMap;
use std::path::Path;

use crate::error::GgufError;
use crate::metadata::Metadata;
use crate::reader::Reader;
use crate::tensor::{GgmlType, TensorInfo};

const MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
const MAX_DIMS: u32 = 4;

enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file. Tensor data stays in the mapping (or buffer) it was parsed from.
pub struct GgufFile {
    storage: Storage,
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata_entries", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

impl GgufFile {
    /// Maps the file read-only and parses it. The file must not be modified while mapped.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let io_err = |source| GgufError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io_err)?;
        // SAFETY: the mapping is read-only; like every mmap-based model loader we rely on the
        // model file not being truncated or rewritten while the process runs.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?;
        Self::parse(Storage::Mapped(map))
    }

    /// Parses a GGUF image held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::parse(Storage::Owned(bytes))
    }

    fn parse(storage: Storage) -> Result<Self, GgufError> {
        let bytes = storage.bytes();
        let mut r = Reader::new(bytes);
        let magic = r.take(4, "magic").map_err(|_| {
            let mut found = [0u8; 4];
            found[..bytes.len().min(4)].copy_from_slice(&bytes[..bytes.len().min(4)]);
            GgufError::BadMagic { found }
        })?;
        if magic != MAGIC {
            let mut found = [0u8; 4];
            found.copy_from_slice(magic);
            return Err(GgufError::BadMagic { found });
        }
        let version = r.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let tensor_count = r.u64("tensor count")?;
        let kv_count = r.u64("metadata count")?;

        // A key/value pair takes at least 8 (key length) + 4 (type) + 1 bytes.
        let kv_count = r.check_count(kv_count, 13, "metadata entry")?;
        let mut metadata = Metadata::default();
        for _ in 0..kv_count {
            let key = r.string("metadata key")?;
            let value_type = r.value_type(&key)?;
            let value = r.value(value_type, &key, 0)?;
            metadata.insert(key, value)?;
        }

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => {
                let a = v.as_integer().unwrap_or(0);
                match u64::try_from(a) {
                    Ok(a) if a.is_power_of_two() => a,
                    _ => return Err(GgufError::BadAlignment(a.max(0) as u64)),
                }
            }
        };

        // A tensor info takes at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset).
        let tensor_count = r.check_count(tensor_count, 24, "tensor info")?;
        let mut tensors = Vec::with_capacity(tensor_count);
        let mut tensor_index = HashMap::with_capacity(tensor_count);
        for i in 0..tensor_count {
            let info = read_tensor_info(&mut r)?;
            if tensor_index.insert(info.name.clone(), i).is_some() {
                return Err(GgufError::DuplicateTensor(info.name));
            }
            tensors.push(info);
        }

        let data_offset = r.position().div_ceil(alignment) * alignment;
        let file_len = bytes.len() as u64;
        for info in &tensors {
            check_tensor_bounds(info, alignment, data_offset, file_len)?;
        }

        Ok(Self {
            storage,
            version,
            metadata,
            tensors,
            tensor_index,
            alignment,
            data_offset,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The whole file image.
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// The raw bytes of a tensor (bounds were checked at parse time).
    pub fn tensor_data(&self, name: &str) -> Result<&[u8], GgufError> {
        let info = self
            .tensor(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_owned()))?;
        self.tensor_info_data(info)
    }

    /// The raw bytes of a tensor described by one of this file's infos.
    pub fn tensor_info_data(&self, info: &TensorInfo) -> Result<&[u8], GgufError> {
        let size = info.size_bytes.ok_or_else(|| GgufError::BadTensor {
            name: info.name.clone(),
            reason: format!("unknown storage type {}", info.ggml_type),
        })?;
        let start = self.data_offset + info.offset;
        self.bytes()
            .get(start as usize..(start + size) as usize)
            .ok_or_else(|| GgufError::BadTensor {
                name: info.name.clone(),
                reason: "data out of bounds".into(),
            })
    }
}

fn read_tensor_info(r: &mut Reader<'_>) -> Result<TensorInfo, GgufError> {
    let name = r.string("tensor name")?;
    let n_dims = r.u32("tensor dimension count")?;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(GgufError::BadTensor {
            name,
            reason: format!("{n_dims} dimensions (expected 1..={MAX_DIMS})"),
        });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(r.u64("tensor dimension")?);
    }
    let ggml_type = GgmlType::from_code(r.u32("tensor type")?);
    let offset = r.u64("tensor offset")?;
    let size_bytes = tensor_size(&name, &dims, ggml_type)?;
    Ok(TensorInfo {
        name,
        dims,
        ggml_type,
        offset,
        size_bytes,
    })
}

fn tensor_size(name: &str, dims: &[u64], ggml_type: GgmlType) -> Result<Option<u64>, GgufError> {
    let bad = |reason: String| GgufError::BadTensor {
        name: name.to_owned(),
        reason,
    };
    let elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad(format!("element count of {dims:?} overflows")))?;
    let Some((block_elems, block_bytes)) = ggml_type.block_layout() else {
        return Ok(None);
    };
    if !dims[0].is_multiple_of(block_elems) {
        return Err(bad(format!(
            "row length {} is not a multiple of the {ggml_type} block size {block_elems}",
            dims[0]
        )));
    }
    (elements / block_elems)
        .checked_mul(block_bytes)
        .map(Some)
        .ok_or_else(|| bad("byte size overflows".into()))
}

fn check_tensor_bounds(
    info: &TensorInfo,
    alignment: u64,
    data_offset: u64,
    file_len: u64,
) -> Result<(), GgufError> {
    let bad = |reason: String| GgufError::BadTensor {
        name: info.name.clone(),
        reason,
    };
    if !info.offset.is_multiple_of(alignment) {
        return Err(bad(format!(
            "offset {} is not aligned to {alignment}",
            info.offset
        )));
    }
    if let Some(size) = info.size_bytes {
        let end = data_offset
            .checked_add(info.offset)
            .and_then(|s| s.checked_add(size));
        match end {
            Some(end) if end <= file_len => {}
            _ => {
                return Err(bad(format!(
                    "data [{}+{}, {size} bytes] runs past the end of the file ({file_len} bytes)",
                    data_offset, info.offset
                )))
            }
        }
    }
    Ok(())
}
