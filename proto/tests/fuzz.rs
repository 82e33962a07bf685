//! Decoding arbitrary bytes never panics and never allocates without bound: 100k+ random and
//! mutated frames per run (seeded, so a failure reproduces), each a typed error or a message.

mod samples;

use proto::api_worker::{ApiToWorker, WorkerToApi};
use proto::decode;
use proto::tp_api::{ApiToTp, TpToApi};
use proto::worker_tp::{TpToWorker, WorkerToTp};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn decode_all(frame: &[u8]) -> usize {
    let mut ok = 0;
    ok += decode::<ApiToWorker>(frame).is_ok() as usize;
    ok += decode::<WorkerToApi>(frame).is_ok() as usize;
    ok += match decode::<WorkerToTp>(frame) {
        // A step batch that decodes must still pass validation before its rows are read.
        Ok(WorkerToTp::Step(b)) => {
            if b.validate(8).is_ok() {
                assert_eq!(b.rows().count(), b.len());
            }
            1
        }
        Ok(_) => 1,
        Err(_) => 0,
    };
    ok += decode::<ApiToTp>(frame).is_ok() as usize;
    ok += decode::<TpToApi>(frame).is_ok() as usize;
    ok += decode::<TpToWorker>(frame).is_ok() as usize;
    ok
}

fn mutate(rng: &mut ChaCha8Rng, frame: &mut Vec<u8>) {
    for _ in 0..rng.gen_range(1..5) {
        match rng.gen_range(0..6) {
            0 if !frame.is_empty() => {
                let i = rng.gen_range(0..frame.len());
                frame[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if !frame.is_empty() => {
                let i = rng.gen_range(0..frame.len());
                frame[i] = rng.gen();
            }
            2 if !frame.is_empty() => frame.truncate(rng.gen_range(0..frame.len())),
            3 => {
                let i = rng.gen_range(0..=frame.len());
                // MessagePack headers announcing huge lengths: str32, bin32, array32, map32.
                let hdr = [0xdb, 0xc6, 0xdd, 0xdf][rng.gen_range(0..4)];
                frame.splice(i..i, [hdr, 0xff, 0xff, 0xff, 0xf0]);
            }
            4 => {
                let i = rng.gen_range(0..=frame.len());
                frame.insert(i, rng.gen());
            }
            _ => {
                if frame.len() > 1 {
                    let i = rng.gen_range(0..frame.len() - 1);
                    frame.swap(i, i + 1);
                }
            }
        }
    }
}

#[test]
fn random_and_mutated_frames_never_panic() {
    let seeds: Vec<Vec<u8>> = samples::all_frames().into_iter().map(|(_, b)| b).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(0x005E_C01A);
    let mut decoded = 0usize;
    const CASES: usize = 120_000;
    for case in 0..CASES {
        let frame = if case % 3 == 0 {
            let len = rng.gen_range(0..96);
            (0..len).map(|_| rng.gen::<u8>()).collect::<Vec<_>>()
        } else {
            let mut f = seeds[rng.gen_range(0..seeds.len())].clone();
            mutate(&mut rng, &mut f);
            f
        };
        decoded += decode_all(&frame);
    }
    // The mutations must not all be trivially rejected, or the loop tests nothing.
    assert!(
        decoded > 1_000,
        "only {decoded} of {CASES} mutated frames decoded"
    );
}
