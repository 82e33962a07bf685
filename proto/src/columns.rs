//! Integer columns as one MessagePack `bin` of little-endian values instead of an array of
//! MessagePack integers: a step batch's ids, offsets and tokens then decode with one bulk copy
//! rather than a marker read and a branch per value (the bulk of a 512-row batch's decode).
//!
//! A `bin` whose length is not a multiple of the value width is an error, never a panic.

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserializer, Serializer};

/// A fixed-width little-endian integer.
pub trait LeInt: Copy {
    const WIDTH: usize;
    const NAME: &'static str;
    fn write_le(self, out: &mut Vec<u8>);
    fn read_le(bytes: &[u8]) -> Self;
}

macro_rules! le_int {
    ($($t:ty),*) => {$(
        impl LeInt for $t {
            const WIDTH: usize = std::mem::size_of::<$t>();
            const NAME: &'static str = concat!("little-endian ", stringify!($t), " values");
            #[inline]
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            #[inline]
            fn read_le(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().expect("chunk of WIDTH bytes"))
            }
        }
    )*};
}

le_int!(u16, u32, u64);

/// `#[serde(with = "crate::columns")]` on a `Vec<u16>`, `Vec<u32>` or `Vec<u64>`.
pub fn serialize<T: LeInt, S: Serializer>(values: &[T], serializer: S) -> Result<S::Ok, S::Error> {
    let mut bytes = Vec::with_capacity(values.len() * T::WIDTH);
    for &v in values {
        v.write_le(&mut bytes);
    }
    serializer.serialize_bytes(&bytes)
}

pub fn deserialize<'de, T: LeInt, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<T>, D::Error> {
    deserializer.deserialize_bytes(LeVisitor::<T>(std::marker::PhantomData))
}

struct LeVisitor<T>(std::marker::PhantomData<T>);

impl<T: LeInt> Visitor<'_> for LeVisitor<T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(T::NAME)
    }

    fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<Vec<T>, E> {
        if !bytes.len().is_multiple_of(T::WIDTH) {
            return Err(E::invalid_length(bytes.len(), &self));
        }
        Ok(bytes.chunks_exact(T::WIDTH).map(T::read_le).collect())
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Columns {
        #[serde(with = "super")]
        small: Vec<u32>,
        #[serde(with = "super")]
        wide: Vec<u64>,
    }

    #[test]
    fn round_trips_extremes() {
        let c = Columns {
            small: vec![0, 1, 0x7f, 0x80, 0xffff, u32::MAX],
            wide: vec![0, u64::MAX, 1 << 40],
        };
        let bytes = rmp_serde::to_vec(&c).unwrap();
        assert_eq!(rmp_serde::from_slice::<Columns>(&bytes).unwrap(), c);
        let empty = Columns {
            small: vec![],
            wide: vec![],
        };
        let bytes = rmp_serde::to_vec(&empty).unwrap();
        assert_eq!(rmp_serde::from_slice::<Columns>(&bytes).unwrap(), empty);
    }

    #[test]
    fn a_ragged_bin_is_an_error() {
        // [bin8 of 3 bytes, bin8 of 0 bytes]: 3 is not a multiple of 4.
        let bytes = [0x92, 0xc4, 3, 1, 2, 3, 0xc4, 0];
        let err = rmp_serde::from_slice::<Columns>(&bytes).unwrap_err();
        assert!(err.to_string().contains("invalid length 3"), "{err}");
    }

    #[test]
    fn an_integer_array_is_refused() {
        // The old encoding (an array of integers) is a type error, not a silent misread.
        let bytes = [0x92, 0x91, 0x01, 0xc4, 0];
        assert!(rmp_serde::from_slice::<Columns>(&bytes).is_err());
    }
}
