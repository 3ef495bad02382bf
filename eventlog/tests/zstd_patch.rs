//! The zstd sled compresses its pages with is the vendored one
//! (`vendor/zstd`, patched in by the workspace's `Cargo.toml`), not the
//! crates.io release: this test fails if the `[patch]` ever stops applying.

/// Text whose literals zstd would Huffman-code at level 1 and stores raw at
/// level -1 (the two levels give different bytes for it upstream).
fn text() -> Vec<u8> {
    (0..400u32)
        .map(|i| format!("word{}", i * 7919 % 1000))
        .collect::<Vec<_>>()
        .join(" ")
        .into_bytes()
}

#[test]
fn sleds_level_1_runs_at_zstds_level_minus_1() {
    let text = text();
    let at_1 = zstd::block::compress(&text, 1).unwrap();
    let at_minus_1 = zstd::block::compress(&text, -1).unwrap();
    let at_2 = zstd::block::compress(&text, 2).unwrap();
    assert_eq!(
        at_1, at_minus_1,
        "vendor/zstd's level mapping is not in effect"
    );
    assert_ne!(at_1, at_2, "levels still differ otherwise");
    assert_eq!(zstd::block::decompress(&at_1, text.len()).unwrap(), text);
}

#[test]
fn a_thread_reuses_its_contexts_across_calls() {
    // Nested use (a context in use on this thread) falls back to a new one.
    let text = text();
    for _ in 0..3 {
        let packed = zstd::block::compress(&text, 1).unwrap();
        assert_eq!(zstd::block::decompress(&packed, text.len()).unwrap(), text);
        assert_eq!(
            zstd::stream::decode_all(&zstd::stream::encode_all(&text[..], 1).unwrap()[..]).unwrap(),
            text
        );
    }
}
