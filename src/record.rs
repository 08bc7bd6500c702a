//! Owner record (SPEC §4): who holds a lock, until when, and the proof of
//! ownership kept only as a SHA-256 hash.
//!
//! [`Holder`] is everything that may be shown; [`OwnerRecord`] adds the token
//! hash. Because the hash lives only in the outer type, no output can carry
//! it by accident. Parsing never panics. A record of this version is read
//! exactly; any other JSON object with a valid `expires` (written by an older
//! version or another tool) is read as far as it goes, without the identity
//! that would let its pid be judged, so it is held until `expires` (SPEC §6);
//! anything else is reported as corrupt.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Version of the on-disk record layout.
pub const FORMAT: u32 = 1;
/// Records larger than this are corrupt by definition (a note is at most 1,000 bytes).
pub const MAX_RECORD_BYTES: usize = 64 * 1024;
/// What a record of another format may grow by when it is written back in
/// this one (the fields it lacked, as nulls).
const FOREIGN_MARGIN: usize = 4096;

/// A point in time, whole seconds since the Unix epoch, written as RFC 3339 UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// RFC 3339 UTC to the second, e.g. `2026-12-02T10:00:00Z`.
    #[must_use]
    pub fn rfc3339(self) -> String {
        if let Some(text) = self.rfc3339_fast() {
            return text;
        }
        let fmt =
            time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
        time::OffsetDateTime::from_unix_timestamp(self.0)
            .ok()
            .and_then(|t| t.format(&fmt).ok())
            .unwrap_or_else(|| format!("@{}", self.0))
    }

    /// [`Self::rfc3339`] of a time in years 0000-9999, written without a
    /// format description (`list` writes two a lock): the civil date from
    /// the day number (H. Hinnant's `civil_from_days`).
    fn rfc3339_fast(self) -> Option<String> {
        // 0000-01-01T00:00:00Z and 10000-01-01T00:00:00Z.
        if !(-62_167_219_200..253_402_300_800).contains(&self.0) {
            return None;
        }
        let (days, secs) = (self.0.div_euclid(86_400), self.0.rem_euclid(86_400));
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        let mut text = *b"0000-00-00T00:00:00Z";
        for (at, value, width) in [
            (0, year, 4),
            (5, month, 2),
            (8, day, 2),
            (11, secs / 3600, 2),
            (14, secs % 3600 / 60, 2),
            (17, secs % 60, 2),
        ] {
            let mut v = value;
            for i in (at..at + width).rev() {
                // A digit: `v % 10` is 0 to 9.
                text[i] = b'0' + u8::try_from(v % 10).unwrap_or(0);
                v /= 10;
            }
        }
        String::from_utf8(text.to_vec()).ok()
    }

    /// [`Self::parse`] of the form this tool writes, `YYYY-MM-DDTHH:MM:SSZ`,
    /// without a format description (`list` reads two a lock); `None` for
    /// anything else, left to the full parser.
    fn parse_fast(text: &str) -> Option<Self> {
        let b = text.as_bytes();
        let shape = b"dddd-dd-ddTdd:dd:ddZ";
        if b.len() != shape.len()
            || !b.iter().zip(shape).all(|(c, s)| match s {
                b'd' => c.is_ascii_digit(),
                _ => c == s,
            })
        {
            return None;
        }
        let num = |from: usize, to: usize| {
            b[from..to]
                .iter()
                .fold(0_i64, |n, c| n * 10 + i64::from(c - b'0'))
        };
        let (year, month, day) = (num(0, 4), num(5, 7), num(8, 10));
        let (hour, minute, second) = (num(11, 13), num(14, 16), num(17, 19));
        let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
        let days_in = match month {
            1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
            4 | 6 | 9 | 11 => 30,
            2 if leap => 29,
            2 => 28,
            _ => return None,
        };
        if day < 1 || day > days_in || hour > 23 || minute > 59 || second > 59 {
            return None;
        }
        // H. Hinnant's `days_from_civil`.
        let y = if month <= 2 { year - 1 } else { year };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let mp = if month > 2 { month - 3 } else { month + 9 };
        let doy = (153 * mp + 2) / 5 + day - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        let days = era * 146_097 + doe - 719_468;
        Some(Self(days * 86_400 + hour * 3600 + minute * 60 + second))
    }

    /// Parses RFC 3339 (any offset), dropping fractions of a second. A time
    /// whose UTC form falls outside years 0000-9999 is refused, since it
    /// could not be written back as RFC 3339.
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        if let Some(t) = Self::parse_fast(text) {
            return Some(t);
        }
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
            .ok()
            .and_then(|t| t.checked_to_offset(time::UtcOffset::UTC))
            .filter(|t| (0..=9999).contains(&t.year()))
            .map(|t| Self(t.unix_timestamp()))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.rfc3339())
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.rfc3339())
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    /// Parsed where it lies in the input (no copy of the text).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Rfc3339;
        impl serde::de::Visitor<'_> for Rfc3339 {
            type Value = Timestamp;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an RFC 3339 time")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Timestamp, E> {
                Timestamp::parse(text).ok_or_else(|| E::custom("not an RFC 3339 time"))
            }
        }
        d.deserialize_str(Rfc3339)
    }
}

/// The shown part of an owner record: every field but the token hash.
///
/// `F` is the fence: a `u64` once a store has written the record, [`NoFence`]
/// in a record about to be created, whose fence only the store can assign
/// (so no placeholder value can be mistaken for one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder<F = u64> {
    /// Skill that holds the lock.
    pub skill: String,
    /// Repository, spelled as the acquirer gave it.
    pub repo: String,
    /// When the lock was acquired.
    pub started: Timestamp,
    /// When the lease runs out unless renewed.
    pub expires: Timestamp,
    /// Time of the last renewal, or null.
    pub renewed: Option<Timestamp>,
    /// Lease length in seconds.
    pub ttl: u64,
    /// Free text from `--note`.
    pub note: Option<String>,
    /// Hostname of the acquirer.
    pub host: String,
    /// Process whose death makes the lock stale, if any.
    pub owner_pid: Option<u32>,
    /// Fencing number of this acquisition.
    pub fence: F,
    /// Boot id of the acquirer's host (Linux), to detect reboots.
    pub boot_id: Option<String>,
    /// Start time of `owner_pid` (clock ticks since boot), to detect pid reuse.
    pub owner_start: Option<u64>,
    /// Expiry on the acquirer's boot-time clock (ms), immune to wall-clock steps.
    pub deadline_boot_ms: Option<u64>,
    /// The acquirer's machine, when certain (a hash of its own machine id,
    /// never one baked into a container image): proves a reboot.
    #[serde(default)]
    pub machine: Option<String>,
    /// The acquirer's pid namespace (inode of `/proc/self/ns/pid`): its pid
    /// is judged only in the same namespace.
    #[serde(default)]
    pub pid_ns: Option<u64>,
    /// Start time of that namespace's init (its pid 1, clock ticks since
    /// boot): with `pid_ns` it names one namespace, since the inode number
    /// of a namespace that ended is handed to the next one created (every
    /// sandboxed shell call gets its own). Absent in older records.
    #[serde(default)]
    pub pid_ns_start: Option<u64>,
    /// The acquirer's time namespace (inode of `/proc/self/ns/time`): its
    /// boot-clock deadline is trusted only on the same clock.
    #[serde(default)]
    pub time_ns: Option<u64>,
    /// `run`'s process group (SPEC §2.7): while any process of it lives on
    /// this machine, boot and pid namespace, the lock is held. Absent in
    /// older records and in locks not taken by `run`.
    #[serde(default)]
    pub owner_pgid: Option<u32>,
    /// Start time of the group's first leader (same units as
    /// `owner_start`), so a group id reused after the group ended is told
    /// from the group itself.
    #[serde(default)]
    pub group_start: Option<u64>,
    /// Record layout version (0: a record of an older version or another tool).
    pub format: u32,
}

/// The full record kept with a lock (`F`: its fence, as for [`Holder`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OwnerRecord<F = u64> {
    /// Everything that may be shown.
    #[serde(flatten)]
    pub holder: Holder<F>,
    /// Lowercase hex SHA-256 of the token.
    pub token_sha256: String,
}

/// An owner record as it is read: every field at one level, as written.
/// (serde's `flatten` would first buffer every field of every record read:
/// 14% of the CPU of a `list` of 5,000 locks.) Kept in step with [`Holder`]
/// by the compiler: the conversion below names every field of both.
#[derive(Deserialize)]
struct RecordWire<F> {
    skill: String,
    repo: String,
    started: Timestamp,
    expires: Timestamp,
    renewed: Option<Timestamp>,
    ttl: u64,
    note: Option<String>,
    host: String,
    owner_pid: Option<u32>,
    fence: F,
    boot_id: Option<String>,
    owner_start: Option<u64>,
    deadline_boot_ms: Option<u64>,
    #[serde(default)]
    machine: Option<String>,
    #[serde(default)]
    pid_ns: Option<u64>,
    #[serde(default)]
    pid_ns_start: Option<u64>,
    #[serde(default)]
    time_ns: Option<u64>,
    #[serde(default)]
    owner_pgid: Option<u32>,
    #[serde(default)]
    group_start: Option<u64>,
    format: u32,
    token_sha256: String,
}

impl<'de, F: Deserialize<'de>> Deserialize<'de> for OwnerRecord<F> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = RecordWire::<F>::deserialize(d)?;
        Ok(OwnerRecord {
            holder: Holder {
                skill: w.skill,
                repo: w.repo,
                started: w.started,
                expires: w.expires,
                renewed: w.renewed,
                ttl: w.ttl,
                note: w.note,
                host: w.host,
                owner_pid: w.owner_pid,
                fence: w.fence,
                boot_id: w.boot_id,
                owner_start: w.owner_start,
                deadline_boot_ms: w.deadline_boot_ms,
                machine: w.machine,
                pid_ns: w.pid_ns,
                pid_ns_start: w.pid_ns_start,
                time_ns: w.time_ns,
                owner_pgid: w.owner_pgid,
                group_start: w.group_start,
                format: w.format,
            },
            token_sha256: w.token_sha256,
        })
    }
}

/// The fence of a record not written yet: there is none. The store that
/// writes the record assigns it ([`NewRecord::fenced`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoFence;

impl From<NoFence> for Option<u64> {
    /// No fence, as an optional one says it.
    fn from(_: NoFence) -> Self {
        None
    }
}

/// A record about to be created (an acquisition): everything but the fence.
pub type NewRecord = OwnerRecord<NoFence>;

impl NewRecord {
    /// The record with the fence its store assigned.
    #[must_use]
    pub fn fenced(self, fence: u64) -> OwnerRecord {
        self.with_fence(fence)
    }
}

impl OwnerRecord {
    /// The same record without its fence: what a revived lease (SPEC §2.2)
    /// is written as, so that its store gives it a new one.
    #[must_use]
    pub fn unfenced(&self) -> NewRecord {
        self.clone().with_fence(NoFence)
    }
}

impl<F> OwnerRecord<F> {
    /// The same record with `fence` in place of its own.
    fn with_fence<G>(self, fence: G) -> OwnerRecord<G> {
        let h = self.holder;
        OwnerRecord {
            holder: Holder {
                skill: h.skill,
                repo: h.repo,
                started: h.started,
                expires: h.expires,
                renewed: h.renewed,
                ttl: h.ttl,
                note: h.note,
                host: h.host,
                owner_pid: h.owner_pid,
                fence,
                boot_id: h.boot_id,
                owner_start: h.owner_start,
                deadline_boot_ms: h.deadline_boot_ms,
                machine: h.machine,
                pid_ns: h.pid_ns,
                pid_ns_start: h.pid_ns_start,
                time_ns: h.time_ns,
                owner_pgid: h.owner_pgid,
                group_start: h.group_start,
                format: h.format,
            },
            token_sha256: self.token_sha256,
        }
    }
}

impl<F> OwnerRecord<F> {
    /// True when `token` is the one this record was acquired with.
    #[must_use]
    pub fn token_matches(&self, token: &str) -> bool {
        let given = hash_token(token);
        // Compare all bytes regardless of where they differ.
        given.len() == self.token_sha256.len()
            && given
                .bytes()
                .zip(self.token_sha256.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

impl OwnerRecord {
    /// Serializes the record as one JSON line.
    ///
    /// # Errors
    /// [`Error::Internal`] if serialization fails (it cannot for this type).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut v = serde_json::to_vec(self).map_err(|e| Error::Internal(e.to_string()))?;
        v.push(b'\n');
        Ok(v)
    }

    /// Parses a record; `Err` carries why it is corrupt.
    ///
    /// # Errors
    /// A human reason when the bytes are not a record of a known format.
    pub fn parse(bytes: &[u8]) -> std::result::Result<Self, String> {
        if bytes.len() > MAX_RECORD_BYTES {
            return Err(format!(
                "record is {} bytes, more than any record can be",
                bytes.len()
            ));
        }
        // The common case, a record of this version, in one pass; anything
        // else (another format, a damaged record) is looked at field by field.
        if let Ok(rec) = serde_json::from_slice::<Self>(bytes)
            && rec.holder.format == FORMAT
            && is_hash(&rec.token_sha256)
        {
            return Ok(rec);
        }
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| format!("unreadable record: {e}"))?;
        if value.get("format").and_then(serde_json::Value::as_u64) != Some(u64::from(FORMAT)) {
            // Room for the fields it lacks, so that it still parses once rewritten.
            if bytes.len() > MAX_RECORD_BYTES - FOREIGN_MARGIN {
                return Err(format!(
                    "record of another format is {} bytes, more than one can be",
                    bytes.len()
                ));
            }
            return Self::parse_foreign(&value);
        }
        // A record of this version is read exactly: a damaged one is corrupt.
        let rec: Self =
            serde_json::from_value(value).map_err(|e| format!("unreadable record: {e}"))?;
        if !is_hash(&rec.token_sha256) {
            return Err("record holds no valid token hash".to_owned());
        }
        Ok(rec)
    }

    /// Reads a record of an older version or another tool: any JSON object
    /// with a valid `expires`. Only what is shown is kept (never the boot,
    /// namespace or machine identity), so its owner is judged by its lease.
    fn parse_foreign(value: &serde_json::Value) -> std::result::Result<Self, String> {
        use serde_json::Value;
        let obj = value
            .as_object()
            .ok_or_else(|| "the record is not a JSON object".to_owned())?;
        let text = |k: &str| obj.get(k).and_then(Value::as_str).map(str::to_owned);
        let time = |k: &str| {
            obj.get(k)
                .and_then(Value::as_str)
                .and_then(Timestamp::parse)
        };
        let number = |k: &str| obj.get(k).and_then(Value::as_u64);
        let expires =
            time("expires").ok_or_else(|| "the record has no usable expires".to_owned())?;
        let holder = Holder {
            skill: text("skill").unwrap_or_default(),
            repo: text("repo").unwrap_or_default(),
            started: time("started").unwrap_or(expires),
            expires,
            renewed: time("renewed"),
            ttl: number("ttl").unwrap_or(0),
            note: text("note"),
            host: text("host").unwrap_or_default(),
            owner_pid: number("owner_pid").and_then(|p| u32::try_from(p).ok()),
            fence: number("fence").unwrap_or(0),
            boot_id: None,
            owner_start: None,
            deadline_boot_ms: None,
            machine: None,
            pid_ns: None,
            pid_ns_start: None,
            time_ns: None,
            owner_pgid: None,
            group_start: None,
            format: number("format")
                .and_then(|f| u32::try_from(f).ok())
                .filter(|&f| f != FORMAT)
                .unwrap_or(0),
        };
        Ok(Self {
            holder,
            // No token matches an empty hash: only a release without a token
            // (or --force) removes such a lock before it expires.
            token_sha256: text("token_sha256")
                .filter(|h| is_hash(h))
                .unwrap_or_default(),
        })
    }
}

fn is_hash(text: &str) -> bool {
    text.len() == 64
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// Lowercase hex SHA-256 of a token.
#[must_use]
pub fn hash_token(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

/// A fresh token: 128 bits from the OS CSPRNG, lowercase hex.
///
/// # Errors
/// [`Error::Internal`] when the OS refuses randomness.
pub fn new_token() -> Result<String> {
    let mut buf = [0u8; 16];
    getrandom::fill(&mut buf)
        .map_err(|e| Error::Internal(format!("no randomness from the OS: {e}")))?;
    Ok(hex(&buf))
}

/// A short random suffix for unique file names.
#[must_use]
#[allow(
    clippy::disallowed_methods,
    reason = "the time only makes a name unique, it decides nothing"
)]
pub fn random_suffix() -> String {
    let mut buf = [0u8; 8];
    if getrandom::fill(&mut buf).is_err() {
        // Uniqueness still holds by pid and time.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        return format!("{}-{t}", std::process::id());
    }
    hex(&buf)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The date arithmetic writes what the format description writes, on
    /// every day of years 0000-9999 (at a second that moves each day) and
    /// at both ends of the range.
    #[test]
    fn rfc3339_without_a_format_description_is_the_same_text() {
        let fmt =
            time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
        let slow = |t: i64| {
            time::OffsetDateTime::from_unix_timestamp(t)
                .ok()
                .and_then(|d| d.format(&fmt).ok())
        };
        let (first, end) = (-62_167_219_200_i64, 253_402_300_800_i64);
        let mut t = first;
        while t < end {
            assert_eq!(Timestamp(t).rfc3339_fast(), slow(t), "{t}");
            t += 86_400 + 37;
        }
        for t in [first, first + 1, -1, 0, 1, end - 1] {
            assert_eq!(Timestamp(t).rfc3339_fast(), slow(t), "{t}");
        }
        let parse_slow = |text: &str| {
            time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
                .ok()
                .map(time::OffsetDateTime::unix_timestamp)
        };
        let mut t = first;
        while t < end {
            let text = Timestamp(t).rfc3339();
            assert_eq!(Timestamp::parse_fast(&text).map(|p| p.0), parse_slow(&text));
            t += 86_400 * 3 + 3_599;
        }
        for bad in [
            "2026-02-29T00:00:00Z",
            "2024-02-30T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-04-31T00:00:00Z",
            "2026-01-01T24:00:00Z",
            "2026-01-01T00:60:00Z",
            "2026-01-01T00:00:60Z",
            "2026-00-01T00:00:00Z",
            "2026-01-00T00:00:00Z",
            "2026-01-01t00:00:00z",
            "2026-01-01T00:00:00+00:00",
        ] {
            let fast = Timestamp::parse_fast(bad).map(|p| p.0);
            assert!(fast.is_none() || fast == parse_slow(bad), "{bad}");
        }
        assert_eq!(Timestamp(first - 1).rfc3339_fast(), None);
        assert_eq!(Timestamp(end).rfc3339_fast(), None);
    }

    pub(crate) fn sample(note: Option<String>) -> OwnerRecord {
        sample_new(note).fenced(7)
    }

    /// The same record before a store gave it a fence.
    pub(crate) fn sample_new(note: Option<String>) -> NewRecord {
        OwnerRecord {
            holder: Holder {
                skill: "issue-triage".into(),
                repo: "Apache/Airflow".into(),
                started: Timestamp(1_800_000_000),
                expires: Timestamp(1_800_007_200),
                renewed: None,
                ttl: 7200,
                note,
                host: "h".into(),
                owner_pid: Some(42),
                fence: NoFence,
                boot_id: Some("b".into()),
                owner_start: Some(99),
                deadline_boot_ms: Some(5),
                machine: Some("m".into()),
                pid_ns: Some(4_026_531_836),
                pid_ns_start: Some(1),
                time_ns: Some(4_026_531_834),
                owner_pgid: None,
                group_start: None,
                format: FORMAT,
            },
            token_sha256: hash_token("t"),
        }
    }

    /// A record written before the later fields existed (`machine`,
    /// `pid_ns`, `pid_ns_start`, `time_ns`, `owner_pgid`, `group_start`) is
    /// read, with them absent; one missing a field every version wrote is
    /// corrupt. (The record is read by a struct of its own, not `Holder`'s
    /// derive: this keeps the two agreeing on what may be missing.)
    #[test]
    fn a_record_without_the_later_fields_is_read_and_one_without_a_required_field_is_not() {
        let mut value = serde_json::to_value(sample(None)).unwrap();
        let fields = value.as_object_mut().unwrap();
        for later in [
            "machine",
            "pid_ns",
            "pid_ns_start",
            "time_ns",
            "owner_pgid",
            "group_start",
        ] {
            assert!(fields.remove(later).is_some(), "{later}");
        }
        let older = serde_json::to_vec(&value).unwrap();
        let read = OwnerRecord::parse(&older).unwrap();
        let mut want = sample(None);
        want.holder.machine = None;
        want.holder.pid_ns = None;
        want.holder.pid_ns_start = None;
        want.holder.time_ns = None;
        assert_eq!(read, want);
        for required in ["skill", "expires", "fence", "token_sha256"] {
            let mut v = value.clone();
            v.as_object_mut().unwrap().remove(required);
            let bytes = serde_json::to_vec(&v).unwrap();
            assert!(OwnerRecord::parse(&bytes).is_err(), "without {required}");
        }
    }

    #[test]
    fn times_are_rfc3339_utc_seconds() {
        assert_eq!(Timestamp(1_796_205_600).rfc3339(), "2026-12-02T10:00:00Z");
        assert_eq!(
            Timestamp::parse("2026-12-02T11:00:00.7+01:00"),
            Some(Timestamp(1_796_205_600))
        );
    }

    #[test]
    fn token_is_hashed_and_checked() {
        let t = new_token().unwrap();
        assert_eq!(t.len(), 32);
        assert!(
            t.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        let mut r = sample(None);
        r.token_sha256 = hash_token(&t);
        assert!(r.token_matches(&t));
        assert!(!r.token_matches("other"));
        let text = String::from_utf8(r.to_bytes().unwrap()).unwrap();
        assert!(!text.contains(&t));
    }

    #[test]
    fn records_of_older_versions_are_read_by_their_lease() {
        let old = br#"{"started":"2026-12-02T10:00:00Z","expires":"2026-12-02T11:00:00Z","note":"n","owner_pid":7,"boot_id":"b"}"#;
        let r = OwnerRecord::parse(old).unwrap();
        assert_eq!(r.holder.expires, Timestamp(1_796_209_200));
        assert_eq!(
            (r.holder.note.as_deref(), r.holder.owner_pid),
            (Some("n"), Some(7))
        );
        assert_eq!((r.holder.boot_id.as_ref(), r.holder.format), (None, 0));
        assert!(
            !r.token_matches(""),
            "no token matches a record without a hash"
        );
        // A record of this version that is damaged is corrupt, not foreign.
        let mut cur = sample(None);
        cur.token_sha256 = "short".into();
        assert!(OwnerRecord::parse(&cur.to_bytes().unwrap()).is_err());
        // One of a later version is read by its lease.
        let mut later = serde_json::to_value(sample(None)).unwrap();
        later["format"] = 2.into();
        let back = OwnerRecord::parse(&serde_json::to_vec(&later).unwrap()).unwrap();
        assert_eq!((back.holder.format, back.holder.boot_id), (2, None));
        for bad in [&b"[]"[..], b"{}", br#"{"expires":"soon"}"#, b"{\"half\": "] {
            assert!(
                OwnerRecord::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    proptest! {
        #[test]
        fn record_round_trips(note in proptest::option::of(".{0,200}"), fence in 0u64.., pid in proptest::option::of(1u32..)) {
            let mut r = sample(note);
            r.holder.fence = fence;
            r.holder.owner_pid = pid;
            let back = OwnerRecord::parse(&r.to_bytes().unwrap()).unwrap();
            prop_assert_eq!(back, r);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = OwnerRecord::parse(&bytes);
        }
    }
}
