//! A bounds-checked little-endian cursor over the file bytes. Every read checks the remaining
//! length first; every count read from the file is checked against the bytes left before
//! anything is allocated from it.

use crate::error::GgufError;
use crate::value::{Array, Value, ValueType};

/// Deepest nesting of arrays inside arrays accepted.
pub(crate) const MAX_ARRAY_NESTING: usize = 4;

pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    pub(crate) fn position(&self) -> u64 {
        self.pos as u64
    }

    pub(crate) fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    pub(crate) fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what,
                offset: self.position(),
                needed: n,
                len: self.bytes.len() as u64,
            });
        }
        // n <= remaining <= usize::MAX, so the cast is lossless.
        let n = n as usize;
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let bytes = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }
    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Checks that `count` items of at least `min_size` bytes each can still fit.
    pub(crate) fn check_count(
        &self,
        count: u64,
        min_size: u64,
        what: &'static str,
    ) -> Result<usize, GgufError> {
        let fits = count
            .checked_mul(min_size)
            .is_some_and(|needed| needed <= self.remaining());
        if !fits {
            return Err(GgufError::CountTooLarge {
                what,
                count,
                remaining: self.remaining(),
            });
        }
        Ok(count as usize)
    }

    pub(crate) fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let offset = self.position();
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::InvalidUtf8 { offset })
    }

    pub(crate) fn value(
        &mut self,
        value_type: ValueType,
        key: &str,
        depth: usize,
    ) -> Result<Value, GgufError> {
        Ok(match value_type {
            ValueType::U8 => Value::U8(self.u8("u8 value")?),
            ValueType::I8 => Value::I8(self.u8("i8 value")? as i8),
            ValueType::U16 => Value::U16(self.u16("u16 value")?),
            ValueType::I16 => Value::I16(self.u16("i16 value")? as i16),
            ValueType::U32 => Value::U32(self.u32("u32 value")?),
            ValueType::I32 => Value::I32(self.u32("i32 value")? as i32),
            ValueType::F32 => Value::F32(f32::from_bits(self.u32("f32 value")?)),
            ValueType::Bool => Value::Bool(self.u8("bool value")? != 0),
            ValueType::String => Value::String(self.string("string value")?),
            ValueType::Array => Value::Array(self.array_value(key, depth + 1)?),
            ValueType::U64 => Value::U64(self.u64("u64 value")?),
            ValueType::I64 => Value::I64(self.u64("i64 value")? as i64),
            ValueType::F64 => Value::F64(f64::from_bits(self.u64("f64 value")?)),
        })
    }

    pub(crate) fn value_type(&mut self, key: &str) -> Result<ValueType, GgufError> {
        let code = self.u32("value type")?;
        ValueType::from_code(code).ok_or_else(|| GgufError::UnknownValueType {
            key: key.to_owned(),
            value_type: code,
        })
    }

    fn array_value(&mut self, key: &str, depth: usize) -> Result<Array, GgufError> {
        if depth > MAX_ARRAY_NESTING {
            return Err(GgufError::NestingTooDeep {
                key: key.to_owned(),
                max: MAX_ARRAY_NESTING,
            });
        }
        let element_type = self.value_type(key)?;
        let count = self.u64("array length")?;
        let n = self.check_count(count, element_type.min_encoded_size(), "array element")?;
        macro_rules! collect {
            ($variant:ident, $read:expr) => {{
                let mut out = Vec::with_capacity(n);
                for _ in 0..n {
                    out.push($read);
                }
                Array::$variant(out)
            }};
        }
        Ok(match element_type {
            ValueType::U8 => Array::U8(self.take(count, "u8 array")?.to_vec()),
            ValueType::I8 => collect!(I8, self.u8("i8 array")? as i8),
            ValueType::U16 => collect!(U16, self.u16("u16 array")?),
            ValueType::I16 => collect!(I16, self.u16("i16 array")? as i16),
            ValueType::U32 => collect!(U32, self.u32("u32 array")?),
            ValueType::I32 => collect!(I32, self.u32("i32 array")? as i32),
            ValueType::F32 => collect!(F32, f32::from_bits(self.u32("f32 array")?)),
            ValueType::Bool => collect!(Bool, self.u8("bool array")? != 0),
            ValueType::String => collect!(String, self.string("string array")?),
            ValueType::Array => collect!(Array, self.array_value(key, depth + 1)?),
            ValueType::U64 => collect!(U64, self.u64("u64 array")?),
            ValueType::I64 => collect!(I64, self.u64("i64 array")? as i64),
            ValueType::F64 => collect!(F64, f64::from_bits(self.u64("f64 array")?)),
        })
    }
}
