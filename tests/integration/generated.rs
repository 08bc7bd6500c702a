//! Files generated ahead of time and committed, so that building and
//! installing need nothing but cargo (or nothing at all, for the bundle):
//!
//! - the etcd store's protocol code (src/store/etcd/proto.rs), generated from
//!   proto/etcd.proto with the pure-Rust protox compiler and tonic-prost-build
//!   (no protoc);
//! - the man pages (packaging/wheel-data/data/share/man/man1/*.1), generated from the clap definition, which
//!   the bundle and the wheel carry.
//!
//! Each test regenerates its files and fails when the committed ones differ.
//! `SKILL_LOCK_BLESS=1 cargo test --test integration generated::` rewrites them.
//!
//! Covers: SPEC §9.

use std::path::Path;

fn generate(out_dir: &Path) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fds = protox::compile([root.join("proto/etcd.proto")], [root.join("proto")])
        .unwrap_or_else(|e| panic!("proto/etcd.proto does not compile: {e}"));
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .out_dir(out_dir)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("cannot generate the etcd client: {e}"));
    let code = std::fs::read_to_string(out_dir.join("etcdserverpb.rs"))
        .unwrap_or_else(|e| panic!("generated file missing: {e}"));
    format!(
        "// @generated from proto/etcd.proto by tests/integration/generated.rs (tonic-prost-build with protox).\n\
         // Do not edit: change the .proto file and run `SKILL_LOCK_BLESS=1 cargo test --test integration generated::`.\n\
         #![allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]\n\n{code}"
    )
}

#[test]
fn generated_etcd_code_matches_its_proto() {
    let dir = tempfile::tempdir().unwrap();
    let fresh = generate(dir.path());
    let committed_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store/etcd/proto.rs");
    if std::env::var_os("SKILL_LOCK_BLESS").is_some() {
        std::fs::write(&committed_path, &fresh).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
    assert!(
        committed == fresh,
        "src/store/etcd/proto.rs is not what proto/etcd.proto generates; \
         run `SKILL_LOCK_BLESS=1 cargo test --test integration generated::` and commit the result"
    );
}

#[test]
fn committed_man_pages_match_the_command_line_definition() {
    let dir = tempfile::tempdir().unwrap();
    clap_mangen::generate_to(skill_lock::cli::command(), dir.path()).unwrap();
    let committed_dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/wheel-data/data/share/man/man1");
    let names = |d: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .map(|r| {
                r.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    if std::env::var_os("SKILL_LOCK_BLESS").is_some() {
        let _ = std::fs::remove_dir_all(&committed_dir);
        std::fs::create_dir_all(&committed_dir).unwrap();
        for n in names(dir.path()) {
            std::fs::copy(dir.path().join(&n), committed_dir.join(&n)).unwrap();
        }
        return;
    }
    assert_eq!(
        names(&committed_dir),
        names(dir.path()),
        "packaging/wheel-data/data/share/man/man1 does not hold the pages the command line defines; \
         run `SKILL_LOCK_BLESS=1 cargo test --test integration generated::` and commit the result"
    );
    for n in names(dir.path()) {
        let fresh = std::fs::read(dir.path().join(&n)).unwrap();
        let committed = std::fs::read(committed_dir.join(&n)).unwrap();
        assert!(
            fresh == committed,
            "packaging/wheel-data/data/share/man/man1/{n} is stale; run `SKILL_LOCK_BLESS=1 cargo test --test integration generated::`"
        );
    }
}

/// docs/contract.md is the contract users read in this repository; it must
/// stay the SPEC.md the project was given (beside the checkout, in
/// `../shared/`, where that exists: in the project's CI it does).
#[test]
fn contract_copy_is_the_spec() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let spec = root.join("../shared/SPEC.md");
    let Ok(spec) = std::fs::read_to_string(&spec) else {
        eprintln!(
            "SKIPPED: no ../shared/SPEC.md beside the checkout to compare docs/contract.md with"
        );
        return;
    };
    let copy = std::fs::read_to_string(root.join("docs/contract.md")).unwrap();
    let body = copy.split_once("\n\n").map_or("", |(_, b)| b);
    assert!(
        body == spec,
        "docs/contract.md differs from ../shared/SPEC.md: copy the SPEC again (keep the first comment line)"
    );
}
