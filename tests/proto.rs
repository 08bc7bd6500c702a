//! The etcd store's protocol code (src/store/etcd/proto.rs) is generated
//! from proto/etcd.proto ahead of time, so that building the crate needs no
//! protoc. This test regenerates it with the pure-Rust protox compiler and
//! tonic-prost-build, and fails when the committed file differs from what the
//! .proto file gives. `SKILL_LOCK_BLESS=1 cargo test --test proto` rewrites it.

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
        "// @generated from proto/etcd.proto by tests/proto.rs (tonic-prost-build with protox).\n\
         // Do not edit: change the .proto file and run `SKILL_LOCK_BLESS=1 cargo test --test proto`.\n\
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
         run `SKILL_LOCK_BLESS=1 cargo test --test proto` and commit the result"
    );
}
