//! Watching the etcd client's HTTP/2 bytes from a test proxy: which frame
//! carried a transaction with an owner record (reads, lease grants and
//! keep-alives are a few dozen bytes; a record is a few hundred), and the
//! gRPC messages the client sent.

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
        let big = self.big;
        self.frames(bytes)
            .iter()
            .any(|f| f.kind == 0 && f.payload.len() > big)
    }

    /// Feeds the next bytes; the frames that ended in them.
    pub fn frames(&mut self, bytes: &[u8]) -> Vec<Frame> {
        self.buf.extend_from_slice(bytes);
        let skip = self.preface_left.min(self.buf.len());
        self.buf.drain(..skip);
        self.preface_left -= skip;
        let mut out = Vec::new();
        while self.buf.len() >= 9 {
            let len = (usize::from(self.buf[0]) << 16)
                | (usize::from(self.buf[1]) << 8)
                | usize::from(self.buf[2]);
            if self.buf.len() < 9 + len {
                break;
            }
            let stream = u32::from_be_bytes([self.buf[5], self.buf[6], self.buf[7], self.buf[8]])
                & 0x7fff_ffff;
            out.push(Frame {
                kind: self.buf[3],
                flags: self.buf[4],
                stream,
                payload: self.buf[9..9 + len].to_vec(),
            });
            self.buf.drain(..9 + len);
        }
        out
    }
}

/// One HTTP/2 frame.
pub struct Frame {
    /// 0 DATA, 1 HEADERS, 4 SETTINGS...
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

/// The gRPC messages a client sends, from its HTTP/2 bytes: each stream's
/// DATA reassembled, split at gRPC's 5-byte length prefixes.
pub struct GrpcMessages {
    frames: FrameWatch,
    streams: std::collections::HashMap<u32, Vec<u8>>,
}

impl GrpcMessages {
    pub fn new() -> Self {
        Self {
            frames: FrameWatch::new(usize::MAX),
            streams: std::collections::HashMap::new(),
        }
    }

    /// Feeds the next bytes; the messages (protobuf bytes) that ended in them.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for f in self.frames.frames(bytes) {
            if f.kind != 0 {
                continue;
            }
            let mut data = f.payload.as_slice();
            if f.flags & 0x8 != 0 {
                let pad = usize::from(*data.first().unwrap_or(&0));
                data = &data[1..data.len().saturating_sub(pad)];
            }
            let buf = self.streams.entry(f.stream).or_default();
            buf.extend_from_slice(data);
            while buf.len() >= 5 {
                let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
                if buf.len() < 5 + len {
                    break;
                }
                out.push(buf[5..5 + len].to_vec());
                buf.drain(..5 + len);
            }
        }
        out
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

#[test]
fn grpc_messages_are_split_across_frames_and_reads() {
    let mut m = GrpcMessages::new();
    let mut bytes = vec![b'P'; 24];
    // One 7-byte message, its DATA split in two frames on stream 3.
    let msg = [0u8, 0, 0, 0, 2, 0x0a, 0x00];
    bytes.extend([0, 0, 4, 0, 0, 0, 0, 0, 3]);
    bytes.extend(&msg[..4]);
    bytes.extend([0, 0, 3, 0, 0, 0, 0, 0, 3]);
    bytes.extend(&msg[4..]);
    assert!(m.feed(&bytes[..30]).is_empty());
    assert_eq!(m.feed(&bytes[30..]), vec![vec![0x0a, 0x00]]);
}
