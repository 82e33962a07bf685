//! A minimal GGUF v3 writer, for tests and small fixtures (e.g. tiny model files).

use crate::file::DEFAULT_ALIGNMENT;
use crate::tensor::GgmlType;
use crate::value::{Array, Value};

/// Builds a GGUF v3 image in memory.
#[derive(Debug, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn metadata(mut self, key: &str, value: Value) -> Self {
        self.metadata.push((key.to_owned(), value));
        self
    }

    /// Adds a tensor; `dims` in ggml order (`dims[0]` = row length), `data` already encoded.
    pub fn tensor(mut self, name: &str, dims: &[u64], ggml_type: GgmlType, data: Vec<u8>) -> Self {
        self.tensors
            .push((name.to_owned(), dims.to_vec(), ggml_type, data));
        self
    }

    pub fn build(&self) -> Vec<u8> {
        let alignment = self
            .metadata
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_integer())
            .and_then(|a| u64::try_from(a).ok())
            .filter(|a| a.is_power_of_two())
            .unwrap_or(DEFAULT_ALIGNMENT);
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            write_string(&mut out, key);
            out.extend_from_slice(&type_code(value).to_le_bytes());
            write_value(&mut out, value);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for (name, dims, ggml_type, data) in &self.tensors {
            write_string(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ggml_code(*ggml_type).to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len() as u64).div_ceil(alignment) * alignment;
        }
        let data_start = (out.len() as u64).div_ceil(alignment) * alignment;
        out.resize(data_start as usize, 0);
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            out.resize((data_start + off) as usize, 0);
            out.extend_from_slice(data);
        }
        out
    }
}

fn ggml_code(t: GgmlType) -> u32 {
    match t {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q4_0 => 2,
        GgmlType::Q4_1 => 3,
        GgmlType::Q5_0 => 6,
        GgmlType::Q5_1 => 7,
        GgmlType::Q8_0 => 8,
        GgmlType::Q8_1 => 9,
        GgmlType::Q2K => 10,
        GgmlType::Q3K => 11,
        GgmlType::Q4K => 12,
        GgmlType::Q5K => 13,
        GgmlType::Q6K => 14,
        GgmlType::Q8K => 15,
        GgmlType::I8 => 24,
        GgmlType::I16 => 25,
        GgmlType::I32 => 26,
        GgmlType::I64 => 27,
        GgmlType::F64 => 28,
        GgmlType::BF16 => 30,
        GgmlType::Other(c) => c,
    }
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn type_code(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn array_type_code(a: &Array) -> u32 {
    match a {
        Array::U8(_) => 0,
        Array::I8(_) => 1,
        Array::U16(_) => 2,
        Array::I16(_) => 3,
        Array::U32(_) => 4,
        Array::I32(_) => 5,
        Array::F32(_) => 6,
        Array::Bool(_) => 7,
        Array::String(_) => 8,
        Array::Array(_) => 9,
        Array::U64(_) => 10,
        Array::I64(_) => 11,
        Array::F64(_) => 12,
    }
}

fn write_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => write_string(out, s),
        Value::Array(a) => write_array(out, a),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

fn write_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&array_type_code(a).to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr, $f:expr) => {
            for x in $v {
                $f(x)
            }
        };
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => each!(v, |x: &i8| out.push(*x as u8)),
        Array::U16(v) => each!(v, |x: &u16| out.extend_from_slice(&x.to_le_bytes())),
        Array::I16(v) => each!(v, |x: &i16| out.extend_from_slice(&x.to_le_bytes())),
        Array::U32(v) => each!(v, |x: &u32| out.extend_from_slice(&x.to_le_bytes())),
        Array::I32(v) => each!(v, |x: &i32| out.extend_from_slice(&x.to_le_bytes())),
        Array::F32(v) => each!(v, |x: &f32| out.extend_from_slice(&x.to_le_bytes())),
        Array::Bool(v) => each!(v, |x: &bool| out.push(u8::from(*x))),
        Array::String(v) => each!(v, |s: &String| write_string(out, s)),
        Array::Array(v) => each!(v, |inner: &Array| write_array(out, inner)),
        Array::U64(v) => each!(v, |x: &u64| out.extend_from_slice(&x.to_le_bytes())),
        Array::I64(v) => each!(v, |x: &i64| out.extend_from_slice(&x.to_le_bytes())),
        Array::F64(v) => each!(v, |x: &f64| out.extend_from_slice(&x.to_le_bytes())),
    }
}
