//! The vhost-user socket's path: what may be removed, and who may connect.
//!
//! The backend only ever removes a *stale socket*: a socket file nothing listens on
//! (connect is refused). Anything else at the path (a regular file, a directory, a
//! symlink, a socket another backend serves) is refused with an error naming it. The
//! socket is created under a temporary name next to the path, given its mode (0600 unless
//! configured) and group, and then linked to the path, so that no one connects to it with
//! the umask's permissions and an existing path is never replaced.

use std::io::ErrorKind;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// Mode of a new socket unless the configuration names another.
pub const DEFAULT_MODE: u32 = 0o600;

/// Why the path cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SocketPathError {
    #[error("{0} exists and is not a socket; refusing to remove it (choose another --socket path)")]
    NotASocket(PathBuf),
    #[error("{0}: another process is listening on this socket (stop it, or choose another --socket path)")]
    InUse(PathBuf),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SocketPathError + '_ {
    move |source| SocketPathError::Io { path: path.to_path_buf(), source }
}

/// Make `path` free for a new socket: nothing there, or a stale socket (removed).
pub fn clear_stale(path: &Path) -> Result<(), SocketPathError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(path)(e)),
    };
    if !meta.file_type().is_socket() {
        return Err(SocketPathError::NotASocket(path.to_path_buf()));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(SocketPathError::InUse(path.to_path_buf())),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused || e.kind() == ErrorKind::NotFound => {
            std::fs::remove_file(path)
                .or_else(|e| if e.kind() == ErrorKind::NotFound { Ok(()) } else { Err(e) })
                .map_err(io(path))
        }
        // Permission denied and the like: not ours to judge, not ours to remove.
        Err(e) => Err(io(path)(e)),
    }
}

/// Look a group up by name or number.
pub fn group_id(group: &str) -> Result<u32, String> {
    if let Ok(n) = group.parse::<u32>() {
        return Ok(n);
    }
    let name = std::ffi::CString::new(group).map_err(|_| format!("group {group:?}: contains a NUL byte"))?;
    // SAFETY: getgrnam takes a valid NUL-terminated string and returns NULL or a pointer
    // to static storage, read at once (this runs before any thread of ours calls it).
    let gr = unsafe { libc::getgrnam(name.as_ptr()) };
    if gr.is_null() {
        return Err(format!("group {group:?} does not exist"));
    }
    // SAFETY: gr is non-null and points at a valid struct group (see above).
    Ok(unsafe { (*gr).gr_gid })
}

/// Bind a listening socket at `path` with `mode` (and `gid`) already set when it appears.
pub fn bind(path: &Path, mode: u32, gid: Option<u32>) -> Result<UnixListener, SocketPathError> {
    clear_stale(path)?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp).map_err(io(&tmp))?;
    let done = (|| {
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode & 0o777))?;
        if let Some(g) = gid {
            std::os::unix::fs::chown(&tmp, None, Some(g))?;
        }
        // A link never replaces an existing path (unlike rename).
        std::fs::hard_link(&tmp, path)
    })();
    let _ = std::fs::remove_file(&tmp);
    match done {
        Ok(()) => Ok(listener),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Err(SocketPathError::InUse(path.to_path_buf())),
        Err(e) => Err(io(path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_is_not_a_stale_socket_and_clears_a_stale_one() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("precious.txt");
        std::fs::write(&file, "keep me").unwrap();
        let e = bind(&file, DEFAULT_MODE, None).unwrap_err();
        assert!(matches!(e, SocketPathError::NotASocket(_)), "{e}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
        let dir = d.path().join("dir");
        std::fs::create_dir(&dir).unwrap();
        assert!(matches!(bind(&dir, DEFAULT_MODE, None), Err(SocketPathError::NotASocket(_))));
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(matches!(bind(&link, DEFAULT_MODE, None), Err(SocketPathError::NotASocket(_))));

        let sock = d.path().join("vhost.sock");
        let live = bind(&sock, DEFAULT_MODE, None).unwrap();
        let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // A second backend on a live socket is refused; the first keeps its socket.
        let e = bind(&sock, DEFAULT_MODE, None).unwrap_err();
        assert!(matches!(e, SocketPathError::InUse(_)), "{e}");
        assert!(UnixStream::connect(&sock).is_ok());
        drop(live);
        // Nothing listens any more: stale, removed, bound again with another mode.
        let _again = bind(&sock, 0o660, None).unwrap();
        assert_eq!(std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777, 0o660);
        // No temporary names left behind.
        let names: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
    }

    #[test]
    fn groups_by_name_or_number() {
        assert_eq!(group_id("0"), Ok(0));
        assert_eq!(group_id("root"), Ok(0));
        assert!(group_id("no-such-group-arfsnic").unwrap_err().contains("does not exist"));
    }
}
