//! Network file systems (SPEC §8): where `flock` and directory lookups are
//! not coherent between machines, the file store refuses to decide on a
//! record another machine wrote.

use std::path::Path;

use crate::liveness::Origin;
use crate::record::Holder;

/// The kind of network file system the open directory `dir` is on, if
/// any (Linux `fstatfs`; Windows the handle's remote protocol).
#[must_use]
pub(super) fn network_fs_of(dir: sys::Handle<'_>) -> Option<&'static str> {
    sys::network_fs_of(dir)
}

/// Linux: the `statfs` magic number of the directory's file system.
#[cfg(target_os = "linux")]
mod sys {
    pub(super) use std::os::fd::BorrowedFd as Handle;

    pub(super) fn network_fs_of(dir: Handle<'_>) -> Option<&'static str> {
        let st = rustix::fs::fstatfs(dir).ok()?;
        // f_type is a signed word of varying width; the magics are 32-bit.
        #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)]
        let magic = st.f_type as u32;
        network_fs_name(magic)
    }

    /// The name of a network file system by its `statfs` magic number.
    #[must_use]
    pub(super) fn network_fs_name(magic: u32) -> Option<&'static str> {
        Some(match magic {
            0x6969 => "NFS",
            0x517B => "SMB",
            0xFF53_4D42 => "CIFS",
            0xFE53_4D42 => "SMB2",
            0x6573_5546 => "FUSE (sshfs and the like)",
            0x0102_1997 => "9p",
            0x00C3_6400 => "Ceph",
            0x5346_414F => "AFS",
            0x7375_7245 => "Coda",
            0x564C => "NCP",
            0x0BD0_0BD0 => "Lustre",
            0x0116_1970 => "GFS2",
            0x7461_636F => "OCFS2",
            _ => return None,
        })
    }
}

/// Other Unix: unknown (macOS: statfs's f_fstypename, "nfs", "smbfs",
/// "macfuse", would tell).
#[cfg(all(unix, not(target_os = "linux")))]
mod sys {
    pub(super) use std::os::fd::BorrowedFd as Handle;

    pub(super) fn network_fs_of(_dir: Handle<'_>) -> Option<&'static str> {
        None
    }
}

/// Windows: the remote protocol of the directory's handle.
#[cfg(windows)]
mod sys {
    pub(super) use std::os::windows::io::BorrowedHandle as Handle;

    /// The kind of network file system the open directory `dir` is on, if
    /// any (`FileRemoteProtocolInfo` answers only for a remote file).
    pub(super) fn network_fs_of(dir: Handle<'_>) -> Option<&'static str> {
        use std::os::windows::io::AsRawHandle;
        use windows_sys::Win32::Storage::FileSystem::{
            FILE_REMOTE_PROTOCOL_INFO, FileRemoteProtocolInfo, GetFileInformationByHandleEx,
        };
        // SAFETY: zeroed plain data the call fills in.
        let mut info: FILE_REMOTE_PROTOCOL_INFO = unsafe { std::mem::zeroed() };
        // SAFETY: a valid handle and a buffer of the class's size.
        let ok = unsafe {
            GetFileInformationByHandleEx(
                dir.as_raw_handle(),
                FileRemoteProtocolInfo,
                (&raw mut info).cast(),
                u32::try_from(std::mem::size_of::<FILE_REMOTE_PROTOCOL_INFO>()).unwrap_or(0),
            )
        };
        if ok == 0 {
            return None;
        }
        // WNNC_NET_SMB is 0x0002_0000; anything else remote is named generally.
        Some(if info.Protocol == 0x0002_0000 {
            "smb"
        } else {
            "a network file system"
        })
    }
}

/// On a network file system, is `holder` from another machine? Then the
/// file store must not decide on what it sees (SPEC §8): the reason.
///
/// Another machine: a different certain machine id, or (where either is not
/// certain) a different, known hostname.
#[must_use]
pub(super) fn refuse_foreign(
    network: Option<&str>,
    holder: &Holder,
    here: &Origin,
    host: &str,
    layer: &Path,
) -> Option<String> {
    let fs = network?;
    let other = match (&holder.machine, &here.machine) {
        (Some(theirs), Some(ours)) => theirs != ours,
        _ => !holder.host.is_empty() && holder.host != host,
    };
    other.then(|| {
        format!(
            "{} is on a network file system ({fs}) and this lock was taken by another machine \
             ({}); file locks are not coherent between machines there, so the file store will \
             not decide on what it sees. Use a store made for several machines: \
             --store etcd://HOST:PORT (an etcd cluster) or --store git:REMOTE (a git remote \
             every machine can push to), or SKILL_LOCK_STORE / skill-lock.toml to set it once",
            layer.display(),
            if holder.host.is_empty() {
                "unknown host"
            } else {
                &holder.host
            }
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn network_file_systems_are_named_by_their_magic() {
        use sys::network_fs_name;
        assert_eq!(network_fs_name(0x6969), Some("NFS"));
        assert_eq!(network_fs_name(0xEF53), None, "ext4 is local");
        for magic in [0xFF53_4D42, 0x6573_5546, 0x0102_1997] {
            assert!(network_fs_name(magic).is_some(), "{magic:x}");
        }
    }

    #[test]
    fn another_machine_on_a_network_file_system_is_refused() {
        let nfs = Some("NFS");
        let here = Origin {
            machine: Some("m1".into()),
            ..Origin::default()
        };
        let layer = Path::new("/home/u/p/.git/apache-magpie");
        let mut h = crate::record::tests::sample(None).holder;
        h.host = "laptop".into();
        h.machine = Some("m1".into());
        // One machine alone keeps working, on NFS or not.
        assert_eq!(refuse_foreign(nfs, &h, &here, "laptop", layer), None);
        // Another machine id: refused on NFS, whatever the hostname says.
        h.machine = Some("m2".into());
        let why = refuse_foreign(nfs, &h, &here, "laptop", layer).unwrap();
        assert!(
            why.contains("etcd") && why.contains("git:") && why.contains("NFS"),
            "{why}"
        );
        assert_eq!(
            refuse_foreign(None, &h, &here, "laptop", layer),
            None,
            "local disk"
        );
        // Machine ids unknown (containers, older records): the hostname decides.
        h.machine = None;
        assert_eq!(refuse_foreign(nfs, &h, &here, "laptop", layer), None);
        h.host = "desktop".into();
        assert!(refuse_foreign(nfs, &h, &here, "laptop", layer).is_some());
        h.host = String::new();
        assert_eq!(refuse_foreign(nfs, &h, &here, "laptop", layer), None);
    }
}
