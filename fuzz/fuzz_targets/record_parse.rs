//! Any bytes given to `OwnerRecord::parse` either are refused or parse into a
//! record that serializes and parses back to itself (what `renew` relies on
//! when it rewrites a record it read).
#![no_main]

use libfuzzer_sys::fuzz_target;
use skill_lock::record::OwnerRecord;

fuzz_target!(|data: &[u8]| {
    let Ok(rec) = OwnerRecord::parse(data) else {
        return;
    };
    let bytes = rec.to_bytes().expect("a parsed record serializes");
    let again = OwnerRecord::parse(&bytes).unwrap_or_else(|why| {
        panic!(
            "a parsed record does not parse after to_bytes ({why}): {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    assert_eq!(again, rec, "the record changed through to_bytes");
});
