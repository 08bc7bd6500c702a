//! A TCP proxy between a client and a server that passes, cuts, hangs,
//! slows or severs the bytes it carries, and can tap them.

use std::io::ErrorKind;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::net::TcpListener;
use std::net::TcpStream;
use std::net::{Shutdown, ToSocketAddrs};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// What a [`Proxy`] does to the bytes it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Passes them.
    Pass,
    /// Closes every connection and refuses new ones.
    Cut,
    /// Holds them, both ways (delivered late once healed): what a
    /// SIGSTOPped peer looks like.
    Hang,
    /// Delays every chunk this many milliseconds.
    Slow(u64),
}

/// What a [`Sink`] asks of the proxy once the bytes it saw are forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// Nothing: carry on.
    Go,
    /// Do this fault to every connection from now on (a member that froze
    /// right after it received a given request).
    Fault(Fault),
    /// Drop every answer on this connection from now on, passing the rest:
    /// the request landed, its answer never comes.
    Deafen,
}

/// What sees every byte one connection's client sends, once forwarded.
pub type Sink = Box<dyn FnMut(&[u8]) -> Then + Send>;

/// Makes a fresh [`Sink`] per connection.
pub type Tap = Box<dyn Fn() -> Sink + Send + Sync>;

struct Shared {
    fault: Mutex<Fault>,
    generation: AtomicU64,
    stop: AtomicBool,
    tap: Option<Tap>,
}

impl Shared {
    fn fault(&self) -> Fault {
        *self.fault.lock().unwrap()
    }

    fn gone(&self, born: u64) -> bool {
        self.stop.load(Ordering::Relaxed)
            || self.generation.load(Ordering::SeqCst) != born
            || self.fault() == Fault::Cut
    }
}

/// A TCP proxy on loopback in front of one upstream, with faults on demand.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// A proxy to `upstream` (`host:port`) on a free port.
    pub fn start(upstream: &str) -> Self {
        Self::build(0, upstream, None)
    }

    /// A proxy to `upstream` on a free port whose every connection hands the
    /// client's bytes to a tap of its own, made by `tap`.
    pub fn tapped(upstream: &str, tap: Tap) -> Self {
        Self::build(0, upstream, Some(tap))
    }

    fn build(port: u16, upstream: &str, tap: Option<Tap>) -> Self {
        let up = upstream
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .unwrap_or_else(|| panic!("upstream {upstream:?} resolves"));
        let first = TcpListener::bind(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("proxy binds port {port}: {e}"));
        let addr = first.local_addr().unwrap();
        first.set_nonblocking(true).unwrap();
        let shared = Arc::new(Shared {
            fault: Mutex::new(Fault::Pass),
            generation: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            tap,
        });
        let s = shared.clone();
        let thread = std::thread::spawn(move || accept(first, addr, up, &s));
        Self {
            addr,
            shared,
            thread: Some(thread),
        }
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// From now on, does `fault` to every connection.
    pub fn set(&self, fault: Fault) {
        *self.shared.fault.lock().unwrap() = fault;
    }

    /// Holds every byte for `d`, then lets them through.
    pub fn freeze(&self, d: Duration) {
        self.set(Fault::Hang);
        std::thread::sleep(d);
        self.set(Fault::Pass);
    }

    /// Closes every connection open now (new ones are accepted).
    pub fn sever(&self) {
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Accepts until the proxy stops; while cut, listens on nothing.
fn accept(first: TcpListener, addr: SocketAddr, up: SocketAddr, s: &Arc<Shared>) {
    let mut listener = Some(first);
    while !s.stop.load(Ordering::Relaxed) {
        if s.fault() == Fault::Cut {
            listener = None;
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        let Some(l) = listener.as_ref() else {
            match TcpListener::bind(addr) {
                Ok(l) => {
                    let _ = l.set_nonblocking(true);
                    listener = Some(l);
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
            continue;
        };
        match l.accept() {
            Ok((client, _)) => {
                let s = s.clone();
                std::thread::spawn(move || connect(client, up, &s));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

fn connect(client: TcpStream, up: SocketAddr, s: &Arc<Shared>) {
    let born = s.generation.load(Ordering::SeqCst);
    let _ = client.set_nonblocking(false);
    // A dead upstream: the client sees its connection closed at once.
    let Ok(server) = TcpStream::connect_timeout(&up, Duration::from_secs(1)) else {
        return;
    };
    for st in [&client, &server] {
        let _ = st.set_nodelay(true);
        let _ = st.set_read_timeout(Some(Duration::from_millis(20)));
        let _ = st.set_write_timeout(Some(Duration::from_secs(2)));
    }
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let (s_back, deaf) = (s.clone(), Arc::new(AtomicBool::new(false)));
    let deaf_back = deaf.clone();
    let back = std::thread::spawn(move || pump(s2, c2, &s_back, born, Side::Back(&deaf_back)));
    let tap = s.tap.as_ref().map(|make| make());
    pump(client, server, s, born, Side::Forth(tap, &deaf));
    let _ = back.join();
}

/// Which way a [`pump`] copies: the client's bytes, shown to the tap, or
/// the answers, dropped once the connection is deaf.
enum Side<'a> {
    Forth(Option<Sink>, &'a AtomicBool),
    Back(&'a AtomicBool),
}

/// Copies `from` to `to` as the fault says, until either end closes, the
/// connection is severed or cut, or the proxy stops.
fn pump(mut from: TcpStream, mut to: TcpStream, s: &Shared, born: u64, mut side: Side<'_>) {
    let mut buf = vec![0u8; 16 * 1024];
    while !s.gone(born) {
        if s.fault() == Fault::Hang {
            // Read nothing: the kernel's buffers fill and the peer stalls.
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(_) => break,
        };
        // Bytes read as a hang began are held, and delivered late.
        while s.fault() == Fault::Hang && !s.gone(born) {
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Fault::Slow(ms) = s.fault() {
            std::thread::sleep(Duration::from_millis(ms));
        }
        if s.gone(born) {
            break;
        }
        if matches!(side, Side::Back(deaf) if deaf.load(Ordering::SeqCst)) {
            continue;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        if let Side::Forth(Some(tap), deaf) = &mut side {
            match tap(&buf[..n]) {
                Then::Go => {}
                Then::Fault(fault) => *s.fault.lock().unwrap() = fault,
                Then::Deafen => deaf.store(true, Ordering::SeqCst),
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

#[test]
fn the_proxy_passes_severs_and_cuts() {
    let echo = TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = echo.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for c in echo.incoming().flatten() {
            std::thread::spawn(move || {
                let (mut r, mut w) = (c.try_clone().unwrap(), c);
                let _ = std::io::copy(&mut r, &mut w);
            });
        }
    });
    let proxy = Proxy::start(&upstream);
    let round_trip = |c: &mut TcpStream| {
        c.write_all(b"ping").is_ok() && {
            let mut b = [0u8; 4];
            c.read_exact(&mut b).is_ok() && &b == b"ping"
        }
    };
    let mut c = TcpStream::connect(proxy.addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(round_trip(&mut c));
    proxy.sever();
    assert!(
        !round_trip(&mut c),
        "a severed connection still carries bytes"
    );
    let mut c = TcpStream::connect(proxy.addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(round_trip(&mut c), "a new connection after a sever works");
    proxy.set(Fault::Cut);
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        TcpStream::connect(proxy.addr()).is_err(),
        "a cut proxy accepts"
    );
    proxy.set(Fault::Pass);
    std::thread::sleep(Duration::from_millis(100));
    let mut c = TcpStream::connect(proxy.addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(round_trip(&mut c), "a healed proxy passes");
}
