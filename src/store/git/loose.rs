//! Writing a lock's next commit into the cache with no git process: the
//! state blob, its one-entry tree and the commit, each a loose object
//! (`objects/xx/yyyy…`, zlib of `TYPE SIZE\0DATA`, named by its SHA-1),
//! written whole to a temporary file and renamed into place, blob first:
//! a process that sees the commit sees all of it, as with `git hash-object`.
//! A cache of another object format (SHA-256) is written by git instead.

use std::io::Write as _;
use std::path::Path;

use sha1::{Digest, Sha1};

use super::chain::make_commit_by_git;
use super::objects::STATE_FILE;
use super::remote::Remote;
use crate::error::{Error, Result};

/// The commit's author and committer (the record says who holds the lock).
const IDENT: &str = "skill-lock <skill-lock@localhost>";

/// Lowercase hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// `data` as a zlib stream of stored (uncompressed) blocks: what git
/// inflates like any other (a state is a few hundred bytes).
fn zlib_stored(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 5 * (data.len() / 0xffff + 1) + 6);
    // CMF: deflate, 32 KiB window; FLG: no dictionary, check bits.
    out.extend_from_slice(&[0x78, 0x01]);
    let mut blocks = data.chunks(0xffff).peekable();
    if data.is_empty() {
        out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(block) = blocks.next() {
        out.push(u8::from(blocks.peek().is_none()));
        let len = u16::try_from(block.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(block);
    }
    let (mut a, mut b) = (1u32, 0u32);
    for &x in data {
        a = (a + u32::from(x)) % 65521;
        b = (b + a) % 65521;
    }
    out.extend_from_slice(&((b << 16) | a).to_be_bytes());
    out
}

/// The object id and the loose-object bytes of an object.
fn object(kind: &str, data: &[u8]) -> ([u8; 20], Vec<u8>) {
    let mut raw = format!("{kind} {}\0", data.len()).into_bytes();
    raw.extend_from_slice(data);
    let id: [u8; 20] = Sha1::digest(&raw).into();
    (id, zlib_stored(&raw))
}

/// The commit object's text.
fn commit_text(tree: &str, parent: Option<&str>, time: i64, message: &str) -> String {
    let parent = parent.map(|p| format!("parent {p}\n")).unwrap_or_default();
    format!(
        "tree {tree}\n{parent}author {IDENT} {time} +0000\ncommitter {IDENT} {time} +0000\n\n{message}"
    )
}

/// Writes an object into `objects` (unless it is there), atomically.
fn write_object(objects: &Path, kind: &str, data: &[u8]) -> std::io::Result<String> {
    let (id, bytes) = object(kind, data);
    let name = hex(&id);
    let dir = objects.join(&name[..2]);
    let file = dir.join(&name[2..]);
    if file.is_file() {
        return Ok(name);
    }
    std::fs::create_dir_all(&dir)?;
    let tmp = dir.join(format!("tmp_obj_{}", crate::record::random_suffix()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| f.write_all(&bytes));
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, &file)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(name)
}

/// Does the cache name its objects by SHA-1 (git's default)? Read once,
/// from its config: any other object format is left to git.
fn sha1_cache(remote: &Remote) -> bool {
    *remote.sha1.get_or_init(|| {
        use std::io::Read as _;
        let mut text = String::new();
        let read = std::fs::File::open(remote.config.cache.join("config"))
            .and_then(|f| f.take(64 * 1024).read_to_string(&mut text));
        read.is_ok()
            && !text.lines().any(|l| {
                let l = l.trim().to_ascii_lowercase();
                l.starts_with("objectformat") && !l.ends_with("sha1")
            })
    })
}

/// Writes the blob, tree and commit of a new state: in-process into a
/// SHA-1 cache, by `git hash-object`, `mktree` and `commit-tree` into
/// any other.
pub(super) fn make_commit(
    remote: &Remote,
    body: &[u8],
    parent: Option<&str>,
    message: &str,
) -> Result<String> {
    remote.ensure_cache()?;
    if !sha1_cache(remote) {
        return make_commit_by_git(remote, body, parent, message);
    }
    let objects = remote.config.cache.join("objects");
    let fail = |e: std::io::Error| Error::io("write a git object in", &objects, e);
    let blob = write_object(&objects, "blob", body).map_err(fail)?;
    let mut tree = format!("100644 {STATE_FILE}\0").into_bytes();
    let id: Vec<u8> = (0..20)
        .filter_map(|i| u8::from_str_radix(blob.get(2 * i..2 * i + 2)?, 16).ok())
        .collect();
    tree.extend_from_slice(&id);
    let tree = write_object(&objects, "tree", &tree).map_err(fail)?;
    #[allow(
        clippy::disallowed_methods,
        reason = "the commit's date, as git would write it: nothing judges by it"
    )]
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(0));
    let text = commit_text(&tree, parent, now, message);
    write_object(&objects, "commit", text.as_bytes()).map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &Path, args: &[&str], input: &[u8]) -> String {
        let mut child = std::process::Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "git {args:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    #[test]
    fn objects_written_here_are_the_ones_git_writes_and_reads() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path();
        git(repo, &["init", "-q", "--bare", "."], b"");
        let objects = repo.join("objects");
        let body = br#"{"format":1,"state":"free","fence":3,"depth":2,"epoch":0}"#;
        let blob = write_object(&objects, "blob", body).unwrap();
        assert_eq!(blob, git(repo, &["hash-object", "--stdin"], body));
        assert_eq!(
            git(repo, &["cat-file", "blob", &blob], b"").as_bytes(),
            body
        );
        // Big enough for several stored blocks.
        let big = vec![b'x'; 200_000];
        let big_id = write_object(&objects, "blob", &big).unwrap();
        assert_eq!(big_id, git(repo, &["hash-object", "--stdin"], &big));
        assert_eq!(git(repo, &["cat-file", "-s", &big_id], b""), "200000");
        let empty = write_object(&objects, "blob", b"").unwrap();
        assert_eq!(empty, git(repo, &["hash-object", "--stdin"], b""));
        let line = format!("100644 blob {blob}\t{STATE_FILE}\n");
        let want_tree = git(repo, &["mktree"], line.as_bytes());
        let mut tree = format!("100644 {STATE_FILE}\0").into_bytes();
        tree.extend((0..20).map(|i| u8::from_str_radix(&blob[2 * i..2 * i + 2], 16).unwrap()));
        assert_eq!(write_object(&objects, "tree", &tree).unwrap(), want_tree);
        let msg = "skill-lock: released s@o__r (fence 3)\n\nnonce: 1\n";
        let root = commit_text(&want_tree, None, 1_700_000_000, msg);
        let root = write_object(&objects, "commit", root.as_bytes()).unwrap();
        let text = commit_text(&want_tree, Some(&root), 1_700_000_000, msg);
        let commit = write_object(&objects, "commit", text.as_bytes()).unwrap();
        assert_eq!(git(repo, &["rev-parse", &format!("{commit}^")], b""), root);
        git(repo, &["fsck", "--strict", "--no-dangling"], b"");
        let shown = git(
            repo,
            &["log", "-1", "--format=%T %an %ae %at%n%B", &commit],
            b"",
        );
        assert!(
            shown.starts_with(&format!(
                "{want_tree} skill-lock skill-lock@localhost 1700000000\n"
            )),
            "{shown}"
        );
        assert!(shown.ends_with("nonce: 1"), "{shown}");
    }
}
