//! Any bytes given to `OwnerRecord::parse` either are refused or parse into a
//! record that serializes and parses back to itself (what `renew` relies on
//! when it rewrites a record it read), and parsing never panics. Its host
//! and note, whatever they carry, are shown with nothing a terminal acts on.
//!
//! Two inputs per run: the raw bytes, and a well-formed record whose three
//! times are built from the same bytes as RFC 3339 text with edge-biased
//! years, days, clock times, fractions and offsets (raw mutation alone
//! rarely reaches a complete record with a time at the edge of the range).
#![no_main]

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use skill_lock::record::OwnerRecord;
use skill_lock::fuzzing::{is_unsafe, to_writer, visible};

fn round_trip(data: &[u8]) {
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
    shown_safely(&rec);
}

/// Whatever a record's host and note carry (a store writer can forge
/// them), they reach a terminal as text it only displays: escaped on one
/// line for stderr, and in JSON that reads back as stored (SPEC §3).
fn shown_safely(rec: &OwnerRecord) {
    let holder = &rec.holder;
    for text in [Some(holder.host.as_str()), holder.note.as_deref()].into_iter().flatten() {
        let shown = visible(text);
        assert!(!shown.chars().any(is_unsafe), "{shown:?}");
    }
    let mut line = Vec::new();
    to_writer(&mut line, holder).expect("a holder serializes");
    let line = String::from_utf8(line).expect("JSON is UTF-8");
    assert!(!line.chars().any(is_unsafe), "{line:?}");
    let back: serde_json::Value = serde_json::from_str(&line).expect("JSON reads back");
    assert_eq!(back["host"].as_str(), Some(holder.host.as_str()));
    assert_eq!(back["note"].as_str(), holder.note.as_deref());
}

fn pick(u: &mut Unstructured, edges: &[u32], lo: u32, hi: u32) -> Result<u32> {
    let i = u.choose_index(edges.len() + 1)?;
    match edges.get(i) {
        Some(&e) => Ok(e),
        None => u.int_in_range(lo..=hi),
    }
}

fn days_in(year: u32, month: u32) -> u32 {
    match month {
        2 if (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400) => {
            29
        }
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// An RFC 3339 time, biased to the edges of what the format can say.
fn time(u: &mut Unstructured) -> Result<String> {
    let year = pick(u, &[0, 1, 1969, 1970, 2026, 9998, 9999], 0, 9999)?;
    let month = pick(u, &[1, 2, 12], 1, 12)?;
    let last = days_in(year, month);
    let day = pick(u, &[1, last], 1, last)?;
    let hour = pick(u, &[0, 23], 0, 23)?;
    let minute = pick(u, &[0, 59], 0, 59)?;
    let second = pick(u, &[0, 59, 60], 0, 59)?;
    let frac = match u.choose_index(3)? {
        0 => String::new(),
        1 => ".999999999".to_owned(),
        _ => format!(".{}", u.int_in_range(0..=999_999u32)?),
    };
    let offset = match u.choose_index(3)? {
        0 => "Z".to_owned(),
        sign => format!(
            "{}{:02}:{:02}",
            if sign == 1 { '+' } else { '-' },
            pick(u, &[0, 23], 0, 23)?,
            pick(u, &[0, 1, 59], 0, 59)?
        ),
    };
    Ok(format!(
        "{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}{frac}{offset}"
    ))
}

fn structured(data: &[u8]) -> Result<Vec<u8>> {
    let mut u = Unstructured::new(data);
    let started = time(&mut u)?;
    let expires = time(&mut u)?;
    let renewed = if u.arbitrary::<bool>()? {
        format!("\"{}\"", time(&mut u)?)
    } else {
        "null".to_owned()
    };
    let fence: u64 = u.arbitrary()?;
    let ttl: u64 = u.arbitrary()?;
    Ok(format!(
        "{{\"skill\":\"s\",\"repo\":\"o/r\",\"started\":\"{started}\",\"expires\":\"{expires}\",\
         \"renewed\":{renewed},\"ttl\":{ttl},\"note\":null,\"host\":\"h\",\"owner_pid\":null,\
         \"fence\":{fence},\"boot_id\":null,\"owner_start\":null,\"deadline_boot_ms\":null,\
         \"format\":1,\"token_sha256\":\"{}\"}}",
        "a".repeat(64)
    )
    .into_bytes())
}

fuzz_target!(|data: &[u8]| {
    round_trip(data);
    if let Ok(record) = structured(data) {
        round_trip(&record);
    }
});
