//! TLS to etcd (`etcds://` with `SKILL_LOCK_ETCD_CA`, and client certificates
//! with `SKILL_LOCK_ETCD_CERT`/`_KEY`), against a node started with a
//! throwaway CA made here by `openssl`. Skipped visibly without etcd/openssl;
//! mandatory under `SKILL_LOCK_TEST_ETCD_REQUIRED=1`.
//!
//! Covers: SPEC §8.

use crate::harness;

use harness::{Lock, Reply};
use harness::{TestEnv, chaos};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn run(dir: &Path, args: &[&str]) {
    let st = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stderr(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "openssl {args:?}");
}

/// CA, a server certificate for 127.0.0.1, and a client certificate.
pub fn make_pki(dir: &Path) {
    run(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=skill-lock test CA",
        ],
    );
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .unwrap();
    for name in ["server", "client"] {
        run(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                &format!("/CN={name}"),
            ],
        );
        run(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &format!("{name}.pem"),
                "-days",
                "2",
                "-extfile",
                "san.ext",
            ],
        );
    }
}

#[test]
fn etcds_with_a_private_ca_and_client_certificates() {
    if !harness::have_programs(
        "the etcd TLS test",
        &[("etcd", "--version"), ("openssl", "version")],
    ) {
        return;
    }
    let env = TestEnv::new();
    let pki = env.dir("pki");
    make_pki(&pki);
    let p = |f: &str| pki.join(f).display().to_string();
    let client_url = "https://127.0.0.1:24401";
    let tuning = chaos::Tuning {
        heartbeat_ms: 10,
        election_ms: 100,
    };
    let mut etcd = chaos::member(
        &env.path("data"),
        0,
        &[client_url.to_owned()],
        &[24411],
        tuning,
    )
    .args([
        "--cert-file",
        &p("server.pem"),
        "--key-file",
        &p("server.key"),
    ])
    .args(["--client-cert-auth", "--trusted-ca-file", &p("ca.pem")])
    .spawn()
    .unwrap();
    let cwd = env.dir("w");
    let url = "etcds://127.0.0.1:24401";
    let lock = |store: &str| Lock::new(&cwd, "s", "o/r").in_store(store);
    let with_tls = |lock: Lock| {
        lock.with_env("SKILL_LOCK_ETCD_CA", p("ca.pem"))
            .with_env("SKILL_LOCK_ETCD_CERT", p("client.pem"))
            .with_env("SKILL_LOCK_ETCD_KEY", p("client.key"))
            .with_env("SKILL_LOCK_ETCD_TIMEOUT", "3")
    };
    let tls = with_tls(lock(url));
    let start = Instant::now();
    let token = loop {
        let a = tls.op("acquire").run();
        if let got @ Reply::Acquired { .. } = a.reply() {
            break got.token().to_owned();
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "TLS acquire never worked: {}",
            a.stdout
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let again = tls.acquire();
    assert_eq!(again.result(), "already_running", "{again:?}");
    // Without our CA the server is not trusted; without a client certificate it refuses us.
    let untrusted = lock(url)
        .with_env("SKILL_LOCK_ETCD_TIMEOUT", "2")
        .op("status")
        .run();
    untrusted.expect_error("store_unavailable");
    let anonymous = lock(url)
        .with_env("SKILL_LOCK_ETCD_CA", p("ca.pem"))
        .with_env("SKILL_LOCK_ETCD_TIMEOUT", "2")
        .op("status")
        .run();
    anonymous.expect_error("store_unavailable");
    // An endpoint that accepts and never answers (it hangs in the TLS
    // handshake) is skipped like a dead one (SPEC §8), well within the bound.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hung_url = format!("etcds://{},127.0.0.1:24401", hung.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in hung.incoming().flatten() {
            held.push(s);
        }
    });
    let began = Instant::now();
    let skipped = with_tls(lock(&hung_url)).status();
    let took = began.elapsed();
    assert_eq!(skipped.state(), "held", "{skipped:?}");
    assert!(
        took < Duration::from_millis(2500),
        "a hung TLS endpoint took {took:?} to skip (timeout 3 s)"
    );
    let released = tls.release(&token);
    assert_eq!(released.result(), "released", "{released:?}");
    let _ = etcd.kill();
    let _ = etcd.wait();
}

/// The CA, certificate and key are named by variables, so they are read as
/// regular files only and bounded (SPEC §8): a FIFO never hangs a command,
/// `/dev/zero` or an endless file never fills memory; each is an `io`
/// error naming the file, at once.
#[test]
fn tls_files_that_are_fifos_devices_or_huge_are_refused_at_once() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let fifo = env.path("ca.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let huge = env.path("huge.pem");
    let f = std::fs::File::create(&huge).unwrap();
    f.set_len(64 << 20).unwrap();
    for var in ["SKILL_LOCK_ETCD_CA", "SKILL_LOCK_ETCD_CERT"] {
        for file in [fifo.as_path(), Path::new("/dev/zero"), huge.as_path()] {
            let start = std::time::Instant::now();
            let mut lock = Lock::new(&repo, "s", "o/r")
                .in_store("etcds://127.0.0.1:9")
                .with_env(var, file);
            if var == "SKILL_LOCK_ETCD_CERT" {
                lock = lock.with_env("SKILL_LOCK_ETCD_KEY", file);
            }
            let out = lock.op("status").run();
            out.expect_error("io");
            let Reply::Error { message, .. } = out.reply() else {
                unreachable!("an error object")
            };
            assert!(
                message.contains(file.to_str().unwrap()),
                "{var}={}: {message}",
                file.display()
            );
            assert!(
                start.elapsed() < std::time::Duration::from_secs(3),
                "{var}={} took {:?}",
                file.display(),
                start.elapsed()
            );
        }
    }
}
