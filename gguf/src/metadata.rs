//! The metadata key/value table with typed accessors.
//!
//! Scalar integer accessors accept any integer type whose value fits (files disagree on
//! whether e.g. token ids are u32 or i32); float accessors accept f32, f64 and integers.

use std::collections::HashMap;

use crate::error::GgufError;
use crate::value::{Array, Value, ValueType};

/// Metadata in file order, indexed by key.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    pub(crate) fn insert(&mut self, key: String, value: Value) -> Result<(), GgufError> {
        if self.index.contains_key(&key) {
            return Err(GgufError::DuplicateKey(key));
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_owned()))
    }

    fn wrong_type(key: &str, expected: &'static str, actual: ValueType) -> GgufError {
        GgufError::WrongType {
            key: key.to_owned(),
            expected,
            actual,
        }
    }

    fn integer<T: TryFrom<i128>>(&self, key: &str, target: &'static str) -> Result<T, GgufError> {
        let value = self.require(key)?;
        let wide = value
            .as_integer()
            .ok_or_else(|| Self::wrong_type(key, "integer", value.value_type()))?;
        T::try_from(wide).map_err(|_| GgufError::OutOfRange {
            key: key.to_owned(),
            value: wide.to_string(),
            target,
        })
    }

    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.integer(key, "u32")
    }
    pub fn get_i32(&self, key: &str) -> Result<i32, GgufError> {
        self.integer(key, "i32")
    }
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.integer(key, "u64")
    }
    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        self.integer(key, "i64")
    }
    pub fn get_usize(&self, key: &str) -> Result<usize, GgufError> {
        self.integer(key, "usize")
    }

    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        let value = self.require(key)?;
        value
            .as_float()
            .ok_or_else(|| Self::wrong_type(key, "number", value.value_type()))
    }

    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        self.get_f64(key).map(|v| v as f32)
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            Value::Bool(b) => Ok(*b),
            other => Err(Self::wrong_type(key, "bool", other.value_type())),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.require(key)? {
            Value::String(s) => Ok(s),
            other => Err(Self::wrong_type(key, "string", other.value_type())),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<&Array, GgufError> {
        match self.require(key)? {
            Value::Array(a) => Ok(a),
            other => Err(Self::wrong_type(key, "array", other.value_type())),
        }
    }

    /// A string array, e.g. `tokenizer.ggml.tokens` or `tokenizer.ggml.merges`.
    pub fn get_str_array(&self, key: &str) -> Result<&[String], GgufError> {
        match self.get_array(key)? {
            Array::String(v) => Ok(v),
            _ => Err(Self::wrong_type(key, "string array", ValueType::Array)),
        }
    }

    /// An f32 array, e.g. `tokenizer.ggml.scores`.
    pub fn get_f32_array(&self, key: &str) -> Result<&[f32], GgufError> {
        match self.get_array(key)? {
            Array::F32(v) => Ok(v),
            _ => Err(Self::wrong_type(key, "f32 array", ValueType::Array)),
        }
    }

    /// An integer array as i32 (e.g. `tokenizer.ggml.token_type`); accepts any integer element
    /// type whose values fit.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        self.integer_array(key, "i32")
    }

    /// An integer array as u32 (e.g. a list of token ids).
    pub fn get_u32_array(&self, key: &str) -> Result<Vec<u32>, GgufError> {
        self.integer_array(key, "u32")
    }

    fn integer_array<T: TryFrom<i128>>(
        &self,
        key: &str,
        target: &'static str,
    ) -> Result<Vec<T>, GgufError> {
        let wide = self
            .get_array(key)?
            .integers()
            .ok_or_else(|| Self::wrong_type(key, "integer array", ValueType::Array))?;
        wide.into_iter()
            .map(|v| {
                T::try_from(v).map_err(|_| GgufError::OutOfRange {
                    key: key.to_owned(),
                    value: v.to_string(),
                    target,
                })
            })
            .collect()
    }
}

/// Turns "key not found" into `None`, keeping every other error.
pub trait OptionalKey<T> {
    fn optional(self) -> Result<Option<T>, GgufError>;
}

impl<T> OptionalKey<T> for Result<T, GgufError> {
    fn optional(self) -> Result<Option<T>, GgufError> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(GgufError::MissingKey(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}
