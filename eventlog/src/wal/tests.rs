use super::*;

fn key(n: u8) -> Vec<u8> {
    vec![n; KEY_LEN]
}

/// A file at `path` holding one frame per value, all keyed `key(1)`;
/// returns its bytes up to the end of the last frame.
fn written(path: &Path, values: &[&[u8]]) -> Vec<u8> {
    let (mut wal, _) = Wal::open(path).unwrap();
    for value in values {
        wal.append(&[(key(1), value.to_vec())]).unwrap();
    }
    let mut bytes = std::fs::read(path).unwrap();
    bytes.truncate(wal.len() as usize);
    bytes
}

fn values(frames: &[Frame]) -> Vec<&[u8]> {
    frames.iter().map(|(_, v)| v.as_slice()).collect()
}

#[test]
fn frames_survive_reopen_and_a_torn_tail_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wal");
    let whole = {
        let (mut wal, frames) = Wal::open(&path).unwrap();
        assert!(frames.is_empty() && wal.is_empty());
        wal.append(&[(key(7), b"one".to_vec()), (key(7), b"two".to_vec())])
            .unwrap();
        let whole = wal.len();
        // A crash in the middle of a third frame's write: its last
        // bytes never reached the preallocated zeros.
        wal.append(&[(key(7), b"three".to_vec())]).unwrap();
        wal.file.write_all_at(&[0; 3], wal.len() - 3).unwrap();
        whole
    };
    let bytes = std::fs::read(&path).unwrap();
    let torn_end = whole as usize + FRAME_HEADER + KEY_LEN + b"th".len();
    assert!(bytes[torn_end..].iter().all(|&b| b == 0));
    let (mut wal, frames) = Wal::open(&path).unwrap();
    assert_eq!(
        frames,
        vec![(key(7), b"one".to_vec()), (key(7), b"two".to_vec())]
    );
    assert_eq!(wal.len(), whole);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), whole);
    let torn = wal.torn_tail().unwrap().clone();
    assert_eq!(torn.saved_to, path.with_file_name("wal.torn-1"));
    assert_eq!(
        std::fs::read(&torn.saved_to).unwrap(),
        bytes[whole as usize..torn_end],
        "the torn tail is kept aside, without the zeros after it"
    );
    // Appends go on from the cut, chained from the last whole frame.
    wal.append(&[(key(7), b"four".to_vec())]).unwrap();
    drop(wal);
    let (_, frames) = Wal::open(&path).unwrap();
    assert_eq!(values(&frames), [&b"one"[..], b"two", b"four"]);
}

#[test]
fn the_file_grows_ahead_in_zeros_that_are_not_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wal");
    let size = || std::fs::metadata(&path).unwrap().len();
    let (mut wal, _) = Wal::open(&path).unwrap();
    wal.append(&[(key(1), b"first".to_vec())]).unwrap();
    let grown = size();
    assert_eq!(grown, wal.len() + PREALLOCATED as u64);
    // Appends that fit are written over the zeros: the file keeps its size.
    let value = vec![7u8; 1000];
    let mut appended = 1;
    while wal.len() + 2 * 1100 < grown {
        wal.append(&[(key(1), value.clone())]).unwrap();
        appended += 1;
        assert_eq!(size(), grown);
    }
    // One that passes the end writes another run of zeros after itself;
    // the last frame's own bytes end in zeros.
    let last = [&value[..], &[0; 1200]].concat();
    wal.append(&[(key(1), last.clone())]).unwrap();
    appended += 1;
    assert_eq!(size(), wal.len() + PREALLOCATED as u64);
    let end = wal.len();
    drop(wal);
    let (mut wal, frames) = Wal::open(&path).unwrap();
    assert_eq!(frames.len(), appended);
    assert_eq!(frames.last().unwrap().1, last, "whole, zeros and all");
    assert!(
        wal.torn_tail().is_none(),
        "the zeros after it are no torn tail"
    );
    assert_eq!(wal.len(), end);
    assert_eq!(size(), end + PREALLOCATED as u64, "the zeros are kept");
    wal.append(&[(key(1), b"after reopening".to_vec())])
        .unwrap();
    assert_eq!(size(), end + PREALLOCATED as u64, "and written over");
    drop(wal);
    let (_, frames) = Wal::open(&path).unwrap();
    assert_eq!(frames.len(), appended + 1);
}

/// One step of [`any_history_reads_back_and_a_torn_last_append_loses_only_itself`].
#[derive(Debug, Clone)]
enum Step {
    /// Append one frame per value, in one write.
    Append(Vec<Vec<u8>>),
    /// Empty the file (a checkpoint).
    Empty,
    /// Close and open again.
    Reopen,
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        8 => proptest::collection::vec(step_value(100_000), 1..4).prop_map(Step::Append),
        1 => Just(Step::Empty),
        2 => Just(Step::Reopen),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Across appends (some past the zeros written ahead, some of zeros
    /// themselves), emptyings and reopenings, opening
    /// returns exactly the frames appended since the last
    /// emptying; a last append whose end never reached the disk (its
    /// bytes from some point on still zeros) is set aside, and only it.
    #[test]
    fn any_history_reads_back_and_a_torn_last_append_loses_only_itself(
        steps in proptest::collection::vec(step(), 1..24),
        torn in proptest::option::of((proptest::collection::vec(proptest::prelude::any::<u8>(), 1..3_000), 0.0f64..1.0)),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal");
        let (mut wal, _) = Wal::open(&path).unwrap();
        let mut expected: Vec<Vec<u8>> = Vec::new();
        for step in steps {
            match step {
                Step::Append(values) => {
                    let frames: Vec<Frame> = values.iter().map(|v| (key(1), v.clone())).collect();
                    wal.append(&frames).unwrap();
                    expected.extend(values);
                }
                Step::Empty => {
                    wal.truncate().unwrap();
                    expected.clear();
                }
                Step::Reopen => {
                    drop(wal);
                    let (reopened, frames) = Wal::open(&path).unwrap();
                    proptest::prop_assert!(reopened.torn_tail().is_none());
                    proptest::prop_assert_eq!(values(&frames), expected.iter().map(Vec::as_slice).collect::<Vec<_>>());
                    wal = reopened;
                }
            }
            let size = std::fs::metadata(&path).unwrap().len();
            proptest::prop_assert!(size >= wal.len() && size <= wal.len() + PREALLOCATED as u64);
        }
        let mut kept = Vec::new();
        if let Some((value, at)) = &torn {
            let start = wal.len();
            wal.append(&[(key(1), value.clone())]).unwrap();
            let end = wal.len();
            // The write reached the disk only up to some byte of its frame.
            let cut = start + ((end - start) as f64 * at) as u64;
            let bytes = std::fs::read(&path).unwrap();
            if bytes[cut as usize..end as usize].iter().all(|&b| b == 0) {
                // What it lost were zeros: the frame is whole after all.
                expected.push(value.clone());
            } else {
                kept = bytes[start as usize..cut as usize].to_vec();
            }
            wal.file.write_all_at(&vec![0; (end - cut) as usize], cut).unwrap();
        }
        drop(wal);
        let (wal, frames) = Wal::open(&path).unwrap();
        proptest::prop_assert_eq!(values(&frames), expected.iter().map(Vec::as_slice).collect::<Vec<_>>());
        match wal.torn_tail() {
            None => proptest::prop_assert!(kept.iter().all(|&b| b == 0)),
            Some(tail) => {
                let aside = std::fs::read(&tail.saved_to).unwrap();
                proptest::prop_assert!(!aside.is_empty() && kept.starts_with(&aside));
            }
        }
    }

    /// Appends after the last sync, written over the zeros the file was
    /// grown with, of which a power cut kept any sectors and lost the
    /// others: opening never refuses, returns every synced frame, and
    /// of the unsynced ones exactly those before the first that lost a
    /// sector.
    #[test]
    fn a_power_cut_that_keeps_any_unsynced_sectors_loses_only_unsynced_frames(
        synced in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..1_500), 1..6),
        unsynced in proptest::collection::vec(step_value(3_000), 1..8),
        lost in proptest::collection::vec(proptest::prelude::any::<bool>(), 1..64),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal");
        let (mut wal, _) = Wal::open(&path).unwrap();
        for value in &synced {
            wal.append(&[(key(1), value.clone())]).unwrap();
        }
        wal.file.sync_data().unwrap();
        let durable = wal.len() as usize;
        let mut ends = Vec::new();
        for value in &unsynced {
            wal.append(&[(key(1), value.clone())]).unwrap();
            ends.push(wal.len() as usize);
        }
        let written = std::fs::read(&path).unwrap();
        // Sectors from the first one the unsynced appends touched; each
        // is lost or kept (a lost one still holds the grown-in zeros).
        let first = durable / SECTOR;
        let mut changed_at = usize::MAX;
        for (i, &lose) in lost.iter().enumerate() {
            let sector = ((first + i) * SECTOR)..((first + i + 1) * SECTOR);
            let from = sector.start.max(durable);
            let to = sector.end.min(wal.len() as usize);
            if !lose || from >= to {
                continue;
            }
            if let Some(first_changed) = written[from..to].iter().position(|&b| b != 0) {
                changed_at = changed_at.min(from + first_changed);
            }
            wal.file.write_all_at(&vec![0; to - from], from as u64).unwrap();
        }
        drop(wal);
        let (_, frames) = Wal::open(&path)
            .map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
        let kept = ends.iter().take_while(|&&end| end <= changed_at).count();
        let expected: Vec<&[u8]> = synced
            .iter()
            .chain(&unsynced[..kept])
            .map(Vec::as_slice)
            .collect();
        proptest::prop_assert_eq!(values(&frames), expected);
    }
}

/// A record's value for the property tests: bytes, or a run of fewer
/// than `max_zeros` zeros.
fn step_value(max_zeros: usize) -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
    use proptest::prelude::*;
    prop_oneof![
        8 => proptest::collection::vec(any::<u8>(), 0..2_000),
        1 => (1usize..max_zeros).prop_map(|n| vec![0; n]),
    ]
}

#[test]
fn a_damaged_last_frame_is_cut_but_a_damaged_middle_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wal");
    let good = written(&path, &[b"aaaa", b"bbbb"]);
    let mut bytes = good.clone();
    let n = bytes.len();
    bytes[n - 1] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let (_, frames) = Wal::open(&path).unwrap();
    assert_eq!(values(&frames), [b"aaaa"]);
    for (at, what) in [(FILE_HEADER + 9, "length"), (FILE_HEADER + 3, "salt")] {
        let mut bytes = good.clone();
        bytes[at] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let err = Wal::open(&path)
            .err()
            .unwrap_or_else(|| panic!("damage to the {what} before the tail is refused"));
        assert!(
            err.to_string()
                .contains(&format!("damaged at byte {FILE_HEADER}")),
            "{what}: {err}"
        );
    }
}

#[test]
fn sectors_a_power_cut_kept_past_one_it_lost_are_a_torn_tail_not_damage() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wal");
    // Unsynced appends over the zeros the file was grown with: the disk
    // may keep a later sector of them and lose an earlier one.
    let lose = |wal: &Wal, range: std::ops::Range<u64>| {
        let zeros = vec![0; (range.end - range.start) as usize];
        wal.file.write_all_at(&zeros, range.start).unwrap();
    };
    for (case, lost) in [("the sector a frame starts in", 0), ("one inside it", 1)] {
        let _ = std::fs::remove_file(&path);
        let (mut wal, _) = Wal::open(&path).unwrap();
        wal.append(&[(key(1), b"synced".to_vec())]).unwrap();
        wal.file.sync_data().unwrap();
        let synced = wal.len();
        wal.append(&[(key(1), vec![b'c'; 5000])]).unwrap();
        wal.append(&[(key(1), b"d".to_vec())]).unwrap();
        let first_sector = (synced as usize / SECTOR + lost) * SECTOR;
        let from = synced.max(first_sector as u64);
        lose(&wal, from..(first_sector + SECTOR) as u64);
        let written = std::fs::read(&path).unwrap()[synced as usize..wal.len() as usize]
            .iter()
            .rposition(|&b| b != 0)
            .unwrap()
            + 1;
        drop(wal);
        let (wal, frames) = Wal::open(&path).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(values(&frames), [b"synced"], "{case}");
        assert_eq!(wal.len(), synced, "{case}");
        let torn = wal.torn_tail().expect("the unsynced appends are set aside");
        assert_eq!(
            torn.bytes, written,
            "{case}: both unsynced frames, kept aside"
        );
    }
}

#[test]
fn a_frame_that_does_not_chain_from_the_one_before_is_not_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wal");
    let (mut wal, _) = Wal::open(&path).unwrap();
    wal.append(&[(key(1), b"aaaa".to_vec())]).unwrap();
    let Some(Format::V2 { salt }) = wal.format else {
        panic!("a version 2 file")
    };
    // Right salt, right offset, but chained from something else; then a
    // frame chained from it.
    let second = wal.len();
    let mut bytes = Vec::new();
    let sum = encode_frame(&mut bytes, salt, second, !wal.chain, &key(1), b"bbbb").unwrap();
    let third = second + bytes.len() as u64;
    encode_frame(&mut bytes, salt, third, sum, &key(1), b"cccc").unwrap();
    wal.file.write_all_at(&bytes, second).unwrap();
    drop(wal);
    let err = Wal::open(&path).err().expect("a broken chain is refused");
    assert!(
        err.to_string()
            .contains(&format!("damaged at byte {second}")),
        "{err}"
    );
}

#[test]
fn a_payload_holding_a_whole_frame_then_torn_is_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wal");
    let first = written(&path, &[b"genuine"]);
    // A record carrying a byte-for-byte copy of the file's own frame,
    // then a frame made for the exact offset it lands at and chained from
    // the first frame, under a guessed salt.
    let copy = first[FILE_HEADER..].to_vec();
    let mut forged = Vec::new();
    let lands_at = first.len() + FRAME_HEADER + KEY_LEN + copy.len();
    let (Some(Format::V2 { salt }), chain) = ({
        let (wal, _) = Wal::open(&path).unwrap();
        (wal.format, wal.chain)
    }) else {
        panic!("a version 2 file")
    };
    let guess = salt.map(|b| b ^ 0x5a);
    encode_frame(
        &mut forged,
        guess,
        lands_at as u64,
        chain,
        &key(2),
        b"forged",
    )
    .unwrap();
    let payload = [copy.as_slice(), &forged, b"and the rest of the reply"].concat();
    let all = {
        let (mut wal, _) = Wal::open(&path).unwrap();
        wal.append(&[(key(1), payload)]).unwrap();
        std::fs::read(&path).unwrap()
    };
    assert_eq!(all[lands_at..lands_at + forged.len()], forged[..]);
    // Torn right after the forged frames.
    let cut = lands_at + forged.len();
    std::fs::write(&path, &all[..cut]).unwrap();
    let (wal, frames) = Wal::open(&path).unwrap();
    assert_eq!(values(&frames), [b"genuine"]);
    let torn = wal.torn_tail().expect("a torn tail, not damage");
    assert_eq!(torn.bytes, cut - first.len());
    // The same forgery under the file's own salt would be whole there:
    // the salt alone is what tells it apart.
    let mut knowing = Vec::new();
    encode_frame(
        &mut knowing,
        salt,
        lands_at as u64,
        chain,
        &key(2),
        b"forged",
    )
    .unwrap();
    let mut bytes = all[..lands_at].to_vec();
    bytes.extend_from_slice(&knowing);
    assert!(whole_at(Format::V2 { salt }, &bytes, lands_at).is_some());
}

#[test]
fn a_v1_file_still_opens_and_is_emptied_into_the_newest_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wal");
    let v1 = v1_file();
    // A torn last write is told apart in version 1 too.
    std::fs::write(&path, [&v1[..], &v1[..20]].concat()).unwrap();
    let (mut wal, frames) = Wal::open(&path).unwrap();
    assert_eq!(frames.len(), 3);
    assert_eq!(wal.torn_tail().map(|t| t.bytes), Some(20));
    assert_eq!(std::fs::read(&path).unwrap(), v1, "left in version 1");
    assert!(!wal.is_empty());
    let err = wal.append(&[(key(1), b"new".to_vec())]).unwrap_err();
    assert!(err.to_string().contains("version 1"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), v1, "formats never mix");
    wal.truncate().unwrap();
    assert!(wal.is_empty());
    assert_eq!(std::fs::read(&path).unwrap()[..8], *b"MWAL\x03\0\0\0");
    wal.append(&[(key(1), b"new".to_vec())]).unwrap();
    drop(wal);
    let (_, frames) = Wal::open(&path).unwrap();
    assert_eq!(values(&frames), [b"new"]);
}

/// A version 2 file (the same frames under a header saying 2) holding
/// `values`.
fn v2_file(values: &[&[u8]]) -> Vec<u8> {
    let salt = [7u8; 8];
    let mut bytes = b"MWAL".to_vec();
    bytes.extend_from_slice(&2u32.to_le_bytes());
    bytes.extend_from_slice(&salt);
    let mut chain = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&chain.to_le_bytes());
    for (i, value) in values.iter().enumerate() {
        let offset = bytes.len() as u64;
        chain = encode_frame(&mut bytes, salt, offset, chain, &key(i as u8 + 1), value).unwrap();
    }
    bytes
}

#[test]
fn a_version_2_file_is_read_and_starts_afresh_in_version_3_once_empty() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wal");
    let version = |path: &Path| std::fs::read(path).unwrap()[4];
    // With frames: read as they are, left in version 2 until emptied.
    std::fs::write(&path, v2_file(&[b"one", b"two"])).unwrap();
    let (mut wal, frames) = Wal::open(&path).unwrap();
    assert_eq!(values(&frames), [&b"one"[..], b"two"]);
    assert_eq!(version(&path), 2);
    wal.truncate().unwrap();
    assert_eq!(version(&path), 3);
    drop(wal);
    // Without: version 3 as soon as it is opened.
    std::fs::write(&path, v2_file(&[])).unwrap();
    let (wal, frames) = Wal::open(&path).unwrap();
    assert!(frames.is_empty() && wal.is_empty());
    assert_eq!(version(&path), 3);
}

#[test]
fn every_emptying_draws_a_new_salt_and_a_short_header_is_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wal");
    let (mut wal, _) = Wal::open(&path).unwrap();
    let salt = |path: &Path| std::fs::read(path).unwrap()[8..16].to_vec();
    let before = salt(&path);
    wal.append(&[(key(1), b"x".to_vec())]).unwrap();
    wal.truncate().unwrap();
    assert_ne!(salt(&path), before);
    drop(wal);
    // A crash while the header was being written.
    let header = std::fs::read(&path).unwrap();
    std::fs::write(&path, &header[..11]).unwrap();
    let (wal, frames) = Wal::open(&path).unwrap();
    assert!(frames.is_empty() && wal.is_empty());
    assert_eq!(wal.torn_tail().map(|t| t.bytes), Some(11));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), FILE_HEADER as u64);
}

#[test]
fn after_a_failed_emptying_the_next_append_starts_the_file_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wal");
    let (mut wal, _) = Wal::open(&path).unwrap();
    wal.append(&[(key(1), b"checkpointed".to_vec())]).unwrap();
    // Emptying fails (here: on a descriptor it cannot write).
    let writable = std::mem::replace(&mut wal.file, File::open(&path).unwrap());
    assert!(wal.truncate().is_err());
    assert!(!wal.is_empty(), "a checkpoint will try again");
    wal.file = writable;
    wal.append(&[(key(1), b"next".to_vec())]).unwrap();
    drop(wal);
    let (wal, frames) = Wal::open(&path).unwrap();
    assert_eq!(values(&frames), [b"next"]);
    assert!(wal.torn_tail().is_none());
}

/// The side files next to `path`'s file, with their bytes, by name.
fn side_files(path: &Path) -> Vec<(String, Vec<u8>)> {
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let mut found: Vec<(String, Vec<u8>)> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with(&name) && n.len() > name.len()
        })
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p.file_name().unwrap().to_string_lossy().into_owned(), bytes)
        })
        .collect();
    found.sort();
    found
}

#[test]
fn after_a_failed_cut_back_the_next_append_lands_where_its_checksum_says() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wal");
    let (mut wal, _) = Wal::open(&path).unwrap();
    wal.append(&[(key(1), b"acked".to_vec())]).unwrap();
    let end = wal.len();
    // The next append's write gets part way (its first bytes reach the
    // file), then fails, and so does cutting back: the descriptor can
    // no longer write (as after EIO).
    wal.file.write_all_at(b"a partial fr", end).unwrap();
    let writable = std::mem::replace(&mut wal.file, File::open(&path).unwrap());
    assert!(wal.append(&[(key(1), b"refused".to_vec())]).is_err());
    let end = end as usize;
    assert_eq!(
        &std::fs::read(&path).unwrap()[end..end + 12],
        b"a partial fr"
    );
    // The disk recovers; the next append is acknowledged.
    wal.file = writable;
    wal.append(&[(key(1), b"acked too".to_vec())]).unwrap();
    drop(wal);
    let (wal, frames) = Wal::open(&path).unwrap();
    assert_eq!(values(&frames), [&b"acked"[..], b"acked too"]);
    assert!(wal.torn_tail().is_none(), "nothing was torn");
}

#[test]
fn while_a_failed_cut_back_cannot_be_redone_appends_are_refused_until_an_emptying() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wal");
    let (mut wal, _) = Wal::open(&path).unwrap();
    let writable = std::mem::replace(&mut wal.file, File::open(&path).unwrap());
    assert!(wal.append(&[(key(1), b"refused".to_vec())]).is_err());
    let err = wal.append(&[(key(1), b"refused".to_vec())]).unwrap_err();
    assert!(
        err.to_string().contains("appends are refused until"),
        "{err}"
    );
    assert!(!wal.is_empty(), "a checkpoint must empty it");
    wal.file = writable;
    wal.truncate().unwrap();
    assert!(wal.is_empty());
    wal.append(&[(key(1), b"after".to_vec())]).unwrap();
    drop(wal);
    let (_, frames) = Wal::open(&path).unwrap();
    assert_eq!(values(&frames), [b"after"]);
}

#[test]
fn an_interrupted_emptying_is_set_aside_and_the_file_starts_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wal");
    let header = written(&path, &[])[..FILE_HEADER].to_vec();
    let mut bad_check = header.clone();
    bad_check[FILE_HEADER - 1] ^= 1;
    let cases: [(&str, Vec<u8>); 4] = [
        ("zero-filled header", vec![0; FILE_HEADER]),
        ("zero-filled part of a header", vec![0; 7]),
        ("header failing its checksum", bad_check),
        ("header cut short", header[..13].to_vec()),
    ];
    for (what, bytes) in cases {
        std::fs::write(&path, &bytes).unwrap();
        let (mut wal, frames) = Wal::open(&path).unwrap_or_else(|e| panic!("{what}: refused: {e}"));
        assert!(frames.is_empty() && wal.is_empty(), "{what}");
        let torn = wal.torn_tail().expect("set aside and named").clone();
        assert_eq!(torn.bytes, bytes.len(), "{what}");
        assert_eq!(std::fs::read(&torn.saved_to).unwrap(), bytes, "{what}");
        wal.append(&[(key(1), b"new".to_vec())]).unwrap();
        drop(wal);
        let (_, frames) = Wal::open(&path).unwrap();
        assert_eq!(values(&frames), [b"new"], "{what}");
    }
}

#[test]
fn a_bad_header_with_bytes_after_it_or_an_unknown_format_is_refused_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wal");
    let good = written(&path, &[b"aaaa"]);
    let flipped = |at: usize| {
        let mut bytes = good.clone();
        bytes[at] ^= 1;
        bytes
    };
    // A header of a newer format that checks out, with nothing after it.
    let mut newer = good[..FILE_HEADER].to_vec();
    newer[4] = 4;
    let check = crc32fast::hash(&newer[..16]);
    newer[16..].copy_from_slice(&check.to_le_bytes());
    let cases: [(Vec<u8>, &str); 7] = [
        (flipped(10), "its header fails its checksum"),
        (flipped(4), "its header fails its checksum"),
        (flipped(5), "format version 259"),
        (flipped(0), "not a mneme write-ahead file"),
        (vec![0; FILE_HEADER + 1], "not a mneme write-ahead file"),
        (vec![0; good.len()], "not a mneme write-ahead file"),
        (newer, "format version 4"),
    ];
    for (bytes, expected) in cases {
        std::fs::write(&path, &bytes).unwrap();
        let err = Wal::open(&path).err().expect("refused");
        assert!(err.to_string().contains(expected), "{bytes:?}: {err}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "left as it was");
    }
    assert!(side_files(&path).is_empty(), "nothing set aside");
}

#[test]
fn every_torn_tail_gets_its_own_side_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wal");
    let mut torn = Vec::new();
    for value in [&b"first torn"[..], b"second torn"] {
        let (mut wal, _) = Wal::open(&path).unwrap();
        let start = wal.len() as usize;
        wal.append(&[(key(1), value.to_vec())]).unwrap();
        let end = wal.len() as usize;
        drop(wal);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..end - 2]).unwrap();
        torn.push(bytes[start..end - 2].to_vec());
    }
    let (wal, frames) = Wal::open(&path).unwrap();
    assert!(frames.is_empty());
    assert!(wal.torn_tail().is_some());
    let kept: Vec<Vec<u8>> = side_files(&path).into_iter().map(|(_, b)| b).collect();
    assert_eq!(kept, torn, "both torn tails are kept, in order");
}
