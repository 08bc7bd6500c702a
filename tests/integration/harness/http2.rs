//! Watching the etcd client's HTTP/2 bytes from a test proxy: which frame
//! carried a transaction with an owner record (reads, lease grants and
//! keep-alives are a few dozen bytes; a record is a few hundred).

/// Splits an HTTP/2 byte stream (client to server: a 24-byte preface, then
/// frames) and says when a DATA frame with a payload larger than `big` went by.
pub struct FrameWatch {
    buf: Vec<u8>,
    preface_left: usize,
    big: usize,
}

impl FrameWatch {
    /// A watch of a client's stream, for DATA frames over `big` bytes.
    pub fn new(big: usize) -> Self {
        Self {
            buf: Vec::new(),
            preface_left: 24,
            big,
        }
    }

    /// Feeds the next bytes; `true` when a large DATA frame ended in them.
    pub fn feed(&mut self, bytes: &[u8]) -> bool {
        self.buf.extend_from_slice(bytes);
        let skip = self.preface_left.min(self.buf.len());
        self.buf.drain(..skip);
        self.preface_left -= skip;
        let mut seen = false;
        while self.buf.len() >= 9 {
            let len = (usize::from(self.buf[0]) << 16)
                | (usize::from(self.buf[1]) << 8)
                | usize::from(self.buf[2]);
            if self.buf.len() < 9 + len {
                break;
            }
            if self.buf[3] == 0 && len > self.big {
                seen = true;
            }
            self.buf.drain(..9 + len);
        }
        seen
    }
}

#[test]
fn a_large_data_frame_is_seen_across_reads() {
    let mut w = FrameWatch::new(300);
    let preface = [b'P'; 24];
    assert!(!w.feed(&preface));
    // A small HEADERS frame (type 1), then a 400-byte DATA frame (type 0) in two reads.
    let mut frames = vec![0, 0, 4, 1, 0, 0, 0, 0, 1, 9, 9, 9, 9];
    frames.extend([0, 1, 144, 0, 0, 0, 0, 0, 1]);
    frames.extend([7u8; 400]);
    assert!(!w.feed(&frames[..100]));
    assert!(w.feed(&frames[100..]));
    // A small DATA frame is not a record.
    assert!(!w.feed(&[0, 0, 5, 0, 0, 0, 0, 0, 1, 1, 2, 3, 4, 5]));
}
