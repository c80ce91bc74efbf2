//! The spare segment (`spare.rs`): the file a roll takes is the file that ends up under the
//! segment's name, whatever a preparation of the next spare does meanwhile.

use std::time::{Duration, Instant};

use super::disk::Disk;
use crate::redb_backend::spare::Spare;
use crate::redb_backend::wal::{self, HEADER_BYTES};

const BYTES: u64 = 64 * 1024;

#[test]
fn a_preparation_during_a_take_cannot_give_the_segments_name_to_another_file() {
    let disk = Disk::default();
    let log = disk.log_dir();
    let spare = Spare::default();
    spare.prepare(log.as_ref(), BYTES).unwrap();
    let name = wal::segment_name(log.stem(), 1);
    let header = wal::encode_header(7, 1);
    disk.delay_renames(Duration::from_millis(100));
    let taken = std::thread::scope(|s| {
        let taker = s.spawn(|| spare.take_as(log.as_ref(), &name, &header));
        // The take is renaming (its slot emptied): now the next spare is prepared.
        let deadline = Instant::now() + Duration::from_secs(10);
        while disk.renames_begun() == 0 {
            assert!(Instant::now() < deadline, "the take never renamed");
            std::thread::yield_now();
        }
        spare.prepare(log.as_ref(), BYTES).unwrap();
        taker.join().unwrap().unwrap().expect("a spare was ready")
    });
    // What the log writes into the taken file is what the segment's name holds.
    taken.write_at(HEADER_BYTES, b"record").unwrap();
    let segment = log.open(&name).unwrap();
    assert_eq!(wal::read_header(segment.as_ref()), Ok(Some((7, 1))));
    let mut record = [0u8; 6];
    segment.read_at(HEADER_BYTES, &mut record).unwrap();
    assert_eq!(&record, b"record");
    // And the new spare is a different, unused file.
    let next = log.open(&wal::spare_name(log.stem())).unwrap();
    assert_eq!(wal::read_header(next.as_ref()), Ok(None));
}
