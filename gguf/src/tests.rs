use crate::{Array, GgmlType, GgufError, GgufFile, GgufWriter, OptionalKey, Value, ValueType};

fn sample() -> GgufWriter {
    GgufWriter::new()
        .metadata("general.architecture", Value::String("llama".into()))
        .metadata("llama.block_count", Value::U32(2))
        .metadata("llama.rope.freq_base", Value::F32(10000.0))
        .metadata("i8", Value::I8(-3))
        .metadata("u16", Value::U16(7))
        .metadata("i16", Value::I16(-7))
        .metadata("i64", Value::I64(-1))
        .metadata("u64", Value::U64(u64::MAX))
        .metadata("f64", Value::F64(0.25))
        .metadata("flag", Value::Bool(true))
        .metadata("u8", Value::U8(255))
        .metadata(
            "tokens",
            Value::Array(Array::String(vec!["<s>".into(), "a".into(), "ü".into()])),
        )
        .metadata("types", Value::Array(Array::I32(vec![3, 1, 1])))
        .metadata("scores", Value::Array(Array::F32(vec![0.0, -1.5, 2.0])))
        .metadata(
            "nested",
            Value::Array(Array::Array(vec![
                Array::U8(vec![1, 2]),
                Array::Bool(vec![true]),
            ])),
        )
        .tensor(
            "w",
            &[4, 2],
            GgmlType::F32,
            (0..8u32).flat_map(|i| (i as f32).to_le_bytes()).collect(),
        )
        .tensor("q", &[32, 1], GgmlType::Q4_1, vec![9; 20])
}

#[test]
fn round_trips_every_value_type_and_tensor() {
    let file = GgufFile::from_bytes(sample().build()).unwrap();
    let m = file.metadata();
    assert_eq!(file.version(), 3);
    assert_eq!(m.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(m.get_u32("llama.block_count").unwrap(), 2);
    assert_eq!(m.get_usize("llama.block_count").unwrap(), 2);
    assert_eq!(m.get_f32("llama.rope.freq_base").unwrap(), 10000.0);
    assert_eq!(m.get_i32("i8").unwrap(), -3);
    assert_eq!(m.get_u32("u16").unwrap(), 7);
    assert_eq!(m.get_i64("i16").unwrap(), -7);
    assert_eq!(m.get_i64("i64").unwrap(), -1);
    assert_eq!(m.get_u64("u64").unwrap(), u64::MAX);
    assert_eq!(m.get_f64("f64").unwrap(), 0.25);
    assert!(m.get_bool("flag").unwrap());
    assert_eq!(m.get_u32("u8").unwrap(), 255);
    assert_eq!(m.get_str_array("tokens").unwrap(), ["<s>", "a", "ü"]);
    assert_eq!(m.get_i32_array("types").unwrap(), [3, 1, 1]);
    assert_eq!(m.get_u32_array("types").unwrap(), [3, 1, 1]);
    assert_eq!(m.get_f32_array("scores").unwrap(), [0.0, -1.5, 2.0]);
    match m.get_array("nested").unwrap() {
        Array::Array(inner) => assert_eq!(inner[0], Array::U8(vec![1, 2])),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(m.iter().next().unwrap().0, "general.architecture");

    let w = file.tensor("w").unwrap();
    assert_eq!(w.dims, [4, 2]);
    assert_eq!(w.shape(), [2, 4]);
    assert_eq!(w.size_bytes, Some(32));
    let data = file.tensor_data("w").unwrap();
    assert_eq!(&data[4..8], &1f32.to_le_bytes());
    assert_eq!(file.tensor_data("q").unwrap(), &[9; 20]);
    assert_eq!(file.data_offset() % file.alignment(), 0);
    assert!(matches!(
        file.tensor_data("nope"),
        Err(GgufError::MissingTensor(_))
    ));
}

#[test]
fn typed_accessor_errors() {
    let file = GgufFile::from_bytes(sample().build()).unwrap();
    let m = file.metadata();
    assert!(matches!(
        m.get_str("missing"),
        Err(GgufError::MissingKey(_))
    ));
    assert_eq!(m.get_str("missing").optional().unwrap(), None);
    assert!(matches!(
        m.get_str("llama.block_count"),
        Err(GgufError::WrongType {
            actual: ValueType::U32,
            ..
        })
    ));
    assert!(m.get_u32("llama.block_count").optional().unwrap().is_some());
    assert!(matches!(
        m.get_u32("i64"),
        Err(GgufError::OutOfRange { .. })
    ));
    assert!(matches!(
        m.get_u32("u64"),
        Err(GgufError::OutOfRange { .. })
    ));
    assert!(matches!(
        m.get_u32_array("scores"),
        Err(GgufError::WrongType { .. })
    ));
    assert!(matches!(
        m.get_str_array("types"),
        Err(GgufError::WrongType { .. })
    ));
}

#[test]
fn honours_general_alignment() {
    let bytes = GgufWriter::new()
        .metadata("general.alignment", Value::U32(64))
        .tensor("a", &[3], GgmlType::F32, vec![1; 12])
        .tensor("b", &[1], GgmlType::F32, vec![2; 4])
        .build();
    let file = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(file.alignment(), 64);
    assert_eq!(file.data_offset() % 64, 0);
    assert_eq!(file.tensor("b").unwrap().offset, 64);
    assert_eq!(file.tensor_data("b").unwrap(), &[2; 4]);

    let bad = GgufWriter::new()
        .metadata("general.alignment", Value::U32(48))
        .build();
    assert!(matches!(
        GgufFile::from_bytes(bad),
        Err(GgufError::BadAlignment(48))
    ));
}

#[test]
fn rejects_bad_magic_and_version() {
    assert!(matches!(
        GgufFile::from_bytes(b"GGML\x03\0\0\0".to_vec()),
        Err(GgufError::BadMagic { .. })
    ));
    assert!(matches!(
        GgufFile::from_bytes(b"GG".to_vec()),
        Err(GgufError::BadMagic { .. })
    ));
    let mut bytes = sample().build();
    bytes[4] = 1;
    assert!(matches!(
        GgufFile::from_bytes(bytes),
        Err(GgufError::UnsupportedVersion(1))
    ));
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let bytes = sample().build();
    for len in 0..bytes.len() {
        assert!(
            GgufFile::from_bytes(bytes[..len].to_vec()).is_err(),
            "truncated to {len} bytes parsed"
        );
    }
}

#[test]
fn corrupted_bytes_never_panic() {
    // Deterministic pseudo-random corruption of every header byte position.
    let bytes = sample().build();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..4000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let mut corrupt = bytes.clone();
        let pos = (state % 400) as usize % corrupt.len();
        corrupt[pos] = (state >> 32) as u8;
        let _ = GgufFile::from_bytes(corrupt);
    }
}

#[test]
fn huge_counts_are_rejected_before_allocating() {
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    bytes.extend_from_slice(&3u64.to_le_bytes());
    bytes.extend_from_slice(b"key");
    bytes.extend_from_slice(&9u32.to_le_bytes()); // array
    bytes.extend_from_slice(&8u32.to_le_bytes()); // of strings
    bytes.extend_from_slice(&(u64::MAX / 2).to_le_bytes());
    assert!(matches!(
        GgufFile::from_bytes(bytes),
        Err(GgufError::CountTooLarge { .. })
    ));

    let mut header = b"GGUF".to_vec();
    header.extend_from_slice(&3u32.to_le_bytes());
    header.extend_from_slice(&u64::MAX.to_le_bytes());
    header.extend_from_slice(&0u64.to_le_bytes());
    assert!(matches!(
        GgufFile::from_bytes(header),
        Err(GgufError::CountTooLarge { .. })
    ));
}

#[test]
fn tensor_out_of_bounds_or_misshaped_is_rejected() {
    let mut bytes = sample().build();
    bytes.truncate(bytes.len() - 1);
    assert!(matches!(
        GgufFile::from_bytes(bytes),
        Err(GgufError::BadTensor { .. })
    ));
    let bytes = GgufWriter::new()
        .tensor("q", &[16], GgmlType::Q8_0, vec![0; 34])
        .build();
    assert!(matches!(
        GgufFile::from_bytes(bytes),
        Err(GgufError::BadTensor { .. })
    ));
    let dup = GgufWriter::new()
        .tensor("t", &[1], GgmlType::F32, vec![0; 4])
        .tensor("t", &[1], GgmlType::F32, vec![0; 4])
        .build();
    assert!(matches!(
        GgufFile::from_bytes(dup),
        Err(GgufError::DuplicateTensor(_))
    ));
}

#[test]
fn unknown_tensor_types_parse_but_have_no_data_view() {
    let bytes = GgufWriter::new()
        .tensor("x", &[256], GgmlType::Other(23), vec![0; 8])
        .build();
    let file = GgufFile::from_bytes(bytes).unwrap();
    let info = file.tensor("x").unwrap();
    assert_eq!(info.ggml_type, GgmlType::Other(23));
    assert!(matches!(
        file.tensor_data("x"),
        Err(GgufError::BadTensor { .. })
    ));
}

#[test]
fn unknown_value_type_and_bad_utf8_are_errors() {
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    bytes.push(b'k');
    let mut unknown = bytes.clone();
    unknown.extend_from_slice(&99u32.to_le_bytes());
    unknown.extend_from_slice(&[0; 8]);
    assert!(matches!(
        GgufFile::from_bytes(unknown),
        Err(GgufError::UnknownValueType { value_type: 99, .. })
    ));
    let mut utf8 = bytes;
    utf8.extend_from_slice(&8u32.to_le_bytes());
    utf8.extend_from_slice(&2u64.to_le_bytes());
    utf8.extend_from_slice(&[0xff, 0xfe]);
    assert!(matches!(
        GgufFile::from_bytes(utf8),
        Err(GgufError::InvalidUtf8 { .. })
    ));
}
